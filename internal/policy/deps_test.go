package policy_test

// These tests keep internal/policy/... pure: no I/O, no ambient time, no
// ambient randomness (internal/testutil/purity says why and how).

import (
	"slices"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil/purity"
)

func bannedDeps(module string) []purity.Banned {
	const noIO = "policies do no I/O; the caller does it and passes values in"
	const layer = "policies are the bottom layer; components import policies, not the reverse"
	return []purity.Banned{
		{Path: "net", Why: noIO},
		{Path: "net/http", Subtree: true, Why: noIO},
		{Path: "net/rpc", Subtree: true, Why: noIO},
		{Path: "os/exec", Why: noIO},
		{Path: "google.golang.org/grpc", Subtree: true, Why: noIO},
		{Path: "github.com/containerd", Subtree: true, Why: noIO},
		{Path: "go.etcd.io/bbolt", Subtree: true, Why: noIO},
		{Path: module + "/internal/controlplane", Subtree: true, Why: layer},
		{Path: module + "/internal/dataplane", Subtree: true, Why: layer},
		{Path: module + "/internal/worker", Subtree: true, Why: layer},
		{Path: module + "/internal/clock", Subtree: true, Why: "policies take time as a value (now time.Time), not a clock"},
	}
}

func TestPolicyDependencies(t *testing.T) {
	root, module := purity.ModuleRoot(t)
	pkgs := purity.List(t, root, "./internal/policy/...")
	prefix := module + "/internal/policy"
	isPolicy := func(p string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }
	var policies []string
	for _, p := range pkgs {
		if isPolicy(p.ImportPath) {
			policies = append(policies, p.ImportPath)
		}
	}
	for _, want := range []string{"placement", "loadbalance"} {
		if !slices.Contains(policies, prefix+"/"+want) {
			t.Fatalf("go list did not report internal/policy/%s (got %v): the test would check nothing", want, policies)
		}
	}
	for _, v := range purity.Violations(pkgs, isPolicy, bannedDeps(module)) {
		t.Error(v)
	}
	t.Logf("checked %d policy packages: %v", len(policies), policies)
}

func TestPolicySourcesAvoidAmbientTimeAndRandomness(t *testing.T) {
	root, _ := purity.ModuleRoot(t)
	if files := purity.ScanTree(t, root, "internal/policy"); files < 3 {
		t.Fatalf("scanned only %d files under internal/policy: the walk is broken", files)
	}
}

package reconciler_test

import (
	"slices"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil/purity"
)

// The reconciler is a pure value stepped with now, and so is the simulator
// that steps it with the workload model, the data plane's routing table and
// its load-balancing policies: they link no storage, consensus, messaging, RPC
// or sandbox runtime, and read no ambient clock or random source, so no I/O
// can creep into them by an import. Their events and commands are their
// own types, not the wire's protobuf messages (the control plane
// translates: internal/controlplane/wire.go).
func TestCoreIsPure(t *testing.T) {
	root, module := purity.ModuleRoot(t)
	core := []string{
		module + "/internal/controlplane/reconciler",
		module + "/internal/controlplane/nodes",
		module + "/internal/sim",
		module + "/internal/workload",
		module + "/internal/dataplane/endpoints",
	}
	const noIO = "the core does no I/O; its owner does and steps it with values"
	banned := []purity.Banned{
		{Path: "google.golang.org/grpc", Subtree: true, Why: noIO},
		{Path: "google.golang.org/protobuf", Subtree: true, Why: "events and commands are the core's own types"},
		{Path: module + "/api/brisk/v1", Why: "events and commands are the core's own types"},
		{Path: "go.etcd.io/bbolt", Subtree: true, Why: noIO},
		{Path: "github.com/hashicorp/raft", Subtree: true, Why: noIO},
		{Path: "github.com/nats-io", Subtree: true, Why: noIO},
		{Path: "github.com/containerd", Subtree: true, Why: noIO},
		{Path: "k8s.io", Subtree: true, Why: noIO},
		{Path: "os/exec", Why: noIO},
		{Path: module + "/internal/controlplane/store", Subtree: true, Why: noIO},
		{Path: module + "/internal/dataplane", Subtree: true, Why: noIO,
			// The data plane's routing table is a value its owner steps.
			Except: []string{module + "/internal/dataplane/endpoints"}},
		{Path: module + "/internal/worker", Subtree: true, Why: noIO},
		{Path: module + "/internal/loadgen", Subtree: true, Why: "the simulator shares the workload model, not the load generator"},
		{Path: module + "/internal/clock", Subtree: true, Why: "the core takes time as a value (now), not a clock"},
		// Their own sources import no networking (pkg/api's types link
		// net/http for http.Header; that is data, not I/O).
		{Path: "net", Direct: true, Why: noIO},
		{Path: "net/http", Subtree: true, Direct: true, Why: noIO},
	}
	pkgs := purity.List(t, root, core...)
	var seen int
	for _, p := range pkgs {
		if slices.Contains(core, p.ImportPath) {
			seen++
		}
	}
	if seen != len(core) {
		t.Fatalf("go list reported %d of the %d core packages: the test would check nothing", seen, len(core))
	}
	for _, v := range purity.Violations(pkgs, func(p string) bool { return slices.Contains(core, p) }, banned) {
		t.Error(v)
	}
	for _, dir := range []string{"internal/controlplane/reconciler", "internal/controlplane/nodes", "internal/sim", "internal/workload", "internal/dataplane/endpoints"} {
		if purity.ScanTree(t, root, dir) == 0 {
			t.Errorf("scanned no files under %s", dir)
		}
	}
}

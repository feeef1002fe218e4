package controlplane

import (
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A function no node has room for is marked no-capacity, in its status and
// on the data planes' stream; when it fits again the mark clears.
func TestConditionNoCapacity(t *testing.T) {
	e := newEnv(t, envOpts{})
	f := &spec.Function{Name: "big", Builtin: "trace", Scaling: spec.Scaling{Min: 1, Max: 1},
		Resources: spec.Resources{MilliCPU: 64_000, MemoryMB: 64}}
	f.ApplyDefaults()
	f.Revision = e.cp.admin.NextRevision()
	if _, err := e.cp.store.CreateFunction(f); err != nil {
		t.Fatal(err)
	}
	e.cp.cluster.UpsertFunction(f)
	testutil.Eventually(t, wait, func() bool {
		return strings.HasPrefix(e.watch.condition("big"), "no-capacity: no node has room")
	}, "no-capacity on the endpoint stream")
	st, _ := e.cp.cluster.functionStatus("big")
	if st.Condition != "no-capacity" || !strings.Contains(st.Message, "64000m CPU") {
		t.Fatalf("status condition %q %q, want no-capacity naming the cpu asked for", st.Condition, st.Message)
	}

	g := *f
	g.Resources.MilliCPU = 100
	g.Revision = e.cp.admin.NextRevision()
	if err := e.cp.store.UpdateFunction(&g); err != nil {
		t.Fatal(err)
	}
	e.cp.cluster.UpsertFunction(&g)
	e.awaitConverged("big", 1)
	testutil.Eventually(t, wait, func() bool { return e.watch.condition("big") == "" }, "condition cleared on the stream")
	if st, _ := e.cp.cluster.functionStatus("big"); st.Condition != "" {
		t.Fatalf("condition %q after the function fits", st.Condition)
	}
}

// A namespace's quota bounds the sandboxes its functions hold at once: a
// function gets what fits, says quota-exceeded, and gets the rest when the
// quota is raised.
func TestNamespaceQuotaBoundsSandboxes(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.cp.cluster.SetQuotas(map[string]spec.Quota{"team": {MaxSandboxes: 2}})
	f := &spec.Function{Name: "q", Namespace: "team", Builtin: "trace", Scaling: spec.Scaling{Min: 3, Max: 3},
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 64}}
	f.ApplyDefaults()
	f.Revision = e.cp.admin.NextRevision()
	if _, err := e.cp.store.CreateFunction(f); err != nil {
		t.Fatal(err)
	}
	e.cp.cluster.UpsertFunction(f)
	e.awaitConverged("q", 2)
	testutil.Eventually(t, wait, func() bool {
		return strings.HasPrefix(e.watch.condition("q"), "quota-exceeded: namespace \"team\" holds 2 sandboxes")
	}, "quota-exceeded on the stream")
	if u := e.cp.cluster.Usage("team"); u.Sandboxes != 2 || u.MilliCPU != 200 || u.Functions != 1 {
		t.Fatalf("usage %+v, want 2 sandboxes, 200m, 1 function", u)
	}
	e.cp.cluster.SetQuotas(map[string]spec.Quota{"team": {MaxSandboxes: 3}})
	e.awaitConverged("q", 3)
	testutil.Eventually(t, wait, func() bool { return e.watch.condition("q") == "" }, "the condition clears")
	e.scale("q", 0)
	e.awaitConverged("q", 0)
	testutil.Eventually(t, wait, func() bool { return e.cp.cluster.Usage("team").Sandboxes == 0 }, "usage back to 0")
}

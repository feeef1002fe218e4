package reconciler

import (
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestLoadIsSummedOverFreshDataPlanes: each data plane's latest report
// counts once, a data plane that stopped reporting drops out after
// loadStaleAfter, and a function nobody reports on is not sampled.
func TestLoadIsSummedOverFreshDataPlanes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &Reconciler{}
	fs := &fnState{}
	if _, ok := fs.sumLoad(t0); ok {
		t.Fatal("a function without reports was sampled")
	}
	c.setLoad(fs, "dp-a", 2, 0, t0)
	c.setLoad(fs, "dp-b", 3, 0, t0)
	c.setLoad(fs, "dp-a", 4, 0, t0.Add(time.Second)) // replaces dp-a's 2
	if sum, ok := fs.sumLoad(t0.Add(time.Second)); !ok || sum != 7 {
		t.Fatalf("sum %v %v, want 7", sum, ok)
	}
	c.setLoad(fs, "dp-a", 1, 0, t0.Add(3*time.Second))
	if sum, ok := fs.sumLoad(t0.Add(3 * time.Second)); !ok || sum != 1 || len(fs.dpLoad) != 1 || fs.dpLoad[0].dataPlane != "dp-a" {
		t.Fatalf("after dp-b went stale: sum %v %v, reports %+v", sum, ok, fs.dpLoad)
	}
	// Once every report is stale the level drops to 0 once, then the
	// function is no longer sampled.
	if sum, ok := fs.sumLoad(t0.Add(10 * time.Second)); !ok || sum != 0 || fs.dpLoad != nil {
		t.Fatalf("all stale: sum %v %v, reports %+v", sum, ok, fs.dpLoad)
	}
	if _, ok := fs.sumLoad(t0.Add(11 * time.Second)); ok {
		t.Fatal("sampled again with no reports")
	}
}

// sampleLoad visits the functions some data plane reported on, and drops
// one from its list once its reports have all gone stale (its level
// recorded as 0 once), or once it is removed.
func TestSampleLoadVisitsReportedFunctions(t *testing.T) {
	w := newWorld(t, 1)
	for _, name := range []string{"a", "b", "quiet"} {
		w.step(UpsertFunction{Spec: &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1}})
	}
	w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second, Functions: []FunctionLoad{
		{Function: "a", AvgConcurrency: 1, Requests: 1}, {Function: "b", AvgConcurrency: 2, Requests: 1}}}})
	names := func() []string {
		var out []string
		for _, fs := range w.r.loaded {
			out = append(out, fs.spec.Name)
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("loaded %v, want [a b]", got)
	}
	w.step(RemoveFunction{Name: "b"})
	w.now = w.now.Add(time.Second)
	w.r.sampleLoad(w.now)
	if got := names(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("loaded %v after b's removal, want [a]", got)
	}
	if w.r.fns["a"].kpa == nil {
		t.Fatal("a has no autoscaler")
	}
	w.now = w.now.Add(10 * time.Second)
	w.r.sampleLoad(w.now)
	if got := names(); len(got) != 0 || w.r.fns["a"].loaded {
		t.Fatalf("loaded %v once a's reports are stale, want none", got)
	}
}

// FunctionNames stays each function's name in the reconciler's order
// through removals, which move the last function into the gap.
func TestFunctionNamesFollowRemovals(t *testing.T) {
	w := newWorld(t, 1)
	for _, name := range []string{"a", "b", "c", "d"} {
		w.step(UpsertFunction{Spec: &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1}})
	}
	w.step(RemoveFunction{Name: "b"})
	w.step(RemoveFunction{Name: "d"})
	w.step(UpsertFunction{Spec: &spec.Function{Name: "e", Builtin: "echo", Concurrency: 1, Revision: 1}})
	var want []string
	for _, fs := range w.r.order {
		want = append(want, fs.spec.Name)
	}
	if got := w.r.FunctionNames(); !slices.Equal(got, want) || !slices.Equal(want, []string{"a", "c", "e"}) {
		t.Fatalf("names %v, order %v, want [a c e]", got, want)
	}
}

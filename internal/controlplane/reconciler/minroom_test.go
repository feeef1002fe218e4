package reconciler

import (
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// A function's scaling.min is a guarantee, another's scale-out is not
// (issue 36: one function's async backlog held both cores, and other
// functions' min sandboxes stayed no-capacity for about 65 s): on a node
// full of a busy function's sandboxes, a function deployed with min 1 gets
// its sandbox at once, from the busy function's sandboxes beyond its own
// min, and the busy function does not take the room back while its load
// goes on.
func TestMinTakesRoomFromAnotherFunctionsScaleOut(t *testing.T) {
	w := fullWorld(t) // four 250m sandboxes
	w.deployCPU("busy", "", 0)
	w.load("busy", 10, 4) // four calls in flight: every sandbox busy
	w.step(ScaleTo{Function: "busy", Desired: 8})
	if r, _, _ := w.status("busy"); r != 4 {
		t.Fatalf("busy has %d ready, want the node's 4", r)
	}
	w.deployCPU("m", "", 1)
	for i := range 60 {
		w.load("busy", 10, 4)
		w.step(ScaleTo{Function: "busy", Desired: 8})
		w.now = w.now.Add(time.Second)
		w.step(Tick{})
		if r, _, _ := w.status("m"); r != 1 && i >= 1 {
			st, _ := w.r.FunctionStatus("m")
			t.Fatalf("after %d s m has %d ready (%s: %s), want its min of 1", i+1, r, st.Condition, st.Message)
		}
	}
	if r, _, _ := w.status("busy"); r != 3 {
		t.Errorf("busy has %d ready, want the 3 left beside m's min", r)
	}
	if w.r.minStarved != 0 {
		t.Errorf("%d functions still starved of their min", w.r.minStarved)
	}
}

// Only sandboxes beyond their function's min make room: a min that cannot
// be met takes nothing from another function's min, and blocks no other
// function's scale-out.
func TestMinTakesNothingFromAnotherMin(t *testing.T) {
	w := fullWorld(t)
	w.step(UpsertFunction{Spec: cpuFn("held", 4)})
	w.step(UpsertFunction{Spec: cpuFn("m", 1)})
	w.now = w.now.Add(time.Second)
	w.step(Tick{})
	if r, _, _ := w.status("held"); r != 4 {
		t.Fatalf("held has %d ready, want its min of 4", r)
	}
	if st, _ := w.r.FunctionStatus("m"); st.Ready != 0 || st.Condition != CondNoCapacity {
		t.Fatalf("m: %+v, want none and no-capacity", st)
	}
	if w.r.minStarved != 0 {
		t.Fatalf("m counts as starved (%d) with nothing to take: other functions' scale-out would wait for ever", w.r.minStarved)
	}
}

// cpuFn is a 250m function with min sandboxes.
func cpuFn(name string, min int) *spec.Function {
	return &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128}, Scaling: spec.Scaling{Min: min}}
}

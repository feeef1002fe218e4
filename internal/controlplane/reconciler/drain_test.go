package reconciler

import (
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// drainWorld is a world with a drain delay and one ready sandbox of f
// (timeout 10 s), whose id it returns.
func drainWorld(t *testing.T) (*world, string) {
	t.Helper()
	w := newWorld(t, 1)
	w.r.cfg.DrainDelay = 500 * time.Millisecond
	f := &spec.Function{Name: "f", Builtin: "echo", Concurrency: 1, Revision: 1, Timeout: spec.Duration(10 * time.Second),
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 128}, Scaling: spec.Scaling{Min: 1}}
	w.step(UpsertFunction{Spec: f})
	for id := range w.running["n0"] {
		return w, id
	}
	t.Fatal("no sandbox started")
	return nil, ""
}

// after advances the clock by d and steps a data plane's report (draining
// the ids given), returning the Tombstones sent.
func (w *world) after(d time.Duration, dp string, draining ...string) int {
	w.now = w.now.Add(d)
	return count[Tombstone](w.step(Metrics{Report: LoadReport{DataPlane: dp, Interval: time.Second, Draining: draining}}))
}

// TestWithdrawnSandboxDrainsItsCalls: a sandbox taken away is withdrawn
// from the data planes at once and killed only once their calls in it
// have ended: the drain delay, then as long as a data plane says calls
// still run there (each report repeating it), up to the function's
// timeout. Killing at the delay alone cut calls that outlived it (the
// InVitro loader's long calls on sandboxes evicted for other functions).
func TestWithdrawnSandboxDrainsItsCalls(t *testing.T) {
	w, id := drainWorld(t)
	cmds := w.step(RemoveFunction{Name: "f"})
	if count[RemoveEndpoint](cmds) != 1 || count[Tombstone](cmds) != 0 {
		t.Fatalf("removal: %v; want the endpoint withdrawn and no Tombstone yet", cmds)
	}
	if n := w.after(200*time.Millisecond, "dp1", id); n != 0 {
		t.Fatal("killed within the drain delay")
	}
	// Past the delay, dp1's calls hold it; dp2 has none there.
	if n := w.after(400*time.Millisecond, "dp2"); n != 0 {
		t.Fatal("killed while dp1 still runs calls in it")
	}
	if n := w.after(time.Second, "dp1", id); n != 0 {
		t.Fatal("killed while dp1 says calls still run in it")
	}
	if n := w.after(time.Second, "dp1"); n != 1 {
		t.Fatalf("%d Tombstones once dp1's calls ended; want 1", n)
	}
	if _, ok := w.running["n0"][id]; ok {
		t.Fatal("the sandbox still runs after its Tombstone")
	}
	if n := w.after(time.Second, "dp1"); n != 0 {
		t.Fatal("a second Tombstone")
	}
}

// TestDrainWithoutWordEndsAtTheDelay: with no data plane saying calls run
// in it, a withdrawn sandbox goes at the drain delay, as before; a data
// plane that stops reporting holds it no longer than its word is fresh,
// and none holds it past the function's timeout.
func TestDrainWithoutWordEndsAtTheDelay(t *testing.T) {
	w, _ := drainWorld(t)
	w.step(RemoveFunction{Name: "f"})
	if n := w.after(499*time.Millisecond, "dp1"); n != 0 {
		t.Fatal("killed before the drain delay")
	}
	if n := w.after(time.Millisecond, "dp1"); n != 1 {
		t.Fatalf("%d Tombstones at the drain delay with no calls reported; want 1", n)
	}

	w, id := drainWorld(t)
	w.step(RemoveFunction{Name: "f"})
	w.after(100*time.Millisecond, "dp1", id) // then dp1 falls silent
	if n := w.after(2*time.Second, "dp2"); n != 0 {
		t.Fatal("dp1's word dropped before it went stale")
	}
	if n := w.after(time.Second, "dp2"); n != 1 {
		t.Fatalf("%d Tombstones once dp1's word went stale; want 1", n)
	}

	w, id = drainWorld(t)
	w.step(RemoveFunction{Name: "f"})
	held := 0
	for range 12 {
		held += w.after(time.Second, "dp1", id)
	}
	if held != 1 {
		t.Fatalf("%d Tombstones while a data plane claimed calls past the 10 s timeout; want 1", held)
	}
}

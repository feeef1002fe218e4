package reconciler

import (
	"fmt"
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

// TestDrainDelayEndsWithAWakeUp: the reconciler asks for a step when a
// drain delay ends (one for sandboxes withdrawn together), so that the
// Tombstone goes then in a cluster where nothing else happens, and a
// worker's handshake meanwhile does not kill a sandbox still draining.
func TestDrainDelayEndsWithAWakeUp(t *testing.T) {
	w, id := drainWorld(t)
	var wakes []RetryAt
	for _, c := range w.step(RemoveFunction{Name: "f"}) {
		if x, ok := c.(RetryAt); ok && x.Function == "" {
			wakes = append(wakes, x)
		}
	}
	if len(wakes) != 1 || !wakes[0].At.Equal(w.now.Add(500*time.Millisecond)) {
		t.Fatalf("wake-ups %v; want one at the end of the drain delay", wakes)
	}
	w.now = w.now.Add(100 * time.Millisecond)
	w.step(Metrics{Report: LoadReport{DataPlane: "dp1", Interval: time.Second, Draining: []string{id}}})
	w.step(SessionDown{Node: "n0"})
	w.step(SessionUp{Node: "n0", Versions: []Version{{ID: id, Version: w.version}}}) // it still runs, as known
	if _, ok := w.running["n0"][id]; !ok {
		t.Fatal("a worker's handshake killed a sandbox a data plane still runs calls in")
	}
	w.now = w.now.Add(3 * time.Second) // dp1's word is stale: the next step sends it
	if n := count[Tombstone](w.step(Retry{})); n != 1 {
		t.Fatalf("%d Tombstones at a wake-up after the drain; want 1", n)
	}
}

// TestHeldDrainIsNoRoomOnItsWay: an evicted sandbox a data plane still
// runs calls in frees its room only when they end, so a function that
// needs room does not wait for it: it evicts another idle sandbox.
func TestHeldDrainIsNoRoomOnItsWay(t *testing.T) {
	w := fullWorld(t)
	w.r.cfg.DrainDelay = 500 * time.Millisecond
	for i := range 6 {
		w.deployCPU(fmt.Sprintf("f%d", i), spec.KeepAliveGD, 0)
	}
	for i := range 4 {
		w.call(fmt.Sprintf("f%d", i))
		w.now = w.now.Add(time.Second)
	}
	w.idle(5 * time.Second)
	var victim string
	for _, c := range w.call("f4") {
		if x, ok := c.(RemoveEndpoint); ok {
			victim = x.ID
		}
	}
	if victim == "" {
		t.Fatal("f4's call evicted nothing")
	}
	// The victim had just taken a call: its data plane says so.
	w.now = w.now.Add(100 * time.Millisecond)
	w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second, Draining: []string{victim}}})
	evicted := 0
	// f5's call: the same data plane's urgent report, which lists the
	// victim again (every report repeats the whole list).
	cmds := w.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true, Draining: []string{victim},
		Functions: []FunctionLoad{{Function: "f5", Queued: 1, NoCapacity: true}}}})
	for _, c := range cmds {
		if x, ok := c.(RemoveEndpoint); ok && x.ID != victim {
			evicted++
		}
	}
	if evicted == 0 {
		t.Fatal("f5 waits for the room of a sandbox still running calls instead of evicting an idle one")
	}
}

package reconciler

import (
	"testing"
)

// A sandbox whose id a handshake gave up (the worker did not report it;
// the id is invalid and replaced under a new one) but which the worker
// then reports running is neither adopted nor routed, and it is ended:
// left alone it would run on unaccounted (seen in the partition lab: two
// sandboxes of a scaled function still running after the heal).
func TestLiveInvalidIDIsTombstoned(t *testing.T) {
	w := newWorld(t, 1)
	w.deploy("f", 1)
	ids := sandboxIDs(t, w, "f")
	if len(ids) != 1 {
		t.Fatalf("sandboxes %v, want 1", ids)
	}
	old := ids[0]
	// A handshake that does not report it: invalid, replaced.
	delete(w.running["n0"], old)
	w.step(SessionDown{Node: "n0"})
	var versions []Version
	w.step(SessionUp{Node: "n0", Versions: versions})
	if got := sandboxIDs(t, w, "f"); len(got) != 1 || got[0] == old {
		t.Fatalf("after the handshake: %v, want one replacement of %s", got, old)
	}
	// The worker reports it ready after all.
	w.version++
	cmds := w.r.Step(w.now, WorkerUpdates{Node: "n0", Updates: Updates{Records: []Record{{
		ID: old, Function: "f", Revision: 1, State: StateReady, Version: w.version, Address: "10.0.0.1:1"}}}})
	var tombstoned, announced bool
	for _, c := range cmds {
		switch x := c.(type) {
		case Tombstone:
			tombstoned = tombstoned || x.ID == old
		case AddEndpoint:
			announced = announced || x.Endpoint.SandboxID == old
		}
	}
	if !tombstoned || announced {
		t.Fatalf("a live invalid sandbox: tombstoned %v, announced %v; want ended and never routed (%v)", tombstoned, announced, cmds)
	}
	if got := sandboxIDs(t, w, "f"); len(got) != 1 || got[0] == old {
		t.Fatalf("the control plane adopted it: %v", got)
	}
	// Its end (gone) changes nothing.
	w.version++
	w.r.Step(w.now, WorkerUpdates{Node: "n0", Updates: Updates{Records: []Record{{
		ID: old, Function: "f", State: StateGone, Version: w.version}}}})
	if got := sandboxIDs(t, w, "f"); len(got) != 1 || got[0] == old {
		t.Fatalf("after its end: %v", got)
	}
}

// sandboxIDs are the control plane's sandboxes of fn.
func sandboxIDs(t *testing.T, w *world, fn string) []string {
	t.Helper()
	st, ok := w.r.FunctionStatus(fn)
	if !ok {
		t.Fatalf("no function %q", fn)
	}
	var ids []string
	for _, sb := range st.Sandboxes {
		ids = append(ids, sb.ID)
	}
	return ids
}

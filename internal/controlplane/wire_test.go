package controlplane

import (
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
)

// The translation keeps every field the reconciler reads.
func TestUpdatesFromPB(t *testing.T) {
	u := updatesFromPB(&briskv1.Updates{
		Records: []*briskv1.SandboxRecord{{Id: "s1", Function: "f", Revision: 3, State: briskv1.SandboxState_SANDBOX_STATE_READY,
			Version: 7, Address: "10.0.0.2:8080", Message: "m", StartUs: 1500, CreateUs: 4000}},
		Heartbeat: &briskv1.Heartbeat{Capacity: &briskv1.Resources{MilliCpu: 2000, MemoryMb: 4096}, Used: &briskv1.Resources{MilliCpu: 250},
			Sandboxes: 2, Templates: &briskv1.Resources{MemoryMb: 30},
			Emergency:     &briskv1.EmergencyStats{Slots: 4, InUse: 1, Started: 9, Failed: 2, MemoryMbSeconds: 1.5},
			HeldTemplates: &briskv1.TemplateSet{Templates: []*briskv1.HeldTemplate{{Function: "py", Revision: 2}}}},
	})
	want := reconciler.Record{ID: "s1", Function: "f", Revision: 3, State: reconciler.StateReady, Version: 7, Address: "10.0.0.2:8080",
		Message: "m", Start: 1500 * time.Microsecond, Create: 4 * time.Millisecond}
	if len(u.Records) != 1 || u.Records[0] != want {
		t.Fatalf("records %+v, want %+v", u.Records, want)
	}
	hb := u.Heartbeat
	if hb == nil || hb.Capacity.MilliCPU != 2000 || hb.Capacity.MemoryMB != 4096 || hb.Used.MilliCPU != 250 || hb.Sandboxes != 2 ||
		hb.Templates.MemoryMB != 30 || hb.Emergency != (reconciler.EmergencyStats{Slots: 4, InUse: 1, Started: 9, Failed: 2, MemoryMBSeconds: 1.5}) ||
		!hb.HeldSet || len(hb.Held) != 1 || hb.Held[0] != (reconciler.HeldTemplate{Function: "py", Revision: 2}) {
		t.Fatalf("heartbeat %+v", hb)
	}
	// A heartbeat without a template list leaves the node's set as it is.
	if u := updatesFromPB(&briskv1.Updates{Heartbeat: &briskv1.Heartbeat{}}); u.Heartbeat.HeldSet {
		t.Fatal("a heartbeat without templates replaced the set")
	}
	for s, want := range map[briskv1.SandboxState]reconciler.SandboxState{
		briskv1.SandboxState_SANDBOX_STATE_CREATING: reconciler.StateCreating, briskv1.SandboxState_SANDBOX_STATE_TERMINATING: reconciler.StateTerminating,
		briskv1.SandboxState_SANDBOX_STATE_GONE: reconciler.StateGone, briskv1.SandboxState_SANDBOX_STATE_FAILED: reconciler.StateFailed,
		briskv1.SandboxState_SANDBOX_STATE_EXITED: reconciler.StateExited, briskv1.SandboxState(42): reconciler.StateUnknown,
	} {
		if got := stateFromPB(s); got != want {
			t.Errorf("state %v -> %v, want %v", s, got, want)
		}
	}
}

// The endpoint a data plane gets keeps the start phases in microseconds.
func TestEndpointPB(t *testing.T) {
	ep := endpointPB(reconciler.Endpoint{SandboxID: "s", Function: "f", Address: "a", Node: "n",
		ReadyAfter: 9 * time.Millisecond, Start: 2 * time.Millisecond, Create: 5 * time.Millisecond})
	if ep.GetSandboxId() != "s" || ep.GetNodeId() != "n" || ep.GetReadyAfterUs() != 9000 || ep.GetStartUs() != 2000 || ep.GetCreateUs() != 5000 {
		t.Fatalf("endpoint %v", ep)
	}
}

// The cost the translation adds to a sandbox's Ready update on its way
// from the worker's stream into the reconciler.
func BenchmarkReadyUpdateFromPB(b *testing.B) {
	u := &briskv1.Updates{Records: []*briskv1.SandboxRecord{{Id: "s1", Function: "f", Revision: 3,
		State: briskv1.SandboxState_SANDBOX_STATE_READY, Version: 7, Address: "10.0.0.2:8080", StartUs: 1500, CreateUs: 4000}}}
	b.ReportAllocs()
	for b.Loop() {
		_ = updatesFromPB(u)
	}
}

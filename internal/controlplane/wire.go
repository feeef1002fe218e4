package controlplane

import (
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Translations between the wire's protobuf messages and the reconciler's
// own types: the reconciler links no protobuf, so the control plane turns
// what workers and data planes send into its events and its commands into
// what they get.

var statesFromPB = [...]reconciler.SandboxState{
	briskv1.SandboxState_SANDBOX_STATE_CREATING:    reconciler.StateCreating,
	briskv1.SandboxState_SANDBOX_STATE_READY:       reconciler.StateReady,
	briskv1.SandboxState_SANDBOX_STATE_TERMINATING: reconciler.StateTerminating,
	briskv1.SandboxState_SANDBOX_STATE_GONE:        reconciler.StateGone,
	briskv1.SandboxState_SANDBOX_STATE_FAILED:      reconciler.StateFailed,
	briskv1.SandboxState_SANDBOX_STATE_EXITED:      reconciler.StateExited,
}

func stateFromPB(s briskv1.SandboxState) reconciler.SandboxState {
	if s >= 0 && int(s) < len(statesFromPB) {
		return statesFromPB[s]
	}
	return reconciler.StateUnknown
}

func recordsFromPB(rs []*briskv1.SandboxRecord) []reconciler.Record {
	if len(rs) == 0 {
		return nil
	}
	out := make([]reconciler.Record, len(rs))
	for i, r := range rs {
		out[i] = reconciler.Record{ID: r.GetId(), Function: r.GetFunction(), Revision: r.GetRevision(), State: stateFromPB(r.GetState()),
			Version: r.GetVersion(), Address: r.GetAddress(), Message: r.GetMessage(),
			Start: time.Duration(r.GetStartUs()) * time.Microsecond, Create: time.Duration(r.GetCreateUs()) * time.Microsecond}
	}
	return out
}

func versionsFromPB(vs []*briskv1.SandboxVersion) []reconciler.Version {
	out := make([]reconciler.Version, len(vs))
	for i, v := range vs {
		out[i] = reconciler.Version{ID: v.GetId(), Version: v.GetVersion()}
	}
	return out
}

func resourcesFromPB(r *briskv1.Resources) spec.Resources {
	return spec.Resources{MilliCPU: r.GetMilliCpu(), MemoryMB: r.GetMemoryMb()}
}

func updatesFromPB(u *briskv1.Updates) reconciler.Updates {
	out := reconciler.Updates{Records: recordsFromPB(u.GetRecords())}
	if hb := u.GetHeartbeat(); hb != nil {
		em := hb.GetEmergency()
		h := &reconciler.Heartbeat{Capacity: resourcesFromPB(hb.GetCapacity()), Used: resourcesFromPB(hb.GetUsed()),
			Templates: resourcesFromPB(hb.GetTemplates()), Sandboxes: int(hb.GetSandboxes()),
			Emergency: reconciler.EmergencyStats{Slots: int(em.GetSlots()), InUse: int(em.GetInUse()), Started: em.GetStarted(),
				Failed: em.GetFailed(), MemoryMBSeconds: em.GetMemoryMbSeconds()}}
		if set := hb.GetHeldTemplates(); set != nil {
			h.HeldSet = true
			h.Held = make([]reconciler.HeldTemplate, len(set.GetTemplates()))
			for i, t := range set.GetTemplates() {
				h.Held[i] = reconciler.HeldTemplate{Function: t.GetFunction(), Revision: t.GetRevision()}
			}
		}
		out.Heartbeat = h
	}
	return out
}

func loadFromPB(r *briskv1.MetricsReport) reconciler.LoadReport {
	out := reconciler.LoadReport{DataPlane: r.GetDataPlaneId(), Interval: time.Duration(r.GetIntervalMs()) * time.Millisecond,
		Urgent: r.GetUrgent(), Functions: make([]reconciler.FunctionLoad, len(r.GetFunctions())), Draining: r.GetDraining()}
	for i, m := range r.GetFunctions() {
		out.Functions[i] = reconciler.FunctionLoad{Function: m.GetFunction(), AvgConcurrency: m.GetAvgConcurrency(),
			Requests: m.GetRequests(), Queued: int(m.GetQueued()), NoCapacity: m.GetNoCapacity(), InFlight: int(m.GetInFlight())}
	}
	return out
}

func unreachableFromPB(r *briskv1.UnreachableReport) reconciler.UnreachableReport {
	out := reconciler.UnreachableReport{DataPlane: r.GetDataPlaneId(), Endpoints: make([]reconciler.UnreachableEndpoint, len(r.GetEndpoints()))}
	for i, e := range r.GetEndpoints() {
		out.Endpoints[i] = reconciler.UnreachableEndpoint{SandboxID: e.GetSandboxId(), Function: e.GetFunction(), Address: e.GetAddress(), Error: e.GetError()}
	}
	return out
}

func modePB(m reconciler.HandshakeMode) briskv1.HandshakeMode {
	if m == reconciler.HandshakeReset {
		return briskv1.HandshakeMode_HANDSHAKE_MODE_RESET
	}
	return briskv1.HandshakeMode_HANDSHAKE_MODE_RECOVER
}

func endpointPB(e reconciler.Endpoint) *briskv1.Endpoint {
	return &briskv1.Endpoint{SandboxId: e.SandboxID, Function: e.Function, Address: e.Address, NodeId: e.Node,
		ReadyAfterUs: e.ReadyAfter.Microseconds(), StartUs: e.Start.Microseconds(), CreateUs: e.Create.Microseconds()}
}

func conditionPB(c reconciler.Condition) *briskv1.FunctionCondition {
	return &briskv1.FunctionCondition{Function: c.Function, Reason: c.Reason, Message: c.Message, FailFast: c.FailFast}
}

func emergencyWorkersPB(ws []reconciler.EmergencyWorker) []*briskv1.EmergencyWorker {
	out := make([]*briskv1.EmergencyWorker, len(ws))
	for i, w := range ws {
		out[i] = &briskv1.EmergencyWorker{NodeId: w.Node, Address: w.Address, Free: int32(w.Free)}
	}
	return out
}

// specPB is a published function as data planes and workers get it.
func specPB(p reconciler.Published) *briskv1.FunctionSpec {
	pf := specpb.ToProto(p.Spec)
	pf.ScalingMode = p.ScalingMode
	pf.KeepAliveMs = p.KeepAlive.Milliseconds()
	pf.LoadBalancing = p.LoadBalancing
	return pf
}

// snapshotPB is a data plane's starting state (its Auth is filled in by
// the caller).
func snapshotPB(s reconciler.Snapshot) *briskv1.EndpointBatch {
	b := &briskv1.EndpointBatch{Snapshot: true, EmergencyWorkers: emergencyWorkersPB(s.EmergencyWorkers), EmergencySet: true,
		Functions: make([]*briskv1.FunctionSpec, len(s.Functions)), Added: make([]*briskv1.Endpoint, len(s.Endpoints))}
	for i, p := range s.Functions {
		b.Functions[i] = specPB(p)
	}
	for _, c := range s.Conditions {
		b.Conditions = append(b.Conditions, conditionPB(c))
	}
	for i, e := range s.Endpoints {
		b.Added[i] = endpointPB(e)
	}
	return b
}

package reconciler

import (
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// smallWorld is one node with room for four 128 MiB sandboxes.
func smallWorld(t *testing.T) *world {
	return oneNodeWorld(t, spec.Resources{MilliCPU: 4000, MemoryMB: 512})
}

// oneNodeWorld is one connected node "n0" of capacity c.
func oneNodeWorld(t *testing.T, c spec.Resources) *world {
	w := newWorld(t, 0)
	w.step(RegisterNode{Worker: &nodes.Worker{ID: "n0", Address: "127.0.0.1:1", Capacity: c}})
	w.running["n0"] = map[string]string{}
	w.step(SessionUp{Node: "n0"})
	return w
}

func (w *world) deployKA(name string, memMB int64, policy string, keepAlive time.Duration) {
	w.step(UpsertFunction{Spec: &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: memMB},
		Scaling:   spec.Scaling{KeepAlivePolicy: policy, KeepAlive: spec.Duration(keepAlive)}}})
}

// idle advances the clock by d with ticks and no load.
func (w *world) idle(d time.Duration) {
	for end := w.now.Add(d); w.now.Before(end); {
		w.now = w.now.Add(time.Second)
		w.step(SampleLoad{})
		w.step(Tick{})
	}
}

// Under gd, sandboxes beyond the demand stay until a new sandbox needs
// their room; then the lowest Greedy-Dual priority goes first (here the
// function never called), and the new sandbox is placed once they are gone.
func TestKeepAliveGDEvictsUnderMemoryPressure(t *testing.T) {
	w := smallWorld(t)
	w.deployKA("rare", 128, spec.KeepAliveGD, 0)
	w.deployKA("hot", 128, spec.KeepAliveGD, 0)
	w.step(ScaleTo{Function: "rare", Desired: 2})
	w.step(ScaleTo{Function: "hot", Desired: 2})
	w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second,
		Functions: []FunctionLoad{{Function: "hot", Requests: 500}}}})
	w.idle(10 * time.Minute) // no demand: ttl would have removed them all
	for _, f := range []string{"rare", "hot"} {
		if r, _, _ := w.status(f); r != 2 {
			t.Fatalf("%s: %d ready after 10 idle minutes under gd, want 2 kept", f, r)
		}
	}
	// The node is full: a 256 MiB sandbox needs two idle ones evicted.
	w.deployKA("new", 256, spec.KeepAliveTTL, 0)
	cmds := w.step(ScaleTo{Function: "new", Desired: 1})
	var retry *RetryAt
	for _, c := range cmds {
		if x, ok := c.(RetryAt); ok {
			retry = &x
		}
		if x, ok := c.(SetCondition); ok && x.Condition.Reason != "" {
			t.Fatalf("condition %v while room is being made", x.Condition)
		}
	}
	if retry == nil || w.r.Stats().Evictions != 2 {
		t.Fatalf("retry %v, %d evictions; want a retry and 2", retry, w.r.Stats().Evictions)
	}
	if r, _, _ := w.status("rare"); r != 0 {
		t.Fatalf("rare: %d ready, want its idle sandboxes evicted first (never called)", r)
	}
	if r, _, _ := w.status("hot"); r != 2 {
		t.Fatalf("hot: %d ready, want 2 (frequently called: higher priority)", r)
	}
	w.now = retry.At
	if n := count[Create](w.step(Retry{Function: "new"})); n != 1 {
		t.Fatalf("%d creates on retry, want the new sandbox placed", n)
	}
	if r, _, _ := w.status("new"); r != 1 {
		t.Fatalf("new: %d ready", r)
	}
}

// gd with a keep-alive also drops idle sandboxes after it; ttl's keep-alive
// is Knative's scale-down delay: the peak is kept that long after the
// demand falls.
func TestKeepAliveDurations(t *testing.T) {
	w := smallWorld(t)
	w.deployKA("gd", 128, spec.KeepAliveGD, 30*time.Second)
	w.step(ScaleTo{Function: "gd", Desired: 1})
	w.idle(20 * time.Second)
	if r, _, _ := w.status("gd"); r != 1 {
		t.Fatalf("gd: %d ready 20 s into a 30 s keep-alive", r)
	}
	w.idle(15 * time.Second)
	if r, _, term := w.status("gd"); r+term != 0 {
		t.Fatalf("gd: %d ready, %d terminating 35 s after the demand fell, want none", r, term)
	}

	f := &spec.Function{Name: "ttl", Builtin: "echo", Concurrency: 1, Revision: 1,
		Scaling: spec.Scaling{KeepAlivePolicy: spec.KeepAliveTTL, KeepAlive: spec.Duration(5 * time.Minute)}}
	if got := w.r.KeepAliveOf(f); got != 5*time.Minute+60*time.Second+30*time.Second {
		t.Fatalf("ttl keep-alive %s, want the 5m scale-down delay after the 60s window and the 30s grace", got)
	}
	if got := w.r.KPAConfig(f).ScaleDownDelay; got != 5*time.Minute {
		t.Fatalf("scale-down delay %s", got)
	}
	f.Scaling.Mode = spec.ModeSync
	if got := w.r.KeepAliveOf(f); got != 5*time.Minute {
		t.Fatalf("sync keep-alive %s, want the spec's 5m", got)
	}
	f.Scaling = spec.Scaling{}
	if got := w.r.KeepAliveOf(f); got != spec.DefaultGDKeepAlive {
		t.Fatalf("default keep-alive %s, want gd's %s", got, spec.DefaultGDKeepAlive)
	}
	f.Scaling.Mode = spec.ModeSync // sync holds its own peak: gd does not apply
	if got := w.r.KeepAliveOf(f); got != 90*time.Second {
		t.Fatalf("sync keep-alive %s, want the window plus the grace", got)
	}
}

// Room for a whole deficit is made in one pass, a node at its sandbox
// limit gets a slot evicted too, and a burst on a gd function sitting at
// zero demand with busy kept sandboxes creates what its queue needs at once.
func TestKeepAliveGDEvictsForTheWholeDeficit(t *testing.T) {
	w := newWorld(t, 0)
	w.step(RegisterNode{Worker: &nodes.Worker{ID: "n0", Address: "127.0.0.1:1", MaxSandboxes: 4,
		Capacity: spec.Resources{MilliCPU: 64000, MemoryMB: 1 << 20}}})
	w.running["n0"] = map[string]string{}
	w.step(SessionUp{Node: "n0"})
	w.deployKA("kept", 128, spec.KeepAliveGD, 0)
	w.step(ScaleTo{Function: "kept", Desired: 4})
	w.idle(5 * time.Minute)
	if r, _, _ := w.status("kept"); r != 4 {
		t.Fatalf("kept: %d ready, want 4", r)
	}
	// The node has CPU and memory but no slot: three new sandboxes need
	// three evictions, all in the first pass.
	w.deployKA("new", 128, spec.KeepAliveTTL, 0)
	w.step(ScaleTo{Function: "new", Desired: 3})
	if ev := w.r.Stats().Evictions; ev != 3 {
		t.Fatalf("%d evictions in the first pass, want 3", ev)
	}
	w.now = w.now.Add(time.Second)
	w.step(Retry{Function: "new"})
	if r, _, _ := w.status("new"); r != 3 {
		t.Fatalf("new: %d ready after the retry, want 3", r)
	}

	// A gd function at zero demand keeps one sandbox; a burst of 3 waiting
	// calls (that sandbox busy) gets 3 new ones now, not at the next tick.
	w2 := smallWorld(t)
	w2.deployKA("g", 64, spec.KeepAliveGD, 0)
	w2.step(ScaleTo{Function: "g", Desired: 1})
	w2.idle(5 * time.Minute)
	cmds := w2.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true,
		Functions: []FunctionLoad{{Function: "g", Queued: 3, NoCapacity: true}}}})
	if n := count[Create](cmds); n != 3 {
		t.Fatalf("%d creates for 3 queued calls with the kept sandbox busy, want 3", n)
	}
}

// gd keeps idle sandboxes only within the function's bounds: lowering
// scaling.max removes the ones above it at once.
func TestKeepAliveGDRespectsMax(t *testing.T) {
	w := smallWorld(t)
	f := &spec.Function{Name: "f", Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 64}, Scaling: spec.Scaling{KeepAlivePolicy: spec.KeepAliveGD}}
	w.step(UpsertFunction{Spec: f})
	w.step(ScaleTo{Function: "f", Desired: 4})
	w.idle(time.Minute)
	if r, _, _ := w.status("f"); r != 4 {
		t.Fatalf("%d ready, want 4 kept", r)
	}
	g := *f
	g.Scaling.Max = 2
	w.step(UpsertFunction{Spec: &g})
	if r, _, _ := w.status("f"); r != 2 {
		t.Fatalf("%d ready after max 2, want 2", r)
	}
}

// Under hybrid, a function called every 20 minutes is learned from its
// idle times: then, after each call, its sandbox leaves with the
// autoscaler's windows instead of idling for the whole gap, and a sandbox
// is back before the next call is due (the pre-warm window, 18 minutes:
// the 20-minute bin less 10 %).
func TestKeepAliveHybridLearnsAndPrewarms(t *testing.T) {
	w := smallWorld(t)
	w.deployKA("timer", 128, spec.KeepAliveHybrid, 0)
	call := func() {
		w.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true,
			Functions: []FunctionLoad{{Function: "timer", Queued: 1, NoCapacity: true}}}})
		w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second,
			Functions: []FunctionLoad{{Function: "timer", Requests: 1}}}})
	}
	// Before the histogram says (fewer than 10 idle times), gd's 15
	// minutes: the sandbox is there 14 minutes after a call.
	call()
	w.idle(14 * time.Minute)
	if r, _, _ := w.status("timer"); r != 1 {
		t.Fatalf("learning: %d ready 14 min after a call, want the fallback keep-alive's sandbox", r)
	}
	w.idle(6 * time.Minute)
	for range 11 {
		call()
		w.idle(20 * time.Minute)
	}
	// Learned: after this call, unloaded, then pre-warmed.
	call()
	w.idle(5 * time.Minute)
	if r, _, _ := w.status("timer"); r != 0 {
		t.Fatalf("learned: %d ready 5 min after the call, want it unloaded", r)
	}
	w.idle(12 * time.Minute) // 17 min after the call
	if r, p, _ := w.status("timer"); r+p != 0 {
		t.Fatalf("17 min after the call: %d ready, %d pending, want none before the pre-warm window", r, p)
	}
	w.idle(90 * time.Second) // 18.5 min
	if r, _, _ := w.status("timer"); r != 1 {
		t.Fatalf("18.5 min after the call: %d ready, want the pre-warmed sandbox", r)
	}
}

// Desired (OpenFaaS's replicas) follows the demand while gd keeps the idle
// sandboxes: a min 0, max 2 function goes to 2 under load, back to 0 a
// window and a grace after it with both sandboxes kept warm, and to its max
// of 2 again under the next load (issue 38).
func TestDesiredLeavesOutKeptSandboxes(t *testing.T) {
	w := smallWorld(t)
	w.step(UpsertFunction{Spec: &spec.Function{Name: "f", Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 64}, Scaling: spec.Scaling{Max: 2, KeepAlivePolicy: spec.KeepAliveGD}}})
	load := func(d time.Duration, conc float64) {
		for end := w.now.Add(d); w.now.Before(end); {
			w.now = w.now.Add(time.Second)
			w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second,
				Functions: []FunctionLoad{{Function: "f", AvgConcurrency: conc, InFlight: int(conc), Requests: int64(conc * 10)}}}})
			w.step(SampleLoad{})
			w.step(Tick{})
		}
	}
	desired := func() int { st, _ := w.r.FunctionStatus("f"); return st.Desired }
	load(20*time.Second, 4)
	if r, _, _ := w.status("f"); desired() != 2 || r != 2 {
		t.Fatalf("under load: desired %d, %d ready; want 2 and 2 (max)", desired(), r)
	}
	load(100*time.Second, 0) // the 60 s window and the 30 s grace
	if r, _, _ := w.status("f"); desired() != 0 || r != 2 {
		t.Fatalf("100 s after the load: desired %d, %d ready; want 0 and both kept by gd", desired(), r)
	}
	load(20*time.Second, 4)
	if r, _, _ := w.status("f"); desired() != 2 || r != 2 {
		t.Fatalf("the next load: desired %d, %d ready; want 2 and 2", desired(), r)
	}
}

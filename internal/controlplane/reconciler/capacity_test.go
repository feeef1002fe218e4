package reconciler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// fullWorld is one node with room for four 250m sandboxes by CPU.
func fullWorld(t *testing.T) *world {
	return oneNodeWorld(t, spec.Resources{MilliCPU: 1000, MemoryMB: 8192})
}

func (w *world) deployCPU(name, policy string, min int) {
	w.step(UpsertFunction{Spec: &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128},
		Scaling:   spec.Scaling{KeepAlivePolicy: policy, Min: min}}})
}

// call is one call of name arriving with no sandbox: the data plane's
// urgent report; then its load in the next periodic report.
func (w *world) call(name string) []Command {
	cmds := w.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true,
		Functions: []FunctionLoad{{Function: name, Queued: 1, NoCapacity: true}}}})
	w.load(name, 0.05)
	return cmds
}

// load is a periodic report of name's average concurrency, and of its
// calls in flight at the report's time.
func (w *world) load(name string, avg float64, inFlight ...int) {
	m := FunctionLoad{Function: name, AvgConcurrency: avg, Requests: 1}
	if len(inFlight) > 0 {
		m.InFlight = inFlight[0]
	}
	w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second, Functions: []FunctionLoad{m}}})
}

func conditionOf(cmds []Command, fn string) *Condition {
	var last *Condition
	for _, c := range cmds {
		if x, ok := c.(SetCondition); ok && x.Condition.Function == fn {
			last = &x.Condition
		}
	}
	return last
}

// A node full of idle sandboxes, each still wanted by its function's
// autoscaler window (one call a few seconds ago), gives one up at once to
// another function's waiting call, under either keep-alive policy; the
// function that yielded does not take the room back on later ticks, and
// its own next call brings it back the same way.
func TestIdleSandboxesYieldToAWaitingCall(t *testing.T) {
	for _, policy := range []string{spec.KeepAliveGD, spec.KeepAliveTTL} {
		t.Run(policy, func(t *testing.T) {
			w := fullWorld(t)
			for i := range 5 {
				w.deployCPU(fmt.Sprintf("f%d", i), policy, 0)
			}
			for i := range 4 {
				if n := count[Create](w.call(fmt.Sprintf("f%d", i))); n != 1 {
					t.Fatalf("f%d: %d creates for its first call, want 1", i, n)
				}
				w.now = w.now.Add(time.Second)
			}
			w.idle(5 * time.Second) // the reports go stale; every window still wants 1
			for i := range 4 {
				if r, _, _ := w.status(fmt.Sprintf("f%d", i)); r != 1 {
					t.Fatalf("f%d: %d ready, want 1 (within its window)", i, r)
				}
			}
			cmds := w.call("f4")
			if c := conditionOf(cmds, "f4"); c != nil && c.Reason != "" {
				t.Fatalf("condition %v while an idle sandbox makes room", c)
			}
			if ev := w.r.Stats().Evictions; ev != 1 {
				t.Fatalf("%d evictions, want 1", ev)
			}
			var retry *RetryAt
			for _, c := range cmds {
				if x, ok := c.(RetryAt); ok && x.Function == "f4" {
					retry = &x
				}
			}
			if retry == nil {
				t.Fatal("no retry armed for f4")
			}
			w.now = retry.At
			if n := count[Create](w.step(Retry{Function: "f4"})); n != 1 {
				t.Fatalf("%d creates on retry, want f4's sandbox", n)
			}
			// The first called (least recently used; for gd also the lowest
			// priority among equals) yielded and stays at zero.
			var yielded string
			for i := range 4 {
				name := fmt.Sprintf("f%d", i)
				if st, _ := w.r.FunctionStatus(name); st.Ready == 0 {
					yielded = name
					if st.Desired != 0 {
						t.Fatalf("%s: desired %d after yielding, want 0", name, st.Desired)
					}
				}
			}
			if yielded == "" {
				t.Fatal("no function yielded its sandbox")
			}
			// The data plane's next report still covers its last call, from
			// before the yield: that load must not bring the room back.
			before := w.r.Stats().Creations
			w.load(yielded, 0.05)
			w.idle(10 * time.Second)
			if got := w.r.Stats().Creations - before; got != 0 {
				t.Fatalf("%d creations in 10 idle seconds after the yield, want 0 (the room is not taken back)", got)
			}
			// Its next call evicts another idle sandbox and comes back.
			w.now = w.now.Add(time.Second)
			cmds = w.call(yielded)
			for _, c := range cmds {
				if x, ok := c.(RetryAt); ok && x.Function == yielded {
					w.now = x.At
					w.step(Retry{Function: yielded})
				}
			}
			if r, _, _ := w.status(yielded); r != 1 {
				t.Fatalf("%s: %d ready after its next call, want 1", yielded, r)
			}
		})
	}
}

// Busy sandboxes and a function's min are not taken: with nothing idle the
// waiting call's function gets the no-capacity condition, naming the node
// and the resource it lacks, and its calls wait (not fail-fast): the busy
// sandboxes' room comes back when their calls end, and it is taken then.
func TestBusyRoomIsWaitedFor(t *testing.T) {
	w := fullWorld(t)
	w.deployCPU("pinned", spec.KeepAliveGD, 2)
	for _, name := range []string{"busy1", "busy2", "late"} {
		w.deployCPU(name, spec.KeepAliveTTL, 0)
	}
	w.call("busy1")
	w.call("busy2")
	w.load("busy1", 1, 1) // a call in flight on each
	w.load("busy2", 1, 1)
	// An urgent report lists the waiting function and those whose calls
	// in flight changed since the last report.
	cmds := w.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true, Functions: []FunctionLoad{
		{Function: "late", Queued: 1, NoCapacity: true}, {Function: "busy1", InFlight: 1}, {Function: "busy2", InFlight: 1}}}})
	if ev := w.r.Stats().Evictions; ev != 0 {
		t.Fatalf("%d evictions of busy or min sandboxes, want 0", ev)
	}
	c := conditionOf(cmds, "late")
	if c == nil || c.Reason != CondNoCapacity || c.FailFast {
		t.Fatalf("condition %v, want no-capacity, not fail-fast", c)
	}
	for _, want := range []string{"node n0", "CPU 1000m of 1000m requested", "250m CPU"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
	// busy1's call ends: the next urgent report (another call of late)
	// lists busy1 with none in flight, and busy1's sandbox is taken; busy2,
	// left out, stands as last reported: busy.
	w.now = w.now.Add(time.Second)
	cmds = w.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true, Functions: []FunctionLoad{
		{Function: "late", Queued: 1, NoCapacity: true}, {Function: "busy1", InFlight: 0}}}})
	if ev := w.r.Stats().Evictions; ev != 1 {
		t.Fatalf("%d evictions once busy1 is idle, want 1", ev)
	}
	if c := conditionOf(cmds, "late"); c == nil || c.Reason != "" {
		t.Fatalf("condition %v once room is coming, want cleared", c)
	}
	if r, _, _ := w.status("busy2"); r != 1 {
		t.Fatalf("busy2: %d ready, want its busy sandbox kept", r)
	}
	if r, _, _ := w.status("pinned"); r != 2 {
		t.Fatalf("pinned: %d ready, want its min of 2 kept", r)
	}
}

// A node whose room is all other functions' min sandboxes has none that
// can come: the waiting call's function fails fast, naming the node and
// the resource it lacks; so does a function asking more than any node has.
func TestNoRoomFailsFastNamingNodeAndResource(t *testing.T) {
	w := fullWorld(t)
	w.deployCPU("pinned", spec.KeepAliveGD, 4)
	w.deployCPU("late", spec.KeepAliveTTL, 0)
	c := conditionOf(w.call("late"), "late")
	if c == nil || c.Reason != CondNoCapacity || !c.FailFast {
		t.Fatalf("condition %v, want no-capacity, fail-fast", c)
	}
	for _, want := range []string{"node n0", "CPU 1000m of 1000m requested", "250m CPU"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q lacks %q", c.Message, want)
		}
	}
	w.step(UpsertFunction{Spec: &spec.Function{Name: "huge", Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 2000, MemoryMB: 128}}})
	if c := conditionOf(w.call("huge"), "huge"); c == nil || c.Reason != CondNoCapacity || !c.FailFast {
		t.Fatalf("huge: condition %v, want no-capacity, fail-fast", c)
	}
}

// A function whose first sandbox is starting is not failed fast when a
// second finds no room: its calls can wait for the first.
func TestNoRoomWithASandboxComingDoesNotFailFast(t *testing.T) {
	w := fullWorld(t)
	w.deployCPU("big", spec.KeepAliveTTL, 0)
	w.load("big", 10)
	w.step(ScaleTo{Function: "big", Desired: 5})
	st, _ := w.r.FunctionStatus("big")
	if st.Ready != 4 || st.Condition != CondNoCapacity {
		t.Fatalf("status %+v, want 4 ready and no-capacity", st)
	}
	if c := w.r.fns["big"].cond; c.failFast() {
		t.Fatalf("condition %+v fails fast with 4 sandboxes", c)
	}
}

// A rollout on a full node: the new revision's sandboxes take the room of
// idle sandboxes of the old revision (which would leave once the new one
// serves, and so would wait forever for it).
func TestRolloutOnAFullNodeTakesAnOldIdleSandbox(t *testing.T) {
	w := fullWorld(t)
	f := &spec.Function{Name: "hog", Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128}, Scaling: spec.Scaling{Min: 4}}
	w.step(UpsertFunction{Spec: f})
	if r, _, _ := w.status("hog"); r != 4 {
		t.Fatalf("%d ready, want 4", r)
	}
	g := *f
	g.Revision, g.Scaling.Min = 2, 1
	cmds := w.step(UpsertFunction{Spec: &g})
	if ev := w.r.Stats().Evictions; ev == 0 {
		t.Fatal("no eviction of an old-revision sandbox")
	}
	for _, c := range cmds {
		if x, ok := c.(RetryAt); ok && x.Function == "hog" {
			w.now = x.At
			w.step(Retry{Function: "hog"})
		}
	}
	st, _ := w.r.FunctionStatus("hog")
	if st.Ready != st.Desired || st.Ready == 0 || st.Terminating != 0 {
		t.Fatalf("status %+v, want the new revision's sandboxes ready and the old ones gone", st)
	}
	for _, sb := range st.Sandboxes {
		if sb.Revision != 2 {
			t.Fatalf("sandbox %+v of the old revision left", sb)
		}
	}
}

// With no node connected (a cluster starting, a worker restarting) a call
// waits for one rather than failing fast.
func TestNoNodeConnectedDoesNotFailFast(t *testing.T) {
	w := newWorld(t, 0)
	w.deployCPU("f", spec.KeepAliveTTL, 0)
	c := conditionOf(w.call("f"), "f")
	if c == nil || c.Reason != CondNoCapacity || c.FailFast || !strings.Contains(c.Message, "no worker node is connected") {
		t.Fatalf("condition %v, want no-capacity (no node connected), not fail-fast", c)
	}
}

// A sandbox made for a queued call serves it as soon as it is ready, before
// any report says it is busy: another data plane's waiting call must not
// take it (review finding: two functions evicted each other on every call).
// Once its data plane reports it idle, it may go.
func TestQueuedCallKeepsItsNewSandbox(t *testing.T) {
	w := oneNodeWorld(t, spec.Resources{MilliCPU: 250, MemoryMB: 8192})
	w.deployCPU("g", spec.KeepAliveTTL, 0)
	w.deployCPU("h", spec.KeepAliveTTL, 0)
	w.step(Metrics{Report: LoadReport{DataPlane: "dp1", Urgent: true,
		Functions: []FunctionLoad{{Function: "g", Queued: 1, NoCapacity: true}}}})
	if r, _, _ := w.status("g"); r != 1 {
		t.Fatalf("g: %d ready, want 1", r)
	}
	cmds := w.step(Metrics{Report: LoadReport{DataPlane: "dp2", Urgent: true,
		Functions: []FunctionLoad{{Function: "h", Queued: 1, NoCapacity: true}}}})
	if ev := w.r.Stats().Evictions; ev != 0 {
		t.Fatalf("%d evictions of g's sandbox while its queued call goes to it", ev)
	}
	if c := conditionOf(cmds, "h"); c == nil || c.Reason != CondNoCapacity {
		t.Fatalf("h: condition %v, want no-capacity", c)
	}
	// dp1 reports g's call done: g is idle, and h's next call takes its room.
	w.now = w.now.Add(time.Second)
	w.step(Metrics{Report: LoadReport{DataPlane: "dp1", Interval: time.Second,
		Functions: []FunctionLoad{{Function: "g", AvgConcurrency: 0.01, Requests: 1}}}})
	w.step(Metrics{Report: LoadReport{DataPlane: "dp2", Urgent: true,
		Functions: []FunctionLoad{{Function: "h", Queued: 1, NoCapacity: true}}}})
	if ev := w.r.Stats().Evictions; ev != 1 {
		t.Fatalf("%d evictions once g is idle, want 1", ev)
	}
}

// A function's reachable sandboxes cover its min and its calls; one on a
// node whose link is down covers nothing, so the reachable one stays.
func TestUnreachableSandboxesDoNotCoverTheMin(t *testing.T) {
	w := newWorld(t, 0)
	for _, id := range []string{"n0", "n1"} {
		w.step(RegisterNode{Worker: &nodes.Worker{ID: id, Address: "127.0.0.1:1", Capacity: spec.Resources{MilliCPU: 250, MemoryMB: 8192}}})
		w.running[id] = map[string]string{}
		w.step(SessionUp{Node: id})
	}
	w.deployCPU("g", spec.KeepAliveGD, 1)
	w.step(ScaleTo{Function: "g", Desired: 2}) // one sandbox on each node
	if r, _, _ := w.status("g"); r != 2 {
		t.Fatalf("g: %d ready, want 2", r)
	}
	w.step(SessionDown{Node: "n1", Withdraw: true})
	w.deployCPU("h", spec.KeepAliveTTL, 0)
	w.call("h")
	if ev := w.r.Stats().Evictions; ev != 0 {
		t.Fatalf("%d evictions: g's only reachable sandbox was taken below its min", ev)
	}
}

// Memory the node's templates hold (its heartbeat's) is off the node's
// allocatable memory: a function at min 3 of 300 MiB fits 3 on a 1024 MiB
// node, 2 once templates hold 200 MiB, and 3 again when they go; status
// shows what they hold.
func TestTemplateMemoryIsOffAllocatable(t *testing.T) {
	w := oneNodeWorld(t, spec.Resources{MilliCPU: 4000, MemoryMB: 1024})
	heartbeat := func(tplMB int64) {
		hb := &Heartbeat{Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 1024}}
		if tplMB > 0 {
			hb.Templates = spec.Resources{MemoryMB: tplMB}
		}
		w.step(WorkerUpdates{Node: "n0", Updates: Updates{Heartbeat: hb}})
	}
	deploy := func(name string, min int) {
		w.step(UpsertFunction{Spec: &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1,
			Resources: spec.Resources{MilliCPU: 100, MemoryMB: 300}, Scaling: spec.Scaling{Min: min}}})
	}
	heartbeat(200)
	if got := w.r.NodeStatus(w.now)[0].Templates.MemoryMB; got != 200 {
		t.Fatalf("status shows %d MiB of templates, want 200", got)
	}
	deploy("a", 3)
	if r, _, _ := w.status("a"); r != 2 {
		t.Fatalf("%d ready with 824 MiB allocatable, want 2", r)
	}
	heartbeat(0)
	w.idle(2 * time.Second) // the next ticks retry the placement
	if r, _, _ := w.status("a"); r != 3 {
		t.Fatalf("%d ready once the templates went, want 3", r)
	}
	// Templates beyond capacity leave nothing, not a negative amount.
	heartbeat(5000)
	deploy("b", 1)
	if r, _, _ := w.status("b"); r != 0 {
		t.Fatalf("b: %d ready on a node whose templates hold all its memory, want 0", r)
	}
}

// Under the locality policy, a node whose heartbeat lists a function's
// template gets its new sandboxes, where without templates they would
// spread over the emptiest nodes; another revision's template does not
// count. A heartbeat that does not list templates keeps the node's set,
// an empty list clears it.
func TestLocalityPrefersTemplateNodes(t *testing.T) {
	w := newWorld(t, 3)
	heartbeat := func(node string, set []HeldTemplate) {
		w.step(WorkerUpdates{Node: node, Updates: Updates{Heartbeat: &Heartbeat{
			Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 8192}, HeldSet: set != nil, Held: set}}})
	}
	held := func(rev uint64, fns ...string) []HeldTemplate {
		set := []HeldTemplate{}
		for _, f := range fns {
			set = append(set, HeldTemplate{Function: f, Revision: rev})
		}
		return set
	}
	fns := []string{"py0", "py1", "py2", "py3", "py4", "py5"}
	heartbeat("n0", held(7, fns...)) // another revision's
	heartbeat("n2", held(1, fns...))
	for _, name := range fns {
		cmds := w.step(UpsertFunction{Spec: &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1,
			Placement: "locality", Resources: spec.Resources{MilliCPU: 500, MemoryMB: 128}, Scaling: spec.Scaling{Min: 1}}})
		for _, c := range cmds {
			if x, ok := c.(Create); ok && x.Node != "n2" {
				t.Fatalf("%s's sandbox went to %s, want n2 (its template)", name, x.Node)
			}
		}
		if _, p, _ := w.status(name); p != 0 {
			t.Fatalf("%s: %d pending", name, p)
		}
	}
	heartbeat("n2", nil)
	if n := len(w.r.nodes["n2"].templates); n != len(fns) {
		t.Fatalf("a heartbeat without a list left %d templates, want %d", n, len(fns))
	}
	heartbeat("n2", []HeldTemplate{})
	if n := len(w.r.nodes["n2"].templates); n != 0 {
		t.Fatalf("an empty list left %d templates", n)
	}
}

// Sandboxes of a removed function still draining their calls hold the
// node's room, but it comes back when the calls end: a call of another
// function waits for it (not fail-fast), though the removed function is
// gone from the reconciler's functions.
func TestRemovedFunctionsDrainingRoomIsWaitedFor(t *testing.T) {
	w := fullWorld(t)
	w.r.cfg.DrainDelay = 500 * time.Millisecond
	w.deployCPU("pinned", spec.KeepAliveGD, 4)
	var held []string
	for _, c := range w.step(RemoveFunction{Name: "pinned"}) {
		if x, ok := c.(RemoveEndpoint); ok {
			held = append(held, x.ID)
		}
	}
	if len(held) != 4 {
		t.Fatalf("removal withdrew %v, want its 4 sandboxes", held)
	}
	w.now = w.now.Add(100 * time.Millisecond)
	w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second, Draining: held}})
	w.deployCPU("late", spec.KeepAliveTTL, 0)
	cmds := w.step(Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true, Draining: held,
		Functions: []FunctionLoad{{Function: "late", Queued: 1, NoCapacity: true}}}})
	if c := conditionOf(cmds, "late"); c == nil || c.Reason != CondNoCapacity || c.FailFast {
		t.Fatalf("condition %v, want no-capacity, not fail-fast: the draining room comes back", c)
	}
}

// BenchmarkRoomMayCome is a capacity failure's checks at 40,000 functions,
// a few of them with sandboxes on the one node: a waiting call asks them
// every 500 ms, so they walk the nodes' sandboxes, not the functions.
func BenchmarkRoomMayCome(b *testing.B) {
	r, err := New(Config{Autoscale: autoscale.DefaultConfig(), NodeGrace: 10 * time.Second, FailureBackoff: 200 * time.Millisecond,
		MaxFailureBackoff: 30 * time.Second, Seed: 1, IDPrefix: "t"})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	r.Step(now, RegisterNode{Worker: &nodes.Worker{ID: "n0", Address: "127.0.0.1:1", Capacity: spec.Resources{MilliCPU: 1000, MemoryMB: 8192}}})
	r.Step(now, SessionUp{Node: "n0"})
	for i := range 40_000 {
		r.Step(now, UpsertFunction{Spec: &spec.Function{Name: fmt.Sprintf("f%d", i), Builtin: "echo", Concurrency: 1, Revision: uint64(i + 1),
			Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128}}})
	}
	for i := range 4 { // the node's room, taken
		r.Step(now, Metrics{Report: LoadReport{DataPlane: "dp", Urgent: true, Functions: []FunctionLoad{{Function: fmt.Sprintf("f%d", i), Queued: 1, NoCapacity: true}}}})
	}
	fs := r.fns["f39999"]
	if r.roomMayCome(fs) != true {
		b.Fatal("room held by functions without a min counts as coming")
	}
	b.Run("roomMayCome", func(b *testing.B) {
		for b.Loop() {
			r.roomMayCome(fs)
		}
	})
	// evictFor's search for idle sandboxes, which runs first.
	b.Run("idleByNode", func(b *testing.B) {
		for b.Loop() {
			r.idleByNode(now, fs, false)
		}
	})
}

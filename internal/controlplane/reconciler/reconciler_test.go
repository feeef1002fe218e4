package reconciler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// world steps a Reconciler the way the control plane does, with no network:
// workers answer Creates at once (CREATING then READY) unless told to fail.
type world struct {
	t   *testing.T
	r   *Reconciler
	now time.Time
	log []string // every command, rendered
	// running is what each worker runs: node -> sandbox id -> function.
	running map[string]map[string]string
	fail    bool // workers report every new sandbox FAILED
	version uint64
	// tracing: step appends each command and worker reply to trace
	// (the scenarios in testdata), with times relative to start.
	tracing bool
	trace   []string
	start   time.Time
}

func newWorld(t *testing.T, count int) *world {
	t.Helper()
	r, err := New(Config{Autoscale: autoscale.DefaultConfig(), DrainDelay: 0, NodeGrace: 10 * time.Second,
		FailureBackoff: 200 * time.Millisecond, MaxFailureBackoff: 30 * time.Second, Seed: 1, IDPrefix: "t"})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, r: r, now: time.Unix(1_000_000, 0), running: map[string]map[string]string{}}
	for i := range count {
		id := fmt.Sprintf("n%d", i)
		w.step(RegisterNode{Worker: &nodes.Worker{ID: id, Address: "127.0.0.1:1", Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 8192}}})
		w.running[id] = map[string]string{}
		w.step(SessionUp{Node: id})
	}
	return w
}

// step applies ev and the workers' answers to its commands, to a fixpoint.
func (w *world) step(ev Event) []Command {
	w.t.Helper()
	cmds := append([]Command(nil), w.r.Step(w.now, ev)...)
	var all []Command
	for len(cmds) > 0 {
		all = append(all, cmds...)
		var next []Command
		for _, c := range cmds {
			w.log = append(w.log, render(c))
			if w.tracing {
				w.trace = append(w.trace, describe(c, w.now))
			}
			var recs []Record
			switch x := c.(type) {
			case Create:
				w.version++
				if w.fail {
					recs = append(recs, Record{ID: x.ID, Function: x.Spec.Name, Revision: x.Spec.Revision,
						State: StateFailed, Version: w.version, Message: "exec: /nope: no such file"})
					break
				}
				w.running[x.Node][x.ID] = x.Spec.Name
				recs = append(recs, Record{ID: x.ID, Function: x.Spec.Name, Revision: x.Spec.Revision,
					State: StateReady, Version: w.version, Address: "10.0.0.1:" + x.ID})
			case Tombstone:
				if _, ok := w.running[x.Node][x.ID]; ok {
					delete(w.running[x.Node], x.ID)
					w.version++
					recs = append(recs, Record{ID: x.ID, State: StateGone, Version: w.version})
				}
			}
			if len(recs) > 0 && w.tracing {
				for _, r := range recs {
					w.trace = append(w.trace, fmt.Sprintf("%s: %s %s", nodeOf(c), r.ID, r.State))
				}
			}
			if len(recs) > 0 && w.r.Up(nodeOf(c)) {
				next = append(next, w.r.Step(w.now, WorkerUpdates{Node: nodeOf(c), Updates: Updates{Records: recs}})...)
			}
		}
		cmds = next
	}
	return all
}

// render prints a command without pointers (they differ between runs).
func render(c Command) string {
	switch x := c.(type) {
	case Create:
		return fmt.Sprintf("create %s %s %s", x.Node, x.ID, x.Spec.Name)
	case Offer:
		return fmt.Sprintf("offer %s %s", x.Node, x.Spec.Name)
	case AddEndpoint:
		return fmt.Sprintf("add %s %s %s", x.Endpoint.SandboxID, x.Endpoint.Node, x.Endpoint.ReadyAfter)
	case PublishFunction:
		return "publish " + x.Function.Spec.Name
	case SetCondition:
		return "condition " + x.Condition.Function + " " + x.Condition.Reason
	case SetEmergencyWorkers:
		return fmt.Sprintf("emergency %d", len(x.Workers))
	}
	return fmt.Sprintf("%T%+v", c, c)
}

func nodeOf(c Command) string {
	switch x := c.(type) {
	case Create:
		return x.Node
	case Tombstone:
		return x.Node
	}
	return ""
}

func (w *world) deploy(name string, min int) *spec.Function {
	f := &spec.Function{Name: name, Builtin: "echo", Concurrency: 1, Revision: 1,
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 128}, Scaling: spec.Scaling{Min: min}}
	w.step(UpsertFunction{Spec: f})
	return f
}

func (w *world) status(name string) (ready, pending, terminating int) {
	st, ok := w.r.FunctionStatus(name)
	if !ok {
		w.t.Fatalf("no function %q", name)
	}
	return st.Ready, st.Pending, st.Terminating
}

func count[T Command](cmds []Command) int {
	n := 0
	for _, c := range cmds {
		if _, ok := c.(T); ok {
			n++
		}
	}
	return n
}

// The scenarios of the state protocol (scaling from zero and back, a
// failing function, a node down, a reset handshake, capacity) are
// testdata/*.txt, run by TestScenarios.

// The same events with the same seed give the same commands.
func TestDeterministic(t *testing.T) {
	run := func() []string {
		w := newWorld(t, 5)
		for i := range 20 {
			w.deploy(fmt.Sprintf("f%d", i), i%4)
		}
		for i := range 30 {
			w.now = w.now.Add(time.Second)
			w.step(Metrics{Report: LoadReport{DataPlane: "dp", Interval: time.Second,
				Functions: []FunctionLoad{{Function: fmt.Sprintf("f%d", i%20), AvgConcurrency: float64(i % 7), Requests: 3}}}})
			w.step(SampleLoad{})
			if i%2 == 0 {
				w.step(Tick{})
			}
		}
		return w.log
	}
	a, b := run(), run()
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Fatal("two runs of the same events differ")
	}
	if len(a) < 50 {
		t.Fatalf("only %d commands: the scenario does nothing", len(a))
	}
}

// A spec may name exactly the placement policies the reconciler can make.
func TestSpecPlacementsMatchPolicies(t *testing.T) {
	if got, want := strings.Join(spec.Placements, ","), strings.Join(placement.Names(), ","); got != want {
		t.Fatalf("spec.Placements %s, placement.Names() %s", got, want)
	}
}

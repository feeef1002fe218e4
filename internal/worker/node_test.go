package worker

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/pkg/spec"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestNode returns a node backed by the emulated runtime (a product
// runtime, served by a real HTTP host) and a session epoch installed.
func newTestNode(t *testing.T, delay time.Duration) *Node {
	t.Helper()
	n, _ := newTestNodeRT(t, delay)
	return n
}

// newTestNodeRT is newTestNode with its runtime.
func newTestNodeRT(t *testing.T, delay time.Duration) (*Node, runtime.Runtime) {
	t.Helper()
	host, err := emulated.NewHost("127.0.0.1:0", quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { host.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	rt := host.Runtime("n1", delay)
	n := newNode("n1", "boot-1", rt, spec.Resources{MilliCPU: 4000, MemoryMB: 4096}, 0, time.Minute, quiet)
	n.install(ctx, &briskv1.Hello{Epoch: 1, Mode: briskv1.HandshakeMode_HANDSHAKE_MODE_RECOVER})
	return n, rt
}

var fnSpec = &briskv1.FunctionSpec{Name: "f", Revision: 1, Builtin: "trace", Port: 8080, Concurrency: 1,
	Resources: &briskv1.Resources{MilliCpu: 100, MemoryMb: 64}}

func create(ids ...string) *briskv1.Commands {
	c := &briskv1.Commands{Specs: []*briskv1.FunctionSpec{fnSpec}}
	for _, id := range ids {
		c.Creates = append(c.Creates, &briskv1.CreateSandbox{Id: id, Function: "f", Revision: 1})
	}
	return c
}

func state(n *Node, id string) briskv1.SandboxState {
	for _, r := range n.Snapshot() {
		if r.Id == id {
			return r.State
		}
	}
	return briskv1.SandboxState_SANDBOX_STATE_UNSPECIFIED
}

// pendingStates drains the node's queued updates for one id.
func pendingStates(n *Node, id string) []briskv1.SandboxState {
	recs, _ := n.takePending(n.currentEpoch())
	var out []briskv1.SandboxState
	for _, r := range recs {
		if r.Id == id {
			out = append(out, r.State)
		}
	}
	return out
}

// docs/reliability.md, case 3: a Create delivered twice makes one sandbox.
func TestDuplicateCreateMakesOneSandbox(t *testing.T) {
	n := newTestNode(t, 5*time.Millisecond)
	n.apply(context.Background(), n.currentEpoch(), create("a"))
	n.apply(context.Background(), n.currentEpoch(), create("a"))
	testutil.Eventually(t, 5*time.Second, func() bool { return state(n, "a") == briskv1.SandboxState_SANDBOX_STATE_READY })
	if got := len(n.Snapshot()); got != 1 {
		t.Fatalf("%d sandboxes after a duplicate create, want 1", got)
	}
	listed, _ := n.rt.List(context.Background())
	if len(listed) != 1 {
		t.Fatalf("runtime runs %d sandboxes, want 1", len(listed))
	}
}

// docs/reliability.md, case 7: a Tombstone that overtakes its Create means the
// sandbox never starts, and a later Create for the id is refused.
func TestTombstoneBeforeCreateNeverStarts(t *testing.T) {
	n := newTestNode(t, 0)
	n.apply(context.Background(), n.currentEpoch(), &briskv1.Commands{Tombstones: []string{"b"}})
	testutil.Eventually(t, 5*time.Second, func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		_, ok := n.terminated["b"]
		return ok
	})
	pendingStates(n, "b")
	n.apply(context.Background(), n.currentEpoch(), create("b"))
	if got := pendingStates(n, "b"); len(got) != 1 || got[0] != briskv1.SandboxState_SANDBOX_STATE_GONE {
		t.Fatalf("create after tombstone answered %v, want [GONE]", got)
	}
	if len(n.Snapshot()) != 0 {
		t.Fatalf("a tombstoned id started: %v", n.Snapshot())
	}
	listed, _ := n.rt.List(context.Background())
	if len(listed) != 0 {
		t.Fatalf("runtime runs %d sandboxes, want 0", len(listed))
	}
}

// A terminated sandbox never comes back (anomaly #1 at the tail).
func TestTerminatedSandboxIsNeverRevived(t *testing.T) {
	n := newTestNode(t, 0)
	n.apply(context.Background(), n.currentEpoch(), create("c"))
	testutil.Eventually(t, 5*time.Second, func() bool { return state(n, "c") == briskv1.SandboxState_SANDBOX_STATE_READY })
	n.apply(context.Background(), n.currentEpoch(), &briskv1.Commands{Tombstones: []string{"c"}})
	testutil.Eventually(t, 5*time.Second, func() bool { return len(n.Snapshot()) == 0 })
	pendingStates(n, "c")
	n.apply(context.Background(), n.currentEpoch(), create("c"))
	if got := pendingStates(n, "c"); len(got) != 1 || got[0] != briskv1.SandboxState_SANDBOX_STATE_GONE {
		t.Fatalf("re-create of a terminated id answered %v, want [GONE]", got)
	}
	if len(n.Snapshot()) != 0 {
		t.Fatal("terminated sandbox revived")
	}
}

// A tombstone during a slow start cancels it; nothing is left running.
func TestTombstoneDuringCreation(t *testing.T) {
	n := newTestNode(t, 300*time.Millisecond)
	n.apply(context.Background(), n.currentEpoch(), create("d"))
	testutil.Eventually(t, 5*time.Second, func() bool { return state(n, "d") == briskv1.SandboxState_SANDBOX_STATE_CREATING })
	n.apply(context.Background(), n.currentEpoch(), &briskv1.Commands{Tombstones: []string{"d"}})
	testutil.Eventually(t, 5*time.Second, func() bool { return len(n.Snapshot()) == 0 })
	listed, _ := n.rt.List(context.Background())
	if len(listed) != 0 {
		t.Fatalf("runtime still runs %v", listed)
	}
}

// Unknown revisions fail cleanly instead of starting something stale.
func TestCreateWithoutSpecFails(t *testing.T) {
	n := newTestNode(t, 0)
	n.apply(context.Background(), n.currentEpoch(), &briskv1.Commands{Creates: []*briskv1.CreateSandbox{{Id: "e", Function: "g", Revision: 9}}})
	if got := pendingStates(n, "e"); len(got) != 1 || got[0] != briskv1.SandboxState_SANDBOX_STATE_FAILED {
		t.Fatalf("create for an unknown spec answered %v, want [FAILED]", got)
	}
}

// A drain Hello kills every sandbox before the handshake answer.
func TestDrainKillsEverythingBeforeAnswering(t *testing.T) {
	n := newTestNode(t, 0)
	n.apply(context.Background(), n.currentEpoch(), create("x", "y"))
	testutil.Eventually(t, 5*time.Second, func() bool {
		return state(n, "x") == briskv1.SandboxState_SANDBOX_STATE_READY && state(n, "y") == briskv1.SandboxState_SANDBOX_STATE_READY
	})
	ack := n.install(context.Background(), &briskv1.Hello{Epoch: 2, Drain: true, Mode: briskv1.HandshakeMode_HANDSHAKE_MODE_RESET})
	if len(ack.Versions) != 0 {
		t.Fatalf("drained node still reports %d sandboxes", len(ack.Versions))
	}
	listed, _ := n.rt.List(context.Background())
	if len(listed) != 0 {
		t.Fatalf("runtime still runs %v after drain", listed)
	}
}

// Commands of a session that a newer handshake has superseded are refused
// even when they reach apply (the session loop's own check can be overtaken
// by the newer handshake).
func TestApplyRefusesAnOldEpoch(t *testing.T) {
	n := newTestNode(t, 0)
	old := n.currentEpoch()
	n.install(context.Background(), &briskv1.Hello{Epoch: old + 1, Mode: briskv1.HandshakeMode_HANDSHAKE_MODE_RESET})
	if n.apply(context.Background(), old, create("z")) {
		t.Fatal("commands of the old session applied")
	}
	if len(n.Snapshot()) != 0 {
		t.Fatalf("old session's create started %v", n.Snapshot())
	}
	if !n.apply(context.Background(), old+1, create("z")) || state(n, "z") == briskv1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
		t.Fatal("commands of the current session refused")
	}
}

// gatedCreates holds each Create before the runtime records it, as a slow
// start does (the process runtime records a sandbox only once its process
// runs, and checks its context only before it starts it): a Kill in that
// window finds nothing, and the start goes on.
type gatedCreates struct {
	runtime.Runtime
	entered, gate, created chan struct{}
}

func (g gatedCreates) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	g.entered <- struct{}{}
	<-g.gate
	defer func() { g.created <- struct{}{} }()
	return g.Runtime.Create(context.WithoutCancel(ctx), s)
}

// A Tombstone that overtakes a start in progress (its Kill finds no
// sandbox yet, and the worker reports it gone) must still end the sandbox
// once the start completes: before, it ran on, unaccounted (the partition
// lab's strays after a heal).
func TestTombstoneDuringStartEndsTheSandbox(t *testing.T) {
	n, rt := newTestNodeRT(t, 0)
	g := gatedCreates{Runtime: rt, entered: make(chan struct{}, 1), gate: make(chan struct{}), created: make(chan struct{}, 1)}
	n.rt, n.emRT = g, g
	ctx := context.Background()
	if !n.apply(ctx, 1, create("s1")) {
		t.Fatal("create refused")
	}
	<-g.entered
	n.terminate(ctx, "s1", "tombstone") // the runtime knows nothing of s1 yet
	close(g.gate)
	<-g.created // the start went through: s1 runs in the runtime now
	testutil.Eventually(t, 10*time.Second, func() bool {
		ls, err := rt.List(ctx)
		return err == nil && len(ls) == 0 && len(n.Snapshot()) == 0
	}, "s1 ended after its start completed")
}

// failingKills is a runtime whose Kill fails while fail is set (a wedged
// container engine).
type failingKills struct {
	runtime.Runtime
	fail *atomic.Bool
}

func (r failingKills) Kill(ctx context.Context, id string) error {
	if !r.fail.Load() {
		return r.Runtime.Kill(ctx, id)
	}
	<-ctx.Done() // as a hung engine call would, until its deadline
	return ctx.Err()
}

// A worker stopping with kills that keep failing gives them up once its
// stop's time is over (issue 39: the retry slept uncancellably, so Stop,
// and the worker's exit, waited forever); the sandbox stays terminating
// for the next worker's recovery, and a later Tombstone retries it.
func TestStopGivesUpKillsThatKeepFailing(t *testing.T) {
	n, rt := newTestNodeRT(t, 0)
	var fail atomic.Bool
	n.rt, n.emRT = failingKills{rt, &fail}, failingKills{rt, &fail}
	n.apply(context.Background(), n.currentEpoch(), create("a"))
	testutil.Eventually(t, 10*time.Second, func() bool { return state(n, "a") == briskv1.SandboxState_SANDBOX_STATE_READY }, "a never ran")
	fail.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	stopped := make(chan struct{})
	go func() { n.Stop(ctx); close(stopped) }()
	testutil.Eventually(t, 20*time.Second, func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}, "Stop never returned while the kill kept failing")
	if s := state(n, "a"); s != briskv1.SandboxState_SANDBOX_STATE_TERMINATING {
		t.Fatalf("a is %v after the given-up kill, want TERMINATING (left for recovery)", s)
	}
	// The engine recovers: a Tombstone kills it after all.
	fail.Store(false)
	n.apply(context.Background(), n.currentEpoch(), &briskv1.Commands{Tombstones: []string{"a"}})
	testutil.Eventually(t, 10*time.Second, func() bool { return state(n, "a") == briskv1.SandboxState_SANDBOX_STATE_UNSPECIFIED }, "a was not killed by the later Tombstone")
}

package controlplane

import (
	"context"
	"slices"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// Watch makes faultRuntime a runtime.Watcher, as the process and containerd
// runtimes are: a restarted daemon watches the sandboxes it adopts, and
// evict ends them as it ends those this runtime created.
func (r *faultRuntime) Watch(id string) (<-chan struct{}, func() error, bool) {
	l, _ := r.inner.List(context.Background())
	if !slices.ContainsFunc(l, func(s runtime.Listed) bool { return s.ID == id }) {
		return nil, nil, false
	}
	r.mu.Lock()
	e := r.exits[id]
	if e == nil {
		e = &exitSignal{ch: make(chan struct{})}
		r.exits[id] = e
	}
	r.mu.Unlock()
	return e.ch, func() error { <-e.ch; return e.err }, true
}

var _ runtime.Watcher = (*faultRuntime)(nil)

// verifiesSent lists the sandbox ids the control plane asked node to verify.
func (e *env) verifiesSent(node string) []string {
	var ids []string
	for _, m := range e.net.seenWhere(func(m seenMsg) bool { return m.dir == toWorker && m.node == node }) {
		ids = append(ids, m.msg.(*briskv1.ToWorker).GetCommands().GetVerify()...)
	}
	return ids
}

func (e *env) reportUnreachable(fn, id, addr string) {
	e.t.Helper()
	_, err := e.cp.ReportUnreachable(context.Background(), &briskv1.UnreachableReport{DataPlaneId: "dp-test",
		Endpoints: []*briskv1.UnreachableEndpoint{{SandboxId: id, Function: fn, Address: addr, Error: "connection refused"}}})
	if err != nil {
		e.t.Fatal(err)
	}
}

// awaitReplaced waits until the control plane has dropped sandbox id of fn
// (its worker reported it ended), then lets the crash-loop backoff pass on
// the fake clock, so that the replacement is placed.
func (e *env) awaitReplaced(fn, id string) {
	e.t.Helper()
	testutil.Eventually(e.t, wait, func() bool { _, held := e.cpView(fn)[id]; return !held }, "%s dropped by the control plane", id)
	e.advance(e.cp.cfg.MaxFailureBackoff)
}

func (e *env) addrOf(fn, id string) string {
	st, _ := e.cp.cluster.functionStatus(fn)
	for _, s := range st.Sandboxes {
		if s.ID == id {
			return s.Address
		}
	}
	return ""
}

// Issue 21 item 1: a sandbox a restarted worker adopted, that then dies, is
// replaced as one the worker started would be (the worker watches it and
// reports it EXITED), not kept as ready forever.
func TestAdoptedSandboxDeathIsReplaced(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	e.deploy("f", 1)
	before := e.awaitConverged("f", 1)
	e.crashWorker("w0", false)
	e.restartWorker("w0")
	if got := e.awaitConverged("f", 1); !slices.Equal(got, before) {
		t.Fatalf("the restarted worker's sandbox was not adopted: %v, was %v", got, before)
	}
	if err := e.workers["w0"].rt.evict(before[0]); err != nil {
		t.Fatalf("the adopted sandbox is not watched: %v", err)
	}
	e.awaitReplaced("f", before[0])
	after := e.awaitConverged("f", 1)
	if after[0] == before[0] {
		t.Fatalf("the dead adopted sandbox %s is still routed", before[0])
	}
}

// A data plane's report does not kill a sandbox by itself: the worker checks
// it, finds it serving and announces it again, and the control plane puts
// it back on the data planes (the reporting one took it out of rotation).
func TestUnreachableReportOfLiveSandbox(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	e.deploy("f", 1)
	ids := e.awaitConverged("f", 1)
	created := e.creations()
	// A report about another address of it, or an id no one has, is
	// ignored; the report of the sandbox itself is checked.
	e.reportUnreachable("f", ids[0], "127.0.0.1:1")
	e.reportUnreachable("f", "no-such-sandbox", "127.0.0.1:1")
	e.reportUnreachable("nofn", ids[0], "")
	mark := e.watch.mark()
	e.reportUnreachable("f", ids[0], e.addrOf("f", ids[0]))
	testutil.Eventually(t, wait, func() bool { return e.watch.announcedSince(mark, ids[0]) },
		"the checked sandbox is announced to the data planes again")
	if got := e.verifiesSent("w0"); !slices.Equal(got, ids) {
		t.Fatalf("verifications sent %v, want just %v", got, ids)
	}
	if got := e.awaitConverged("f", 1); !slices.Equal(got, ids) {
		t.Fatalf("a live sandbox was replaced on a report: %v, was %v", got, ids)
	}
	if got := e.creations(); got != created {
		t.Fatalf("%d creations after the report, want %d", got, created)
	}
}

// A sandbox that died without its worker noticing (here: gone from its
// runtime behind the worker's back) is found by a data plane's report: the
// worker's check reports it EXITED and it is replaced.
func TestUnreachableReportOfDeadSandbox(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	e.deploy("f", 1)
	ids := e.awaitConverged("f", 1)
	if err := e.workers["w0"].inner.Kill(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
	e.reportUnreachable("f", ids[0], e.addrOf("f", ids[0]))
	e.awaitReplaced("f", ids[0])
	after := e.awaitConverged("f", 1)
	if after[0] == ids[0] {
		t.Fatalf("the dead sandbox %s is still routed", ids[0])
	}
	if got := e.verifiesSent("w0"); !slices.Equal(got, ids) {
		t.Fatalf("verifications sent %v, want %v", got, ids)
	}
}

package controlplane

// The deterministic failure suite of docs/reliability.md ("Cases") (issue 5): each test
// drives an in-process cluster (control plane, worker daemons on the emulated
// runtime, a real endpoint stream and data plane) through one failure with
// the faultNet link and asserts the end state: what the runtimes run, what
// the control plane holds and in which state, what the data plane routes to.
// docs/reliability.md maps every case to its test.

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// docs/reliability.md, case 1, "Anomaly #1 (revival): worker W is cut off from the
// CP and evicts sandbox S; the CP reconnects. Expect S marked Invalid at the
// CP, a replacement under a new id, and S never running again on W (a Create
// with S's id is refused)."
func TestAnomaly1RevivalIsPrevented(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2, dataPlane: true})
	e.deploy("f", 3)
	before := e.awaitConverged("f", 3)
	var s, w string
	for _, id := range before {
		if n := e.nodeOf("f", id); n == "w0" {
			s, w = id, n
			break
		}
	}
	if s == "" { // placement spread them; take any
		s = before[0]
		w = e.nodeOf("f", s)
	}
	// The Create that made S, as W received it.
	var create *briskv1.CreateSandbox
	for _, m := range e.net.seenWhere(func(m seenMsg) bool { return m.dir == toWorker }) {
		for _, c := range m.msg.(*briskv1.ToWorker).GetCommands().GetCreates() {
			if c.GetId() == s {
				create = c
			}
		}
	}
	if create == nil {
		t.Fatalf("no Create for %s seen", s)
	}

	e.net.partition(w)
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected(w) }, "control plane notices the cut")
	if err := e.workers[w].rt.evict(s); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool { return !slices.Contains(e.workerIDs(w), s) }, "worker records the eviction")
	mark := e.watch.mark()
	e.heal(w)

	testutil.Eventually(t, wait, func() bool { return e.invalid(w, s) }, "%s marked invalid at the reset handshake", s)
	after := e.awaitConverged("f", 3)
	if slices.Contains(after, s) {
		t.Fatalf("evicted %s is back: %v", s, after)
	}
	fresh := 0
	for _, id := range after {
		if !slices.Contains(before, id) {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("want exactly one replacement under a new id: before %v, after %v", before, after)
	}
	if got := e.creations(); got != 4 {
		t.Fatalf("%d creations, want 3 + 1 replacement", got)
	}

	// A Create for S's id reaching W in the current session (a misbehaving
	// or deposed control plane) is refused: S is in W's terminated set.
	e.net.injectToWorker(w, &briskv1.ToWorker{Epoch: e.net.stream(w).Epoch(), Msg: &briskv1.ToWorker_Commands{
		Commands: &briskv1.Commands{Creates: []*briskv1.CreateSandbox{proto.Clone(create).(*briskv1.CreateSandbox)}}}})
	testutil.Eventually(t, wait, func() bool { return e.workerSent(s, stGone, refused) }, "worker refuses the re-create of %s", s)
	if slices.Contains(e.running(w), s) || slices.Contains(e.workerIDs(w), s) {
		t.Fatalf("%s revived on %s", s, w)
	}
	if _, held := e.cpView("f")[s]; held {
		t.Fatalf("control plane holds %s again", s)
	}
	if e.watch.announcedSince(mark, s) {
		t.Fatalf("%s announced to data planes after its eviction", s)
	}
	if got := e.awaitConverged("f", 3); !slices.Equal(got, after) {
		t.Fatalf("set changed after the refused create: %v, was %v", got, after)
	}
}

// firstOnly returns a rule that gives verdict v to the first message match
// accepts and passes everything else.
func firstOnly(match func(node string, d msgDir, m proto.Message) bool, v verdict) rule {
	done := false
	return func(node string, d msgDir, m proto.Message) verdict {
		if !done && match(node, d, m) {
			done = true
			return v
		}
		return pass
	}
}

func isCreateFor(fn string) func(string, msgDir, proto.Message) bool {
	return func(_ string, d msgDir, m proto.Message) bool {
		return d == toWorker && len(createsFor(m.(*briskv1.ToWorker), fn)) > 0
	}
}

func isTombstone(_ string, d msgDir, m proto.Message) bool {
	return d == toWorker && len(m.(*briskv1.ToWorker).GetCommands().GetTombstones()) > 0
}

// workerSent reports whether the worker sent a record for id in state st
// (with message msg, when msg is not empty).
func (e *env) workerSent(id string, st briskv1.SandboxState, msg string) bool {
	return len(e.net.seenWhere(func(m seenMsg) bool {
		if m.dir != fromWorker || m.verdict == drop || m.verdict == hold || m.verdict == cutBefore {
			return false
		}
		for _, r := range records(m.msg.(*briskv1.FromWorker)) {
			if r.GetId() == id && r.GetState() == st && (msg == "" || r.GetMessage() == msg) {
				return true
			}
		}
		return false
	})) > 0
}

// workerState is node's own record of id (UNSPECIFIED when it holds none).
func (e *env) workerState(node, id string) briskv1.SandboxState {
	for _, r := range e.workers[node].d.Node(node).Snapshot() {
		if r.GetId() == id {
			return r.GetState()
		}
	}
	return briskv1.SandboxState_SANDBOX_STATE_UNSPECIFIED
}

// reconnect cuts node's session and waits for the next handshake to finish.
func (e *env) reconnect(node string) {
	e.t.Helper()
	h := e.handshakes()
	e.net.cut(node)
	testutil.Eventually(e.t, wait, func() bool { return e.handshakes() > h && e.nodeConnected(node) }, "%s reconnects", node)
}

const (
	stCreating = briskv1.SandboxState_SANDBOX_STATE_CREATING
	stReady    = briskv1.SandboxState_SANDBOX_STATE_READY
	stGone     = briskv1.SandboxState_SANDBOX_STATE_GONE
	stTerm     = briskv1.SandboxState_SANDBOX_STATE_TERMINATING
	refused    = "sandbox id was already terminated"
)

// docs/reliability.md, case 3, "Create delivered twice (retransmit after a lost
// ack): exactly one sandbox."
func TestCase3DuplicateCreateMakesOneSandbox(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	rt := e.workers["w0"].rt
	rt.holdCreates() // the ack travels alone, before Ready
	var acks atomic.Int32
	e.net.setRule(func(node string, d msgDir, m proto.Message) verdict {
		if isCreateFor("f")(node, d, m) {
			return dup // delivered twice
		}
		if d == fromWorker && hasRecord(m.(*briskv1.FromWorker), "f", stCreating) && acks.Load() == 0 {
			acks.Add(1)
			return drop // the acknowledgement is lost
		}
		return pass
	})
	e.deploy("f", 1)
	testutil.Eventually(t, wait, func() bool { return acks.Load() == 1 }, "ack lost")
	rt.releaseCreates()
	ids := e.awaitConverged("f", 1)
	s := ids[0]
	dups := e.net.seenWhere(func(m seenMsg) bool {
		return m.verdict == dup && slices.Contains(createsFor(m.msg.(*briskv1.ToWorker), "f"), s)
	})
	if len(dups) != 1 || acks.Load() != 1 {
		t.Fatalf("fault not injected: %d duplicated creates, %d lost acks", len(dups), acks.Load())
	}
	// A third copy arrives late, after the sandbox serves.
	readies := len(e.net.seenWhere(func(m seenMsg) bool {
		return m.dir == fromWorker && hasRecord(m.msg.(*briskv1.FromWorker), "f", stReady)
	}))
	late := proto.Clone(dups[0].msg).(*briskv1.ToWorker)
	late.Epoch = e.net.stream("w0").Epoch()
	e.net.injectToWorker("w0", late)
	testutil.Eventually(t, wait, func() bool { // the worker re-announces S
		return len(e.net.seenWhere(func(m seenMsg) bool {
			return m.dir == fromWorker && hasRecord(m.msg.(*briskv1.FromWorker), "f", stReady)
		})) > readies
	}, "late duplicate answered")

	if got := e.awaitConverged("f", 1); !slices.Equal(got, ids) {
		t.Fatalf("sandboxes %v, want %v", got, ids)
	}
	if n := rt.count("create", ""); n != 1 {
		t.Fatalf("runtime started %d sandboxes for three deliveries of one Create, want 1", n)
	}
	if got := e.workerIDs("w0"); !slices.Equal(got, ids) {
		t.Fatalf("worker holds %v, want %v", got, ids)
	}
	if n := e.creations(); n != 1 {
		t.Fatalf("control plane created %d sandboxes, want 1", n)
	}
}

// docs/reliability.md, case 4, "Create accepted, link drops before Ready: adopted
// at the reset handshake, not duplicated."
func TestCase4CreateAcceptedThenLinkDropsIsAdopted(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	rt := e.workers["w0"].rt
	rt.holdCreates()
	// One of the two acknowledgements is lost as well: that sandbox stays
	// assumed at the control plane, the other pending.
	e.net.setRule(firstOnly(func(_ string, d msgDir, m proto.Message) bool {
		return d == fromWorker && hasRecord(m.(*briskv1.FromWorker), "f", stCreating)
	}, drop))
	e.deploy("f", 2)
	placed := e.cpIDs("f", "assumed")
	if len(placed) != 2 {
		t.Fatalf("placed %v, want 2 assumed", e.cpView("f"))
	}
	testutil.Eventually(t, wait, func() bool {
		return e.workerState("w0", placed[0]) == stCreating && e.workerState("w0", placed[1]) == stCreating
	}, "worker accepts both creates")

	e.net.partition("w0")
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "link drops")
	rt.releaseCreates() // both become ready while the link is down
	testutil.Eventually(t, wait, func() bool {
		return e.workerState("w0", placed[0]) == stReady && e.workerState("w0", placed[1]) == stReady
	}, "sandboxes ready at the worker")
	// The versions differ, so the handshake has a round 2; its answer is
	// held until the worker's first update of the session has gone out.
	e.net.setRule(firstOnly(isFetchAnswer, hold))
	hellos := e.hellos()
	e.heal("w0")
	e.releaseFetchAfterAnUpdate()

	if got := e.awaitConverged("f", 2); !slices.Equal(got, placed) {
		t.Fatalf("after the reset handshake: %v, want the same %v", got, placed)
	}
	if n := e.hellos() - hellos; n != 1 {
		t.Fatalf("%d handshake attempts, want 1", n)
	}
	if n := e.creations(); n != 2 {
		t.Fatalf("control plane created %d sandboxes, want 2", n)
	}
	if n := rt.count("create", ""); n != 2 {
		t.Fatalf("runtime started %d sandboxes, want 2", n)
	}
	for _, id := range placed {
		if e.invalid("w0", id) {
			t.Fatalf("%s marked invalid although the worker runs it", id)
		}
	}
}

// docs/reliability.md, case 5, "Create lost before reaching the worker: id goes
// Invalid, one replacement; a late Create for the old id under the old
// epoch is rejected."
func TestCase5LostCreateIsReplacedAndLateCreateRejected(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	// The worker's transport has the Create, the session breaks before the
	// worker acts on it; it is processed later, after the next handshake.
	e.net.setRule(firstOnly(isCreateFor("f"), hold))
	mark := e.watch.mark()
	e.deploy("f", 1)
	testutil.Eventually(t, wait, func() bool { return e.net.heldCount(nil) == 1 }, "create held")
	s := e.cpIDs("f", "assumed")[0]
	old := e.net.stream("w0")
	e.reconnect("w0")

	testutil.Eventually(t, wait, func() bool { return e.invalid("w0", s) }, "%s invalid", s)
	ids := e.awaitConverged("f", 1)
	if ids[0] == s {
		t.Fatalf("replacement reuses the lost id %s", s)
	}
	e.net.release(nil)
	testutil.Eventually(t, wait, old.finished, "old session's handler processes the late create")

	if slices.Contains(e.running("w0"), s) || slices.Contains(e.workerIDs("w0"), s) {
		t.Fatalf("late Create under the old epoch started %s", s)
	}
	if n := e.workers["w0"].rt.count("create", s); n != 0 {
		t.Fatalf("runtime created %s %d times", s, n)
	}
	if got := e.awaitConverged("f", 1); !slices.Equal(got, ids) {
		t.Fatalf("sandboxes %v, want %v", got, ids)
	}
	if e.watch.announcedSince(mark, s) {
		t.Fatalf("lost %s was announced", s)
	}
	if n := e.creations(); n != 2 {
		t.Fatalf("control plane created %d sandboxes, want 1 + 1 replacement", n)
	}
}

// docs/reliability.md, case 6, "Sandbox start slower than the link/RPC timeout: it
// still completes, no second sandbox."
func TestCase6SlowStartOutlivesTheLink(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	rt := e.workers["w0"].rt
	rt.holdCreates()
	e.deploy("f", 1)
	testutil.Eventually(t, wait, func() bool { return len(e.cpIDs("f", "pending")) == 1 }, "create acknowledged")
	s := e.cpIDs("f", "pending")[0]
	// The start outlives two sessions.
	e.reconnect("w0")
	e.reconnect("w0")
	if st := e.workerState("w0", s); st != stCreating {
		t.Fatalf("%s is %v at the worker, want still creating", s, st)
	}
	rt.releaseCreates()
	if got := e.awaitConverged("f", 1); !slices.Equal(got, []string{s}) {
		t.Fatalf("sandboxes %v, want [%s]", got, s)
	}
	if n := e.creations(); n != 1 {
		t.Fatalf("control plane created %d sandboxes, want 1", n)
	}
	if n := rt.count("create", ""); n != 1 {
		t.Fatalf("runtime started %d sandboxes, want 1", n)
	}
}

// docs/reliability.md, case 7, "Tombstone overtakes Create for the same id: the
// sandbox never starts, and the id ends in the terminated set."
func TestCase7TombstoneOvertakesCreate(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	e.net.setRule(firstOnly(isCreateFor("f"), hold)) // delayed: released after the Tombstone
	mark := e.watch.mark()
	e.deploy("f", 1)
	testutil.Eventually(t, wait, func() bool { return e.net.heldCount(nil) == 1 }, "create held")
	s := e.cpIDs("f", "assumed")[0]
	e.scale("f", 0)
	testutil.Eventually(t, wait, func() bool { return e.workerSent(s, stGone, "") && len(e.cpView("f")) == 0 },
		"tombstone for %s processed and reported", s)
	e.net.release(nil)
	testutil.Eventually(t, wait, func() bool { return e.workerSent(s, stGone, refused) }, "late create refused")

	if n := e.workers["w0"].rt.count("create", s); n != 0 {
		t.Fatalf("%s started %d times", s, n)
	}
	if ids := e.workerIDs("w0"); len(ids) != 0 {
		t.Fatalf("worker holds %v", ids)
	}
	e.awaitConverged("f", 0)
	if e.watch.announcedSince(mark, s) {
		t.Fatalf("%s was announced", s)
	}
	// The id stays in the terminated set: one more Create is refused too.
	refusals := func() int {
		return len(e.net.seenWhere(func(m seenMsg) bool {
			return m.dir == fromWorker && slices.ContainsFunc(records(m.msg.(*briskv1.FromWorker)),
				func(r *briskv1.SandboxRecord) bool { return r.GetId() == s && r.GetMessage() == refused })
		}))
	}
	before := refusals()
	e.net.injectToWorker("w0", &briskv1.ToWorker{Epoch: e.net.stream("w0").Epoch(), Msg: &briskv1.ToWorker_Commands{
		Commands: &briskv1.Commands{Creates: []*briskv1.CreateSandbox{{Id: s, Function: "f", Revision: e.cp.cluster.Spec("f").Revision}}}}})
	testutil.Eventually(t, wait, func() bool { return refusals() > before }, "second create refused")
	if n := e.workers["w0"].rt.count("create", s); n != 0 {
		t.Fatalf("%s started", s)
	}
}

// docs/reliability.md, case 8, "Leader crashes right after a downscale decision
// (Tombstone lost): the new leader adopts, re-decides, and the count
// converges to desired." Here with one replica: the control plane restarts.
func TestCase8RestartAfterDownscaleConverges(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2, dataPlane: true})
	e.deploy("f", 3)
	before := e.awaitConverged("f", 3)
	e.net.setRule(func(_ string, d msgDir, m proto.Message) verdict {
		if isTombstone("", d, m) {
			return drop
		}
		return pass
	})
	e.scale("f", 1) // the decision: two victims, their Tombstones lost
	victims := e.cpIDs("f", "tombstoned")
	if len(victims) != 2 {
		t.Fatalf("downscale tombstoned %v, want 2", e.cpView("f"))
	}
	testutil.Eventually(t, wait, func() bool {
		dropped := 0
		for _, m := range e.net.seenWhere(func(m seenMsg) bool { return m.verdict == drop }) {
			dropped += len(m.msg.(*briskv1.ToWorker).GetCommands().GetTombstones())
		}
		return dropped == 2
	}, "both Tombstones lost")
	// The loss is the crashed leader's: the new one's Tombstones, sent as
	// it starts (no drain delay here), go through.
	e.net.setRule(nil)
	e.restartCP()

	after := e.awaitConverged("f", 1)
	if !slices.Contains(before, after[0]) {
		t.Fatalf("survivor %s is not one of the adopted %v", after[0], before)
	}
	if n := e.creations(); n != 0 {
		t.Fatalf("restarted control plane created %d sandboxes, want 0", n)
	}
	for _, id := range before {
		if id != after[0] && slices.Contains(e.runningAll(), id) {
			t.Fatalf("%s still runs", id)
		}
	}
}

// docs/reliability.md, case 9, "Tombstone delivered, worker restarts before
// killing: no revival; Tombstone dropped once the id is absent."
func TestCase9TombstonedSandboxNotRevivedByWorkerRestart(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	e.deploy("f", 2)
	before := e.awaitConverged("f", 2)
	e.workers["w0"].rt.holdKills() // the daemon dies while killing
	mark := e.watch.mark()
	e.scale("f", 1)
	v := e.cpIDs("f", "tombstoned")[0]
	testutil.Eventually(t, wait, func() bool { return e.workerState("w0", v) == stTerm }, "tombstone delivered")
	e.crashWorker("w0", true)
	if !slices.Contains(e.running("w0"), v) {
		t.Fatalf("%s was killed before the crash", v)
	}
	e.restartWorker("w0") // finds both sandboxes running again

	survivor := e.awaitConverged("f", 1)
	if survivor[0] == v || !slices.Contains(before, survivor[0]) {
		t.Fatalf("survivor %v, want the one of %v that is not %s", survivor, before, v)
	}
	if e.watch.announcedSince(mark, v) {
		t.Fatalf("tombstoned %s announced again", v)
	}
	if n := e.creations(); n != 2 {
		t.Fatalf("%d creations, want 2", n)
	}
	// Once the worker has reported it gone, the control plane holds no
	// Tombstone for it: the next handshake sends none.
	cut := len(e.net.seenWhere(func(seenMsg) bool { return true }))
	e.reconnect("w0")
	e.scale("f", 2) // a marker that travels the same session after any resent Tombstone
	e.awaitConverged("f", 2)
	all := e.net.seenWhere(func(seenMsg) bool { return true })
	for _, m := range all[cut:] {
		if m.dir == toWorker && slices.Contains(m.msg.(*briskv1.ToWorker).GetCommands().GetTombstones(), v) {
			t.Fatalf("tombstone for the absent %s sent again", v)
		}
	}
}

// docs/reliability.md, case 10, "Late Update{Ready} for an Invalid id: ignored,
// never broadcast."
func TestCase10LateReadyForInvalidIDIgnored(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	rt := e.workers["w0"].rt
	rt.holdCreates()
	mark := e.watch.mark()
	e.deploy("f", 1)
	testutil.Eventually(t, wait, func() bool { return len(e.cpIDs("f", "pending")) == 1 }, "create acknowledged")
	s := e.cpIDs("f", "pending")[0]
	e.net.partition("w0")
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "link down")
	rt.releaseCreates()
	testutil.Eventually(t, wait, func() bool { return e.workerState("w0", s) == stReady }, "ready while cut off")
	if err := rt.evict(s); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool { return e.workerState("w0", s) == briskv1.SandboxState_SANDBOX_STATE_UNSPECIFIED }, "evicted")
	e.heal("w0")
	testutil.Eventually(t, wait, func() bool { return e.invalid("w0", s) }, "%s invalid", s)
	e.awaitConverged("f", 1)

	// S's Ready, produced while the link was down, reaches the control
	// plane late, inside the current session (past the epoch fence).
	lateReady := func() {
		err := e.net.injectFromWorker("w0", &briskv1.FromWorker{Epoch: e.net.stream("w0").Epoch(), Msg: &briskv1.FromWorker_Updates{
			Updates: &briskv1.Updates{Records: []*briskv1.SandboxRecord{{Id: s, Function: "f", Revision: e.cp.cluster.Spec("f").Revision,
				State: stReady, Version: 2, Address: e.host.Addr()}}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	lateReady()
	e.scale("f", 2) // marker: its Ready comes after the late one on the same stream
	e.awaitConverged("f", 2)
	// And again one session later: the mark outlives the next handshake.
	e.reconnect("w0")
	lateReady()
	e.scale("f", 3)
	ids := e.awaitConverged("f", 3)

	if slices.Contains(ids, s) {
		t.Fatalf("invalid %s adopted: %v", s, ids)
	}
	if _, ok := e.cpView("f")[s]; ok {
		t.Fatalf("control plane holds invalid %s", s)
	}
	if e.watch.announcedSince(mark, s) {
		t.Fatalf("invalid %s broadcast", s)
	}
	if !e.invalid("w0", s) {
		t.Fatalf("mark for %s dropped", s)
	}
}

// docs/reliability.md, case 11, "Message with an old epoch after a new handshake:
// rejected, state unchanged."
func TestCase11OldEpochMessagesRejected(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	e.deploy("f", 2)
	fIDs := e.awaitConverged("f", 2)
	a := fIDs[0]

	// (a) A Create of the old session, received by the worker's transport
	// before the cut, is processed after the new handshake: refused.
	e.net.setRule(firstOnly(isCreateFor("g"), hold))
	e.deploy("g", 1)
	testutil.Eventually(t, wait, func() bool { return e.net.heldCount(nil) == 1 }, "create held")
	x := e.cpIDs("g", "assumed")[0]
	old := e.net.stream("w0")
	oldEpoch := old.Epoch()
	e.reconnect("w0")
	gIDs := e.awaitConverged("g", 1)
	e.net.release(nil)
	testutil.Eventually(t, wait, old.finished, "old session's handler processes the late create")
	if slices.Contains(e.workerIDs("w0"), x) || e.workers["w0"].rt.count("create", x) != 0 {
		t.Fatalf("create of the old epoch started %s", x)
	}

	// (b) An update carrying the old epoch on the current stream: the
	// control plane ignores it (a is not dropped).
	if err := e.net.injectFromWorker("w0", &briskv1.FromWorker{Epoch: oldEpoch, Msg: &briskv1.FromWorker_Updates{
		Updates: &briskv1.Updates{Records: []*briskv1.SandboxRecord{{Id: a, Function: "f", State: stGone, Version: 99}}}}}); err != nil {
		t.Fatal(err)
	}
	e.scale("g", 2) // marker on the same stream
	gIDs = e.awaitConverged("g", 2)
	if got := e.awaitConverged("f", 2); !slices.Equal(got, fIDs) {
		t.Fatalf("an update of the old epoch changed f: %v, was %v", got, fIDs)
	}

	// (c) A Tombstone carrying the old epoch on the current session: the
	// worker refuses it (and drops that stream as stale).
	cur := e.net.stream("w0")
	e.net.injectToWorker("w0", &briskv1.ToWorker{Epoch: oldEpoch, Msg: &briskv1.ToWorker_Commands{
		Commands: &briskv1.Commands{Tombstones: []string{a}}}})
	testutil.Eventually(t, wait, cur.finished, "worker processes the stale tombstone")
	testutil.Eventually(t, wait, func() bool { return e.nodeConnected("w0") }, "session back")

	if got := e.awaitConverged("f", 2); !slices.Equal(got, fIDs) {
		t.Fatalf("f changed by old-epoch messages: %v, was %v", got, fIDs)
	}
	if got := e.awaitConverged("g", 2); !slices.Equal(got, gIDs) {
		t.Fatalf("g changed: %v, was %v", got, gIDs)
	}
	if e.workers["w0"].rt.count("kill", "") != 0 {
		t.Fatalf("old-epoch tombstone killed something: %v", e.workers["w0"].rt.Events())
	}
}

// docs/reliability.md, case 13, "Handshake cut after round 1 or round 2: the
// retry starts clean, and the CP table equals the worker's set."
func TestCase13HandshakeCutRetriesClean(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	rt := e.workers["w0"].rt
	e.deploy("f", 3)
	before := e.awaitConverged("f", 3)
	rt.holdCreates()
	e.scale("f", 4)
	testutil.Eventually(t, wait, func() bool { return len(e.cpIDs("f", "pending")) == 1 }, "fourth create acknowledged")
	d := e.cpIDs("f", "pending")[0]

	// While the link is down the worker's state moves on: D becomes ready
	// (a version the control plane has not seen, so round 2 is needed) and
	// A is evicted (absent: it must become invalid).
	e.net.partition("w0")
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "link down")
	rt.releaseCreates()
	a := before[0]
	if err := rt.evict(a); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool {
		return e.workerState("w0", d) == stReady && e.workerState("w0", a) == briskv1.SandboxState_SANDBOX_STATE_UNSPECIFIED
	}, "worker state moved on")

	// First attempt: the round-2 request is lost with the connection (cut
	// after round 1). Second attempt: the round-2 answer is lost with the
	// connection (cut after round 2). Third attempt completes.
	// The third attempt's round-2 answer is held until the worker's first
	// update of that session has gone out, so that it comes second.
	var round1, round2 atomic.Int32
	e.net.setRule(func(_ string, d msgDir, m proto.Message) verdict {
		switch {
		case d == toWorker && m.(*briskv1.ToWorker).GetFetch() != nil && round1.Load() == 0:
			round1.Add(1)
			return cutBefore
		case isFetchAnswer("", d, m):
			switch round2.Add(1) {
			case 1:
				return cutBefore
			case 2:
				return hold
			}
		}
		return pass
	})
	h, hellos := e.handshakes(), e.hellos()
	e.heal("w0")
	e.releaseFetchAfterAnUpdate()
	after := e.awaitConverged("f", 4)
	if n := e.hellos() - hellos; n != 3 {
		t.Fatalf("%d handshake attempts, want 3", n)
	}
	if round1.Load() != 1 || round2.Load() != 2 {
		t.Fatalf("cuts injected: after round 1 %d, after round 2 %d", round1.Load(), round2.Load())
	}
	if got := e.handshakes() - h; got != 1 {
		t.Fatalf("%d completed handshakes, want 1 (the two cut ones must not count)", got)
	}
	if !slices.Equal(e.workerIDs("w0"), after) {
		t.Fatalf("worker holds %v, control plane %v", e.workerIDs("w0"), after)
	}
	if !slices.Contains(after, d) || slices.Contains(after, a) || !e.invalid("w0", a) {
		t.Fatalf("after the handshake: %v (want %s adopted, %s invalid)", after, d, a)
	}
	if n := e.creations(); n != 5 {
		t.Fatalf("%d creations, want 4 + 1 replacement", n)
	}
}

// docs/reliability.md, case 14, "Worker daemon restart (new bootID): old
// sandboxes reported gone; leftovers reaped or re-adopted per policy, never
// leaked."
func TestCase14WorkerDaemonRestart(t *testing.T) {
	e := newEnv(t, envOpts{dataPlane: true})
	tw := e.workers["w0"]
	e.deploy("f", 3)
	e.deploy("g", 1)
	before := e.awaitConverged("f", 3)
	gOld := e.awaitConverged("g", 1)[0]
	tw.rt.holdCreates()
	e.scale("f", 4)
	testutil.Eventually(t, wait, func() bool { return len(e.cpIDs("f", "pending")) == 1 }, "fourth create acknowledged")
	d := e.cpIDs("f", "pending")[0]
	mark := e.watch.mark()

	e.crashWorker("w0", false)
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "link down")
	// While no daemon runs: the runtime finishes starting D (a leftover the
	// dead daemon never reported ready), loses C (gone), and g is deleted
	// (G is now a leftover nobody wants).
	tw.dead[0].releaseCreates()
	testutil.Eventually(t, wait, func() bool { return slices.Contains(e.running("w0"), d) }, "D started")
	c := before[2]
	if err := tw.inner.Kill(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if err := e.cp.store.DeleteFunction("g"); err != nil {
		t.Fatal(err)
	}
	e.cp.cluster.RemoveFunction("g")

	e.restartWorker("w0")
	after := e.awaitConverged("f", 4)
	if !slices.Contains(after, d) {
		t.Fatalf("leftover %s not re-adopted: %v", d, after)
	}
	if slices.Contains(after, c) || !e.invalid("w0", c) {
		t.Fatalf("lost %s not invalidated: %v", c, after)
	}
	testutil.Eventually(t, wait, func() bool { return !slices.Contains(e.running("w0"), gOld) }, "leftover %s of deleted g reaped", gOld)
	if got, want := e.runningAll(), after; !slices.Equal(got, want) {
		t.Fatalf("runtime runs %v, control plane knows %v", got, want)
	}
	if !slices.Equal(e.workerIDs("w0"), after) {
		t.Fatalf("worker holds %v, want %v", e.workerIDs("w0"), after)
	}
	if n := e.creations(); n != 5+1 {
		t.Fatalf("%d creations, want 4 + 1 (g) + 1 replacement", n)
	}
	if e.watch.announcedSince(mark, c) || e.watch.announcedSince(mark, gOld) {
		t.Fatal("a lost or reaped sandbox was announced")
	}
}

// docs/reliability.md, case 15, "Teardown half fails (network release): retried
// until Gone; slot/port not reused meanwhile."
func TestCase15TeardownRetriedSlotNotReused(t *testing.T) {
	e := newEnv(t, envOpts{maxSandboxes: 1, dataPlane: true})
	rt := e.workers["w0"].rt
	e.deploy("f", 1)
	s := e.awaitConverged("f", 1)[0]
	var failing atomic.Bool
	failing.Store(true)
	rt.failKills(func(id string, attempt int) error {
		if failing.Load() {
			return errors.New("releasing the sandbox's network: device busy")
		}
		return nil
	})
	e.scale("f", 0)
	e.scale("f", 1) // the node's only slot is still S's
	testutil.Eventually(t, wait, func() bool { return rt.count("kill-failed", s) >= 3 }, "teardown retried")
	if v := e.cpView("f"); len(v) != 1 || v[s] != "tombstoned" {
		t.Fatalf("while S's teardown fails the control plane holds %v, want only %s tombstoned", v, s)
	}
	if n := e.creations(); n != 1 {
		t.Fatalf("replacement placed into the slot of a sandbox still tearing down (%d creations)", n)
	}
	if st := e.workerState("w0", s); st != stTerm {
		t.Fatalf("%s is %v at the worker, want terminating", s, st)
	}
	failing.Store(false)

	ids := e.awaitConverged("f", 1)
	if ids[0] == s {
		t.Fatal("replacement reuses the id")
	}
	ev := rt.Events()
	killed := slices.Index(ev, rtEvent{"kill", s})
	created := slices.Index(ev, rtEvent{"create", ids[0]})
	if killed < 0 || created < killed {
		t.Fatalf("replacement created before %s was torn down: %v", s, ev)
	}
}

// docs/reliability.md, case 16, "Drain mark set, worker returns: every managed
// sandbox killed and reported before any new Create is accepted; no drain
// while the mark is unset."
func TestCase16DrainMark(t *testing.T) {
	const grace = 10 * time.Second
	e := newEnv(t, envOpts{nodes: 2, nodeGrace: grace, dataPlane: true})
	rt := e.workers["w0"].rt
	e.deploy("f", 4)
	before := e.awaitConverged("f", 4)
	old := e.onNode("f", "w0")
	if len(old) == 0 {
		t.Fatalf("nothing placed on w0: %v", before)
	}

	// A blip shorter than the grace period: no mark, no drain.
	e.net.partition("w0")
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "w0 cut off")
	e.advance(grace / 2)
	e.heal("w0")
	if got := e.awaitConverged("f", 4); !slices.Equal(got, before) {
		t.Fatalf("a short blip changed the set: %v, was %v", got, before)
	}
	if n := rt.count("kill", ""); n != 0 {
		t.Fatalf("%d sandboxes killed on w0 without a drain mark", n)
	}

	// Past the grace period: w0 is fenced durably, its sandboxes counted
	// gone, withdrawn and replaced on w1.
	e.net.partition("w0")
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "w0 cut off")
	mark := e.watch.mark()
	e.advance(grace + time.Second)
	testutil.Eventually(t, wait, func() bool { return e.drainMarked("w0") }, "w0's drain mark is durable")
	testutil.Eventually(t, wait, func() bool {
		ready := e.cpIDs("f", "ready")
		return len(e.cpView("f")) == 4 && len(ready) == 4 && sameSet(e.watch.ids("f"), ready) && len(e.onNode("f", "w0")) == 0
	}, "w0's sandboxes replaced on w1")
	for _, id := range old {
		if !e.invalid("w0", id) || slices.Contains(e.watch.ids("f"), id) {
			t.Fatalf("fenced %s still counted or routed", id)
		}
	}
	if !sameSet(e.running("w0"), old) {
		t.Fatalf("w0 (unreachable) should still run %v, runs %v", old, e.running("w0"))
	}

	// w0 returns: it kills everything before it answers the handshake, and
	// only then takes new work (scaling up prefers the now empty w0).
	e.heal("w0")
	testutil.Eventually(t, wait, func() bool { return e.nodeConnected("w0") && !e.drainMarked("w0") }, "drained and unmarked")
	if got := e.running("w0"); len(got) != 0 {
		t.Fatalf("w0 still runs %v after the drain", got)
	}
	e.scale("f", 6)
	e.awaitConverged("f", 6)
	if len(e.onNode("f", "w0")) == 0 {
		t.Fatal("w0 took no new work after its drain")
	}
	ev := rt.Events()
	firstCreate := slices.IndexFunc(ev, func(x rtEvent) bool { return x.op == "create" && !slices.Contains(before, x.id) })
	for _, id := range old {
		if k := slices.Index(ev, rtEvent{"kill", id}); k < 0 || k > firstCreate {
			t.Fatalf("%s not killed before w0's first new create: %v", id, ev)
		}
		if e.watch.announcedSince(mark, id) {
			t.Fatalf("fenced %s announced again", id)
		}
	}
	for _, m := range e.net.seenWhere(func(m seenMsg) bool { return m.node == "w0" && m.dir == fromWorker }) {
		if ack := m.msg.(*briskv1.FromWorker).GetHelloAck(); ack != nil && len(ack.GetVersions()) > 0 && m.stream == e.net.stream("w0") {
			t.Fatalf("drained worker reported %v", ack.GetVersions())
		}
	}
}

// drainMarked reads node's durable record.
func (e *env) drainMarked(node string) bool {
	ws, err := e.cp.store.Workers()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID == node {
			return w.Drain
		}
	}
	return false
}

// docs/reliability.md, case 17, "Desired 10 -> 3 -> 8 in quick succession:
// tombstoned sandboxes never counted as available; final count exactly 8."
func TestCase17RapidRescale(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2, dataPlane: true})
	e.deploy("f", 10)
	before := e.awaitConverged("f", 10)
	e.net.setRule(func(_ string, d msgDir, m proto.Message) verdict {
		if isTombstone("", d, m) {
			return hold // the terminations lag behind
		}
		return pass
	})
	mark := e.watch.mark()
	e.scale("f", 3)
	victims := e.cpIDs("f", "tombstoned")
	if len(victims) != 7 {
		t.Fatalf("10 -> 3 tombstoned %d", len(victims))
	}
	// The Tombstones leave after the drain delay and are held in flight.
	testutil.Eventually(t, wait, func() bool { return sameSet(e.heldTombstones(), victims) }, "tombstones in flight")
	e.scale("f", 8)
	// The seven are still running, but the control plane does not count
	// them: five new sandboxes are placed and become ready at once.
	testutil.Eventually(t, wait, func() bool { return len(e.cpIDs("f", "ready")) == 8 }, "8 ready while 7 tombstones are in flight")
	if n := e.creations(); n != 15 {
		t.Fatalf("%d creations, want 10 + 5", n)
	}
	testutil.Eventually(t, wait, func() bool { return sameSet(e.watch.ids("f"), e.cpIDs("f", "ready")) }, "routes follow")
	e.net.setRule(nil)
	e.net.release(nil)

	after := e.awaitConverged("f", 8)
	for _, v := range victims {
		if slices.Contains(after, v) || e.watch.announcedSince(mark, v) {
			t.Fatalf("tombstoned %s back: %v", v, after)
		}
	}
	kept := 0
	for _, id := range after {
		if slices.Contains(before, id) {
			kept++
		}
	}
	if kept != 3 {
		t.Fatalf("%d of the original sandboxes kept, want 3", kept)
	}
	if n := e.creations(); n != 15 {
		t.Fatalf("%d creations, want 15", n)
	}
}

// docs/reliability.md, case 18, "Data plane reconnects: full endpoint snapshot;
// no Tombstoned/Invalid entries routed."
func TestCase18DataPlaneResync(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2, dataPlane: true})
	e.deploy("f", 3)
	e.deploy("g", 2)
	e.awaitConverged("f", 3)
	gOld := e.awaitConverged("g", 2)

	e.dpProxy.setDown(true) // the data plane loses the control plane
	// Meanwhile: f scales down (Tombstones held, the victims still run and
	// would still answer), one of g's sandboxes is lost while its worker is
	// cut off (invalid at the reset handshake), h is deployed.
	e.net.setRule(func(_ string, d msgDir, m proto.Message) verdict {
		if isTombstone("", d, m) {
			return hold
		}
		return pass
	})
	e.scale("f", 1)
	testutil.Eventually(t, wait, func() bool { return sameSet(e.heldTombstones(), e.cpIDs("f", "tombstoned")) }, "tombstones in flight")
	lost := gOld[0]
	node := e.nodeOf("g", lost)
	e.net.partition(node)
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected(node) }, "cut off")
	if err := e.workers[node].rt.evict(lost); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool { return !slices.Contains(e.workerIDs(node), lost) }, "evicted")
	e.heal(node)
	testutil.Eventually(t, wait, func() bool { return e.invalid(node, lost) }, "%s invalid", lost)
	e.deploy("h", 1)
	testutil.Eventually(t, wait, func() bool {
		return len(e.cpIDs("g", "ready")) == 2 && len(e.cpIDs("h", "ready")) == 1 && len(e.cpIDs("f", "ready")) == 1
	}, "control plane settles: f %v, g %v, h %v", lazy(func() any { return e.cpView("f") }), lazy(func() any { return e.cpView("g") }), lazy(func() any { return e.cpView("h") }))

	e.dpProxy.setDown(false) // reconnect: a full snapshot
	for _, fn := range []string{"f", "g", "h"} {
		want := e.cpIDs(fn, "ready")
		testutil.Eventually(t, wait, func() bool {
			got, ok := e.dpRoutes(fn, len(want))
			return ok && slices.Equal(got, want)
		}, "%s: data plane routes %v, want %v", fn, lazy(func() any { got, _ := e.dpRoutes(fn, len(want)); return got }), want)
	}
	// The tombstoned f sandboxes still run (their Tombstones are held), yet
	// the data plane does not route to them; then they go.
	if len(e.runningOf("f")) != 3 {
		t.Fatalf("f's victims should still run: %v", e.runningOf("f"))
	}
	e.net.setRule(nil)
	e.net.release(nil)
	e.awaitConverged("f", 1)
	if got := e.awaitConverged("g", 2); slices.Contains(got, lost) {
		t.Fatalf("invalid %s routed", lost)
	}
	e.awaitConverged("h", 1)
}

// heldTombstones lists the ids of the Tombstones the link holds.
func (e *env) heldTombstones() []string {
	var ids []string
	e.net.heldCount(func(h *heldMsg) bool {
		if h.dir == toWorker {
			ids = append(ids, h.msg.(*briskv1.ToWorker).GetCommands().GetTombstones()...)
		}
		return false
	})
	return ids
}

func isFetchAnswer(_ string, d msgDir, m proto.Message) bool {
	return d == fromWorker && m.(*briskv1.FromWorker).GetFetch() != nil
}

// releaseFetchAfterAnUpdate waits until the link holds a round-2 answer and
// the worker has sent an update on the same session after it (its sender
// starts right after round 1), then releases the answer: the control plane
// sees the update first, as it often does without help.
func (e *env) releaseFetchAfterAnUpdate() {
	e.t.Helper()
	testutil.Eventually(e.t, wait, func() bool {
		var s *wstream
		e.net.heldCount(func(h *heldMsg) bool {
			if isFetchAnswer("", h.dir, h.msg) {
				s = h.s
			}
			return false
		})
		return s != nil && len(e.net.seenWhere(func(m seenMsg) bool {
			return m.stream == s && m.dir == fromWorker && m.msg.(*briskv1.FromWorker).GetUpdates() != nil
		})) > 0
	}, "round-2 answer held and an update sent")
	e.net.release(nil)
}

// hellos counts the handshakes the control plane has started.
func (e *env) hellos() int {
	return len(e.net.seenWhere(func(m seenMsg) bool { return m.dir == toWorker && m.msg.(*briskv1.ToWorker).GetHello() != nil }))
}

// Issue 5: a worker that stops heartbeating (hung or silently partitioned:
// no connection error) is taken out of load balancing at once, long before
// the node grace period, without churning its sandboxes; when it answers
// again the same sandboxes are routed again, and nothing was created.
func TestSilentWorkerIsWithdrawnAtOnceAndRestored(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2, dataPlane: true, hbTimeout: 300 * time.Millisecond})
	e.deploy("f", 4)
	all := e.awaitConverged("f", 4)
	onW0 := e.onNode("f", "w0")
	if len(onW0) == 0 || len(onW0) == 4 {
		t.Fatalf("placement %v: want sandboxes on both nodes", all)
	}
	if got, ok := e.dpRoutes("f", 4); !ok || !slices.Equal(got, all) {
		t.Fatalf("data plane routes to %v (ok %v), want %v", got, ok, all)
	}
	creations := e.creations()

	// w0 goes silent: its messages are lost, its connection stays up.
	e.net.setRule(func(node string, d msgDir, _ proto.Message) verdict {
		if node == "w0" && d == fromWorker {
			return drop
		}
		return pass
	})
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "w0's session ended for missed heartbeats")
	testutil.Eventually(t, wait, func() bool {
		got, ok := e.dpRoutes("f", 4)
		return ok && slices.Equal(got, e.onNode("f", "w1"))
	}, "data plane routes only to w1's sandboxes")
	if got := e.cpIDs("f", "ready"); !slices.Equal(got, all) {
		t.Fatalf("within the grace period the control plane holds %v, want the same %v (no replacement yet)", got, all)
	}

	// w0 answers again: the same sandboxes come back, none was made.
	e.net.setRule(nil)
	e.kick("w0")
	testutil.Eventually(t, wait, func() bool { return e.nodeConnected("w0") }, "w0 back")
	testutil.Eventually(t, wait, func() bool {
		got, ok := e.dpRoutes("f", 4)
		return ok && slices.Equal(got, all)
	}, "data plane routes to all four again")
	if n := e.creations() - creations; n != 0 {
		t.Fatalf("%d sandboxes created for a worker that came back within the grace period", n)
	}
	if got := e.running("w0"); !slices.Equal(got, onW0) {
		t.Fatalf("w0 runs %v, want %v", got, onW0)
	}
}

// docs/reliability.md, case 2, anomaly #2 (double placement): S runs on W; the
// control plane restarts (a new leader) and reaches every worker but W.
// Expect W fenced (a durable drain mark) before anything is placed, exactly
// one replacement for S, S killed when W returns and before W takes work,
// and never two routable sandboxes for one slot.
func TestAnomaly2DoublePlacementIsPrevented(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2, dataPlane: true})
	e.deploy("f", 2)
	before := e.awaitConverged("f", 2)
	onW0 := e.onNode("f", "w0")
	if len(onW0) != 1 {
		t.Fatalf("placement %v: want one sandbox per node", before)
	}
	s := onW0[0]

	e.net.partition("w0")
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "w0 cut off")
	e.restartCP() // the new leader knows nothing of S; w0 does not answer
	mark := e.watch.mark()
	testutil.Eventually(t, 3*wait, func() bool { return e.drainMarked("w0") }, "w0 fenced after the startup grace")
	testutil.Eventually(t, wait, func() bool {
		ready := e.cpIDs("f", "ready")
		return len(ready) == 2 && len(e.cpView("f")) == 2 && sameSet(e.watch.ids("f"), ready)
	}, "one replacement placed on w1")
	if n := e.creations(); n != 1 {
		t.Fatalf("new control plane created %d sandboxes, want exactly 1 replacement", n)
	}
	if slices.Contains(e.watch.ids("f"), s) {
		t.Fatalf("S %s routed while its worker is fenced", s)
	}

	// W returns: it drains S before answering; S is never announced again
	// and never counted with its replacement.
	e.heal("w0")
	e.kick("w0")
	testutil.Eventually(t, wait, func() bool { return e.nodeConnected("w0") && !e.drainMarked("w0") }, "w0 drained and unmarked")
	if got := e.running("w0"); len(got) != 0 {
		t.Fatalf("w0 still runs %v after the drain", got)
	}
	if e.watch.announcedSince(mark, s) {
		t.Fatalf("S %s announced again after the new leader took over", s)
	}
	after := e.awaitConverged("f", 2)
	if slices.Contains(after, s) || e.creations() != 1 {
		t.Fatalf("after W returned: sandboxes %v, %d creations; want S gone and still 1 creation", after, e.creations())
	}
}

// docs/reliability.md, case 12, split brain: a new leader (term 2) takes the
// worker over while the deposed leader (term 1) still runs and keeps trying.
// The worker refuses every session of term 1 from then on, so the deposed
// leader's scale-up never reaches it; the new leader adopts what runs and
// its decisions win.
func TestCase12SplitBrainDeposedLeaderIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{term: 1})
	e.deploy("f", 2)
	old := e.awaitConverged("f", 2)
	created := e.creations()

	// The new leader, with its own copy of the registry (as a raft replica
	// has), learns of the worker and recovers it.
	cfg := e.cpConfig("127.0.0.1:0")
	cfg.DataDir, cfg.Term, cfg.Clock, cfg.WorkerLinkInterceptor = t.TempDir(), 2, nil, nil
	cp2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cp2.Run(ctx); close(done) }()
	e.onStop(func() { cancel(); <-done })
	<-cp2.Ready()
	f := *e.cp.cluster.Spec("f")
	if _, err := cp2.store.CreateFunction(&f); err != nil {
		t.Fatal(err)
	}
	cp2.cluster.UpsertFunction(&f)
	if _, err := cp2.RegisterWorker(ctx, &briskv1.RegisterWorkerRequest{NodeId: "w0", Address: e.workers["w0"].d.Addr(),
		Capacity: &briskv1.Resources{MilliCpu: 2000, MemoryMb: 2048}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool {
		st, _ := cp2.cluster.functionStatus("f")
		return connected(cp2, 1) && st.Ready == 2
	}, "the new leader recovers both sandboxes")
	if n := testutilCounter(cp2); n != 0 {
		t.Fatalf("the new leader created %d sandboxes while recovering, want 0", n)
	}

	// The deposed leader keeps redialling and deciding: refused by term.
	testutil.Eventually(t, wait, func() bool { return !e.nodeConnected("w0") }, "the deposed leader's session superseded")
	e.kick("w0")
	e.scale("f", 4)
	// The new leader's decision wins.
	f3 := f // a new value: cp2 holds &f
	f3.Scaling.Min, f3.Scaling.Max = 3, 3
	if err := cp2.store.UpdateFunction(&f3); err != nil {
		t.Fatal(err)
	}
	cp2.cluster.UpsertFunction(&f3)
	testutil.Eventually(t, wait, func() bool { return len(e.running("w0")) == 3 }, "worker runs the new leader's 3")
	for _, id := range old {
		if !slices.Contains(e.running("w0"), id) {
			t.Fatalf("adopted %s no longer runs: %v", id, e.running("w0"))
		}
	}
	if e.nodeConnected("w0") {
		t.Fatal("the deposed leader got a session back")
	}
	if got := e.running("w0"); len(got) != 3 {
		t.Fatalf("worker runs %v, want the new leader's 3 (the deposed leader wanted 4)", got)
	}
	if n := e.creations() - created; n != 0 {
		t.Fatalf("the deposed leader created %d sandboxes after it was superseded", n)
	}
}

// Requests queued with every slot busy get sandboxes at once: an urgent
// report saying 3 are waiting for a function at 1 busy sandbox (concurrency
// 1) scales it to 4 right away, and the next autoscaler ticks, which have no
// load samples for it, keep the 4 (held for a stable window).
func TestQueuedRequestsGetSandboxesAtOnce(t *testing.T) {
	e := newEnv(t, envOpts{})
	f := &spec.Function{Name: "q", Builtin: "trace", Scaling: spec.Scaling{Min: 1, Max: 10},
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 64}}
	f.ApplyDefaults()
	f.Revision = e.cp.admin.NextRevision()
	if _, err := e.cp.store.CreateFunction(f); err != nil {
		t.Fatal(err)
	}
	e.cp.cluster.UpsertFunction(f)
	e.awaitConverged("q", 1)
	if _, err := e.cp.ReportMetrics(context.Background(), &briskv1.MetricsReport{DataPlaneId: "dp", Urgent: true,
		Functions: []*briskv1.FunctionMetric{{Function: "q", Queued: 3, NoCapacity: true}}}); err != nil {
		t.Fatal(err)
	}
	e.awaitConverged("q", 4)
	e.advance(5 * time.Second) // ticks without load
	if got := e.awaitConverged("q", 4); len(got) != 4 {
		t.Fatalf("after ticks without load: %v, want the 4 kept", got)
	}
	// The same report again (the same requests still waiting, now with
	// sandboxes being made for them) asks for nothing more.
	if _, err := e.cp.ReportMetrics(context.Background(), &briskv1.MetricsReport{DataPlaneId: "dp", Urgent: true,
		Functions: []*briskv1.FunctionMetric{{Function: "q", Queued: 0, NoCapacity: true}}}); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.cp.cluster.functionStatus("q"); st.Desired != 4 {
		t.Fatalf("desired %d after a report with nothing queued, want 4", st.Desired)
	}
}

// A control plane that stops (shut down, or a leader deposed) must not tell
// the data planes to withdraw every endpoint on its way out: its worker
// sessions end because it stops, not because the workers are gone, and data
// planes keep routing on what they have until the next leader's snapshot.
func TestStoppingControlPlaneKeepsEndpointsRouted(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 2})
	e.deploy("f", 3)
	all := e.awaitConverged("f", 3)
	e.stopCP()
	if got := e.watch.ids("f"); !sameSet(got, all) {
		t.Fatalf("after the control plane stopped, the endpoint stream left %v routed, want %v", got, all)
	}
}

// The drain delay between an endpoint's withdrawal and its sandbox's
// Tombstone runs on the cluster's clock (issue 39: it ran on
// time.AfterFunc, out of reach of the clock every other delay uses): no
// Tombstone goes out until the clock has moved by the delay.
func TestDrainDelayRunsOnTheClusterClock(t *testing.T) {
	e := newEnv(t, envOpts{nodes: 1, drainDelay: time.Minute})
	e.deploy("f", 2)
	e.awaitConverged("f", 2)
	e.scale("f", 1)
	if v := e.cpIDs("f", "tombstoned"); len(v) != 1 {
		t.Fatalf("downscale tombstoned %v, want 1", e.cpView("f"))
	}
	sent := func() int {
		n := 0
		for _, m := range e.net.seenWhere(func(m seenMsg) bool { return isTombstone("", m.dir, m.msg) }) {
			n += len(m.msg.(*briskv1.ToWorker).GetCommands().GetTombstones())
		}
		return n
	}
	e.clk.Advance(59 * time.Second)
	if n := sent(); n != 0 {
		t.Fatalf("%d Tombstones sent before the drain delay passed on the clock", n)
	}
	e.clk.Advance(time.Second)
	testutil.Eventually(t, wait, func() bool { return sent() == 1 }, "the Tombstone once the clock passed the delay")
	e.awaitConverged("f", 1)
}

package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// terminatedTTL bounds how long a terminated id is remembered. It must exceed
// the longest control-plane session that could still carry a Create for it.
const terminatedTTL = 30 * time.Minute

type specKey struct {
	name string
	rev  uint64
}

// sandbox is the worker's authoritative record of one sandbox.
type sandbox struct {
	rec      *briskv1.SandboxRecord // state, version, address; copied out on send
	spec     *spec.Function
	cancel   context.CancelFunc // stops a creation in progress
	started  time.Time
	inst     *runtime.Instance
	killing  bool
	resource spec.Resources
}

// Node is one worker node: a sandbox table, the current session epoch and a
// runtime. Several Nodes can share one process (emulated scale tests).
type Node struct {
	id       string
	bootID   string
	rt       runtime.Runtime
	emRT     runtime.Runtime // the emergency track's; rt unless set apart
	capacity spec.Resources
	max      int
	log      *slog.Logger
	createTO time.Duration
	dial     func(context.Context, string) error // verify's connect (tests replace it)
	lang     *lang.Manager                       // code functions' runners; nil: none

	egressMu   sync.Mutex // orders the sessions' egress policies (apply)
	mu         sync.Mutex
	epoch      uint64
	term       uint64 // highest control-plane leadership term seen
	sandboxes  map[string]*sandbox
	terminated map[string]time.Time
	specs      map[specKey]*spec.Function
	pending    []*briskv1.SandboxRecord // updates not yet sent
	notify     chan struct{}            // signalled when pending grows
	used       spec.Resources           // regular sandboxes'
	em         emergencyState           // the emergency track (emergency.go)
	lastLive   time.Time                // last time a session was connected
	connected  bool
	// stopped closes when the node stops (Stop): a kill still being
	// retried then gives up, leaving the sandbox to the next worker's
	// recovery (adopt), instead of holding the exit forever.
	stopped  chan struct{}
	stopOnce sync.Once
}

func newNode(id, bootID string, rt runtime.Runtime, capacity spec.Resources, max int, createTimeout time.Duration, log *slog.Logger) *Node {
	return &Node{
		id: id, bootID: bootID, rt: rt, emRT: rt, capacity: capacity, max: max, createTO: createTimeout,
		log:        log.With("node", id),
		dial:       runtime.DialTCP,
		sandboxes:  make(map[string]*sandbox),
		terminated: make(map[string]time.Time),
		specs:      make(map[specKey]*spec.Function),
		notify:     make(chan struct{}, 1),
		stopped:    make(chan struct{}),
	}
}

// runtimes are the node's runtimes: the regular one, then the emergency
// track's when it is another.
func (n *Node) runtimes() []runtime.Runtime {
	if n.emRT == n.rt {
		return []runtime.Runtime{n.rt}
	}
	return []runtime.Runtime{n.rt, n.emRT}
}

// adopt takes over sandboxes a runtime still runs from an earlier daemon
// process, so a daemon restart does not lose them, and kills the emergency
// sandboxes whose calls died with it.
func (n *Node) adopt(ctx context.Context) {
	var listed []runtime.Listed
	for _, rt := range n.runtimes() {
		l, err := rt.List(ctx)
		if err != nil {
			n.log.Warn("listing sandboxes left by an earlier worker", "runtime", rt.Name(), "err", err)
			continue
		}
		for _, s := range l {
			switch {
			case strings.HasPrefix(s.ID, EmergencyPrefix):
				n.killLeftover(ctx, rt, s.ID, "an emergency sandbox (its call died with the earlier worker)")
			case rt != n.rt:
			case !s.Running:
				// A creation the earlier worker did not finish (a Pod
				// still Pending) or a sandbox that ended: nobody would
				// finish, watch or remove it. The control plane asks
				// again if it still needs the sandbox.
				n.killLeftover(ctx, rt, s.ID, "a sandbox not running")
			default:
				listed = append(listed, s)
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range listed {
		sb := &sandbox{
			rec: &briskv1.SandboxRecord{Id: l.ID, Function: l.Function, Revision: l.Revision,
				State: briskv1.SandboxState_SANDBOX_STATE_READY, Version: 1, Address: l.Addr},
			started: time.Now(),
		}
		n.sandboxes[l.ID] = sb
		// Watched for exit like one this worker started: a death goes the
		// EXITED way and the control plane replaces it.
		watched := false
		if w, ok := n.rt.(runtime.Watcher); ok {
			if exited, why, ok := w.Watch(l.ID); ok {
				sb.inst = &runtime.Instance{ID: l.ID, Addr: l.Addr, Exited: exited, ExitErr: why}
				go n.watchExit(sb, sb.inst)
				watched = true
			}
		}
		n.log.Info("adopted running sandbox", "sandbox", l.ID, "function", l.Function, "exit_watched", watched)
	}
}

// killLeftover removes a sandbox an earlier worker left that is not
// adopted.
func (n *Node) killLeftover(ctx context.Context, rt runtime.Runtime, id, what string) {
	if err := rt.Kill(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		n.log.Warn("removing a sandbox left by an earlier worker", "sandbox", id, "what", what, "err", err)
	}
}

// emitLocked bumps the sandbox's version and queues its record for the
// control plane.
func (n *Node) emitLocked(sb *sandbox) {
	sb.rec.Version++
	n.pending = append(n.pending, cloneRecord(sb.rec))
	n.signalLocked()
}

// signalLocked wakes the sender: pending has grown.
func (n *Node) signalLocked() {
	select {
	case n.notify <- struct{}{}:
	default:
	}
}

func cloneRecord(r *briskv1.SandboxRecord) *briskv1.SandboxRecord {
	return &briskv1.SandboxRecord{Id: r.Id, Function: r.Function, Revision: r.Revision, State: r.State,
		Version: r.Version, Address: r.Address, Message: r.Message, CreateUs: r.CreateUs, StartUs: r.StartUs}
}

// install starts a new session: later messages with another epoch are
// ignored. It returns the handshake answer.
// admit reports whether a session of leadership term may take over: a
// deposed leader (lower term than one already seen) that has not noticed yet
// must not command the node, nor drain it.
func (n *Node) admit(term uint64) (bool, uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if term < n.term {
		return false, n.term
	}
	n.term = term
	return true, term
}

func (n *Node) install(ctx context.Context, h *briskv1.Hello) *briskv1.HelloAck {
	if h.GetDrain() {
		n.drain(ctx)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.epoch = h.GetEpoch()
	n.pending = nil // the handshake is a full sync
	n.connected = true
	n.lastLive = time.Now()
	n.pruneTerminatedLocked()
	ack := &briskv1.HelloAck{NodeId: n.id, BootId: n.bootID}
	for id, sb := range n.sandboxes {
		ack.Versions = append(ack.Versions, &briskv1.SandboxVersion{Id: id, Version: sb.rec.Version})
		if h.GetMode() == briskv1.HandshakeMode_HANDSHAKE_MODE_RECOVER {
			ack.Records = append(ack.Records, cloneRecord(sb.rec))
		}
	}
	return ack
}

// drain kills every sandbox before the node takes new work: the control
// plane fenced this node while it was unreachable and replaced them.
func (n *Node) drain(ctx context.Context) {
	n.mu.Lock()
	ids := make([]string, 0, len(n.sandboxes))
	for id := range n.sandboxes {
		ids = append(ids, id)
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); n.terminate(ctx, id, "node drained") }()
	}
	wg.Wait()
}

func (n *Node) disconnected(epoch uint64) {
	n.mu.Lock()
	if n.epoch == epoch {
		n.connected = false
		n.lastLive = time.Now()
	}
	n.mu.Unlock()
}

func (n *Node) fetch(ids []string) *briskv1.FetchResponse {
	n.mu.Lock()
	defer n.mu.Unlock()
	resp := &briskv1.FetchResponse{}
	for _, id := range ids {
		if sb, ok := n.sandboxes[id]; ok {
			resp.Records = append(resp.Records, cloneRecord(sb.rec))
		}
	}
	return resp
}

// apply executes one batch of commands if it belongs to the current session
// and reports whether it did. The epoch is checked under the lock that
// install takes: a check made before the call (as the session loop does)
// can be overtaken by a newer handshake, and a Create of the old session
// would then start a sandbox the new session's handshake never reported.
func (n *Node) apply(ctx context.Context, epoch uint64, c *briskv1.Commands) bool {
	n.mu.Lock()
	if n.epoch != epoch {
		n.mu.Unlock()
		return false
	}
	for _, p := range c.GetSpecs() {
		f := specpb.FromProto(p)
		k := specKey{f.Name, f.Revision}
		if _, seen := n.specs[k]; !seen && f.Code != nil {
			go n.prewarm(ctx, f)
		}
		n.specs[k] = f
	}
	var starts []*sandbox
	for _, cr := range c.GetCreates() {
		if sb := n.acceptLocked(cr); sb != nil {
			starts = append(starts, sb)
		}
	}
	n.mu.Unlock()
	if e := c.GetEgress(); e != nil {
		// Before the creates it governs start; never a superseded
		// session's over a newer one's (which waits for egressMu).
		n.egressMu.Lock()
		if n.currentEpoch() == epoch {
			n.setEgress(e)
		}
		n.egressMu.Unlock()
	}
	for _, sb := range starts {
		go n.create(ctx, sb)
	}
	for _, id := range c.GetTombstones() {
		go n.terminate(ctx, id, "tombstone")
	}
	for _, id := range c.GetVerify() {
		go n.verify(ctx, id)
	}
	return true
}

// setEgress hands the namespaces' egress policies to the runtimes that
// enforce them. A failure is logged: sandboxes then stay under the policies
// their runtime had (none, for a namespace it never had one for).
func (n *Node) setEgress(e *briskv1.EgressPolicies) {
	policies := specpb.EgressFromProto(e)
	for _, rt := range n.runtimes() {
		if en, ok := rt.(runtime.EgressEnforcer); ok {
			if err := en.SetEgress(policies); err != nil {
				n.log.Error("namespaces' egress policies not applied", "runtime", rt.Name(), "err", err)
			} else {
				n.log.Info("namespaces' egress policies applied", "runtime", rt.Name(), "namespaces", len(policies))
			}
		}
	}
}

// acceptLocked admits a Create idempotently. It returns the sandbox to start,
// or nil when the create is a duplicate or refused (the answer is emitted).
func (n *Node) acceptLocked(cr *briskv1.CreateSandbox) *sandbox {
	id := cr.GetId()
	if sb, ok := n.sandboxes[id]; ok { // duplicate delivery: re-announce
		n.pending = append(n.pending, cloneRecord(sb.rec))
		n.signalLocked() // now, not with the next heartbeat
		return nil
	}
	rec := &briskv1.SandboxRecord{Id: id, Function: cr.GetFunction(), Revision: cr.GetRevision()}
	if _, dead := n.terminated[id]; dead { // never revive a terminated id
		rec.State, rec.Message = briskv1.SandboxState_SANDBOX_STATE_GONE, "sandbox id was already terminated"
		n.emitLocked(&sandbox{rec: rec})
		return nil
	}
	f := n.specs[specKey{cr.GetFunction(), cr.GetRevision()}]
	if f == nil {
		rec.State, rec.Message = briskv1.SandboxState_SANDBOX_STATE_FAILED, fmt.Sprintf("function %s revision %d unknown to the worker", cr.GetFunction(), cr.GetRevision())
		n.terminated[id] = time.Now()
		n.emitLocked(&sandbox{rec: rec})
		return nil
	}
	rec.State = briskv1.SandboxState_SANDBOX_STATE_CREATING
	sb := &sandbox{rec: rec, spec: f, started: time.Now(), resource: f.Resources}
	n.sandboxes[id] = sb
	n.used.MilliCPU += f.Resources.MilliCPU
	n.used.MemoryMB += f.Resources.MemoryMB
	n.emitLocked(sb)
	return sb
}

// create starts a sandbox detached from the RPC that asked for it, under its
// own timeout, and reports Ready, Failed or Exited.
func (n *Node) create(parent context.Context, sb *sandbox) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), n.createTO)
	n.mu.Lock()
	if sb.killing {
		n.mu.Unlock()
		cancel()
		return
	}
	sb.cancel = cancel
	n.mu.Unlock()
	defer cancel()

	rs, err := n.prepare(ctx, n.rt, runtime.Spec{ID: sb.rec.Id, Function: sb.spec})
	var inst *runtime.Instance
	if err == nil {
		inst, err = n.rt.Create(ctx, rs)
	}
	startUs := time.Since(sb.started).Microseconds() // creation; the rest until Ready is readiness
	if err == nil {
		n.mu.Lock()
		sb.inst = inst
		n.mu.Unlock()
		if !inst.Ready {
			err = runtime.WaitReady(ctx, inst.Addr, inst.Exited)
		}
		if err != nil && inst.Exited != nil && inst.ExitErr != nil {
			select {
			case <-inst.Exited:
				err = fmt.Errorf("exited while starting: %v%s", inst.ExitErr(), n.lastWords(n.rt, sb))
			default:
			}
		}
	}
	n.mu.Lock()
	if sb.killing { // tombstoned while starting: terminate owns the record
		n.mu.Unlock()
		if inst != nil {
			// terminate's Kill may have run before the runtime knew the
			// sandbox (ErrNotFound, counted as gone): what this creation
			// started must not run on unaccounted.
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(parent), 30*time.Second)
			if err := n.rt.Kill(kctx, sb.rec.Id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
				n.log.Warn("killing a sandbox tombstoned while it started", "sandbox", sb.rec.Id, "err", err)
			}
			kcancel()
		}
		return
	}
	// The creation is over: its context need not live as long as the
	// sandbox (three objects per sandbox for every collection to mark).
	sb.cancel = nil
	if err != nil {
		sb.killing = true
		sb.rec.State, sb.rec.Message = briskv1.SandboxState_SANDBOX_STATE_FAILED, err.Error()
		n.finishLocked(sb)
		n.mu.Unlock()
		n.cleanup(sb.rec.Id)
		n.log.Warn("sandbox failed to start", "sandbox", sb.rec.Id, "function", sb.rec.Function, "err", err)
		return
	}
	sb.rec.State, sb.rec.Address = briskv1.SandboxState_SANDBOX_STATE_READY, inst.Addr
	sb.rec.CreateUs, sb.rec.StartUs = time.Since(sb.started).Microseconds(), startUs
	n.emitLocked(sb)
	n.mu.Unlock()
	if inst.Exited != nil {
		go n.watchExit(sb, inst)
	}
}

// prepare resolves what rt is to start for s: a code function's runner
// (package lang) on runtimes that run commands; other specs as they are.
func (n *Node) prepare(ctx context.Context, rt runtime.Runtime, s runtime.Spec) (runtime.Spec, error) {
	if s.Function.Code == nil || rt.Name() == "emulated" {
		return s, nil
	}
	var t lang.Target
	switch rt.Name() {
	case "process", "native":
	case "containerd":
		// Images only: the language's base image, built here.
		imp, ok := rt.(ImageImporter)
		if !ok {
			return s, errors.New("the containerd runtime imports no images")
		}
		t.Import = imp.ImportImage
	default:
		return s, fmt.Errorf("the %s runtime does not run functions deployed from source (%s): use the process, native or containerd runtime", rt.Name(), s.Function.Code.Language)
	}
	if n.lang == nil {
		return s, errors.New("this worker keeps no code for functions deployed from source (it has no state directory)")
	}
	m, ok := rt.(runtime.Mounter)
	t.Mount = ok && m.CanMount()
	return n.lang.Prepare(ctx, s, t)
}

// prewarm has the node's runtimes make f's template (runtime.Prewarmer)
// as soon as the control plane offers it, before any of its sandboxes.
func (n *Node) prewarm(ctx context.Context, f *spec.Function) {
	for _, rt := range n.runtimes() {
		p, ok := rt.(runtime.Prewarmer)
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.createTO)
		s, err := n.prepare(ctx, rt, runtime.Spec{ID: "prewarm", Function: f})
		cancel()
		if err != nil {
			n.log.Debug("no template for function", "function", f.Name, "err", err)
			continue
		}
		p.Prewarm(s)
	}
}

// lastWords is the end of a sandbox's log, for the message of a sandbox
// that exited while starting (a language runner's "cannot load handler"
// line, a traceback's last line), or "" when rt keeps no logs.
func (n *Node) lastWords(rt runtime.Runtime, sb *sandbox) string {
	lk, ok := rt.(LogKeeper)
	if !ok {
		return ""
	}
	lines := lastLines(filepath.Join(lk.LogDir(), sb.rec.GetFunction(), sb.rec.GetId()+".log"), 3)
	var keep []string
	for _, l := range lines {
		if l = strings.TrimSpace(l); l != "" {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 {
		return ""
	}
	out := strings.Join(keep, " | ")
	if len(out) > 600 {
		out = "..." + out[len(out)-600:]
	}
	return "; its output ends: " + out
}

// watchExit reports a sandbox that dies on its own (crash, OOM, exit).
func (n *Node) watchExit(sb *sandbox, inst *runtime.Instance) {
	<-inst.Exited
	n.mu.Lock()
	if sb.killing {
		n.mu.Unlock()
		return
	}
	sb.killing = true
	msg := "exited"
	if inst.ExitErr != nil {
		if err := inst.ExitErr(); err != nil {
			msg = err.Error()
		}
	}
	sb.rec.State, sb.rec.Message = briskv1.SandboxState_SANDBOX_STATE_EXITED, msg
	n.finishLocked(sb)
	n.mu.Unlock()
	n.cleanup(sb.rec.Id)
	n.log.Warn("sandbox exited", "sandbox", sb.rec.Id, "function", sb.rec.Function, "reason", msg)
}

// finishLocked removes a sandbox from the table for good and emits its
// terminal record.
func (n *Node) finishLocked(sb *sandbox) {
	if _, ok := n.sandboxes[sb.rec.Id]; ok {
		delete(n.sandboxes, sb.rec.Id)
		n.used.MilliCPU -= sb.resource.MilliCPU
		n.used.MemoryMB -= sb.resource.MemoryMB
	}
	n.terminated[sb.rec.Id] = time.Now()
	n.emitLocked(sb)
}

// cleanup releases whatever the runtime still holds for a finished sandbox.
func (n *Node) cleanup(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := n.rt.Kill(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		n.log.Warn("cleaning up sandbox", "sandbox", id, "err", err)
	}
}

// terminate is the Tombstone path: irreversible, retried until the runtime
// has released everything.
func (n *Node) terminate(ctx context.Context, id, why string) {
	n.mu.Lock()
	sb, ok := n.sandboxes[id]
	if !ok {
		// Unknown: either long gone or the Tombstone overtook its Create.
		// Remember the id so a late Create cannot start it.
		_, known := n.terminated[id]
		n.terminated[id] = time.Now()
		if !known {
			rec := &briskv1.SandboxRecord{Id: id, State: briskv1.SandboxState_SANDBOX_STATE_GONE, Message: why}
			n.emitLocked(&sandbox{rec: rec})
		}
		n.mu.Unlock()
		return
	}
	if sb.killing {
		n.mu.Unlock()
		return
	}
	sb.killing = true
	sb.rec.State = briskv1.SandboxState_SANDBOX_STATE_TERMINATING
	n.emitLocked(sb)
	if sb.cancel != nil {
		sb.cancel()
	}
	n.mu.Unlock()

	backoff := 10 * time.Millisecond
	for {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		go func() { // an attempt under way when the node stops ends too
			select {
			case <-n.stopped:
				cancel()
			case <-kctx.Done():
			}
		}()
		err := n.rt.Kill(kctx, id)
		cancel()
		if err == nil || errors.Is(err, runtime.ErrNotFound) {
			break
		}
		n.log.Warn("killing sandbox, will retry", "sandbox", id, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-n.stopped:
			// The worker is exiting: the sandbox stays terminating, for
			// the next worker's recovery to kill (or adopt and kill).
			t.Stop()
			n.mu.Lock()
			sb.killing = false
			n.mu.Unlock()
			n.log.Warn("gave up killing a sandbox: the worker is stopping", "sandbox", id, "err", err)
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	n.mu.Lock()
	sb.rec.State, sb.rec.Message = briskv1.SandboxState_SANDBOX_STATE_GONE, why
	n.finishLocked(sb)
	n.mu.Unlock()
}

func (n *Node) pruneTerminatedLocked() {
	cut := time.Now().Add(-terminatedTTL)
	for id, t := range n.terminated {
		if t.Before(cut) {
			delete(n.terminated, id)
		}
	}
}

// takePending returns queued updates for the session with this epoch.
func (n *Node) takePending(epoch uint64) ([]*briskv1.SandboxRecord, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.epoch != epoch {
		return nil, false
	}
	p := n.pending
	n.pending = nil
	return p, true
}

func (n *Node) heartbeat() *briskv1.Heartbeat {
	var tplMB int64 // read from cgroups: outside the lock
	var held *briskv1.TemplateSet
	for _, rt := range n.runtimes() {
		if th, ok := rt.(runtime.TemplateHolder); ok {
			tplMB += th.TemplateMemoryMB()
			if held == nil {
				held = &briskv1.TemplateSet{}
			}
			for _, h := range th.HeldTemplates() {
				held.Templates = append(held.Templates, &briskv1.HeldTemplate{Function: h.Function, Revision: h.Revision})
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	hb := &briskv1.Heartbeat{
		UnixMs:    time.Now().UnixMilli(),
		Capacity:  &briskv1.Resources{MilliCpu: n.capacity.MilliCPU, MemoryMb: n.capacity.MemoryMB},
		Used:      &briskv1.Resources{MilliCpu: n.used.MilliCPU + n.em.used.MilliCPU, MemoryMb: n.used.MemoryMB + n.em.used.MemoryMB},
		Sandboxes: int32(len(n.sandboxes)),
		Emergency: n.emergencyStatsLocked(),
	}
	if tplMB > 0 {
		hb.Templates = &briskv1.Resources{MemoryMb: tplMB}
	}
	hb.HeldTemplates = held // nil from runtimes without templates
	return hb
}

func (n *Node) currentEpoch() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.epoch
}

// Snapshot lists the node's sandboxes (for status and tests).
func (n *Node) Snapshot() []*briskv1.SandboxRecord {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*briskv1.SandboxRecord, 0, len(n.sandboxes))
	for _, sb := range n.sandboxes {
		out = append(out, cloneRecord(sb.rec))
	}
	return out
}

// Stop kills every sandbox (used when a worker shuts down with --cleanup).
func (n *Node) Stop(ctx context.Context) {
	stop := func() { n.stopOnce.Do(func() { close(n.stopped) }) }
	// Kills still failing when the time is up are given up.
	context.AfterFunc(ctx, stop)
	n.drain(ctx)
	stop()
}

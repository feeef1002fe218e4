package reconciler

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/internal/policy/templateset"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// sbState is the control plane's (cached) view of a sandbox; the worker's
// record is the truth and overwrites it at every handshake.
type sbState int

const (
	sbAssumed    sbState = iota // placed, Create sent, not yet acknowledged
	sbPending                   // worker acknowledged: creating
	sbReady                     // serving: routed by data planes
	sbTombstoned                // chosen for termination: never counted or routed again
)

func (s sbState) String() string {
	return [...]string{"assumed", "pending", "ready", "tombstoned"}[s]
}

type sandboxRec struct {
	id      string
	fn      *fnState
	rev     uint64
	node    *nodeState
	state   sbState
	version uint64
	addr    string
	created time.Time
	// withdrawn: its node's link is down, so data planes do not route to it
	// (and the autoscaler does not count it as ready). It is replaced only
	// once the node is fenced (NodeGrace): a short blip must not churn
	// sandboxes (docs/reliability.md, case 16). The next handshake restores it.
	withdrawn bool
	// verifyAsked: a data plane could not connect to it and its worker was
	// asked to check it then (zero: no check pending).
	verifyAsked time.Time
	// What it requests, as placed: a later spec may ask for other amounts.
	milliCPU, memoryMB int64
	// drainFrom: when it was withdrawn to be killed (zero: not waiting);
	// drainHeld: the data planes that last said calls still run in it,
	// and when (drainDue).
	drainFrom time.Time
	drainHeld map[string]time.Time
	timeout   time.Duration // its calls' timeout, from the spec it was placed with
}

type nodeState struct {
	id        string
	rec       *nodes.Worker
	idx       int // index in place / nodeList
	up        bool
	sandboxes map[string]*sandboxRec
	// invalid holds ids a handshake found missing at the worker (or that a
	// fence gave up), so that late updates for them are ignored, with the
	// session generation that last marked or ignored one. A mark lives
	// until a whole session has passed without traffic for its id
	// (docs/reliability.md, case 10).
	invalid       map[string]uint64
	gen           uint64 // handshakes completed with this node
	bootID        string
	lastHeartbeat time.Time
	heartbeat     *Heartbeat
	downSince     time.Time // zero while a session is live
	// seen holds the images (or commands) the node has run since it
	// registered: it holds them unpacked, which the locality policies use.
	seen map[string]struct{}
	// templates are the function revisions whose template (a pre-loaded
	// runtime) the node said it holds in its last heartbeat that listed
	// them: a sandbox of one starts there in milliseconds.
	templates map[heldTemplate]struct{}
}

type heldTemplate struct {
	function string
	revision uint64
}

func (c *Reconciler) registerNode(w *nodes.Worker) {
	n := c.nodes[w.ID]
	if n == nil {
		n = &nodeState{id: w.ID, rec: w, idx: len(c.nodeList), sandboxes: make(map[string]*sandboxRec),
			invalid: make(map[string]uint64), seen: make(map[string]struct{})}
		c.nodes[w.ID] = n
		c.nodeList = append(c.nodeList, n)
		c.place = append(c.place, placement.Node{ID: w.ID})
	}
	n.rec = w
	c.setAllocatable(n)
	c.place[n.idx].MaxSandboxes = w.MaxSandboxes
}

// setAllocatable is the node's capacity less what its templates hold (its
// last heartbeat's): memory no sandbox's request covers.
func (c *Reconciler) setAllocatable(n *nodeState) {
	mem := n.rec.Capacity.MemoryMB
	if t := n.heartbeat.templatesMB(); t > 0 && mem > 0 {
		mem = max(mem-t, 0)
	}
	c.place[n.idx].Allocatable = placement.Resources{MilliCPU: n.rec.Capacity.MilliCPU, MemoryMB: mem}
}

// addRecord enters r in the table and charges its resources.
func (c *Reconciler) addRecord(r *sandboxRec) {
	if r.fn.sandboxes == nil { // most of a large deployment's functions have none
		r.fn.sandboxes = make(map[string]*sandboxRec)
	}
	r.fn.sandboxes[r.id] = r
	r.node.sandboxes[r.id] = r
	c.charge(r, 1)
	p := &c.place[r.node.idx]
	p.Requested.MilliCPU += r.milliCPU
	p.Requested.MemoryMB += r.memoryMB
	p.Sandboxes++
}

// drop forgets a sandbox that is gone (or invalid) and frees its resources
// in the placement view.
func (c *Reconciler) drop(r *sandboxRec) {
	if r.state == sbReady && !r.withdrawn {
		c.emit(RemoveEndpoint{r.id})
	}
	delete(r.fn.sandboxes, r.id)
	delete(r.node.sandboxes, r.id)
	if len(r.fn.sandboxes) == 0 && c.fns[r.fn.spec.Name] == r.fn {
		c.keep.Forget(r.fn.spec.Name) // GD's frequency restarts with the next sandbox
	}
	c.charge(r, -1)
	p := &c.place[r.node.idx]
	p.Requested.MilliCPU -= r.milliCPU
	p.Requested.MemoryMB -= r.memoryMB
	p.Sandboxes--
}

// ---------------------------------------------------------------- sessions

// HandshakeMode is the mode of n's next handshake: reset when the table
// holds sandboxes of it (a change set follows), recover when it holds none.
func (c *Reconciler) HandshakeMode(node string) HandshakeMode {
	if n := c.nodes[node]; n != nil && len(n.sandboxes) > 0 {
		return HandshakeReset
	}
	return HandshakeRecover
}

// Node returns a copy of node's durable record and its last boot id.
func (c *Reconciler) Node(node string) (w nodes.Worker, bootID string, ok bool) {
	n := c.nodes[node]
	if n == nil {
		return nodes.Worker{}, "", false
	}
	return *n.rec, n.bootID, true
}

// NodeIDs lists the registered nodes in registration order.
func (c *Reconciler) NodeIDs() []string {
	out := make([]string, len(c.nodeList))
	for i, n := range c.nodeList {
		out[i] = n.id
	}
	return out
}

// Up reports whether node has a live session.
func (c *Reconciler) Up(node string) bool {
	n := c.nodes[node]
	return n != nil && n.up
}

// StaleIDs are the sandboxes a reset handshake must fetch: those whose
// version differs from the table's (all of them after a reboot).
func (c *Reconciler) StaleIDs(node string, versions []Version, rebooted bool) []string {
	n := c.nodes[node]
	var ids []string
	for _, v := range versions {
		var r *sandboxRec
		if n != nil {
			r = n.sandboxes[v.ID]
		}
		if rebooted || r == nil || r.version != v.Version {
			ids = append(ids, v.ID)
		}
	}
	return ids
}

// sessionUp folds a worker's full state into the table (docs/architecture.md,
// "The control plane ↔ worker link"): ids only we hold become invalid
// (replaced under new ids, never re-sent), ids only the worker holds are
// adopted, ids at both take the worker's record, and Tombstones the worker
// still reports are sent again.
func (c *Reconciler) sessionUp(now time.Time, e SessionUp) {
	n := c.nodes[e.Node]
	if n == nil {
		return
	}
	reported := make(map[string]struct{}, len(e.Versions))
	for _, v := range e.Versions {
		reported[v.ID] = struct{}{}
	}
	n.gen++
	for id, g := range n.invalid {
		if g+1 < n.gen { // a whole session without traffic for it
			delete(n.invalid, id)
		}
	}
	for _, r := range sortedRecs(n.sandboxes) {
		if _, ok := reported[r.id]; !ok {
			if r.state != sbTombstoned {
				n.invalid[r.id] = n.gen
			}
			c.drop(r)
		}
	}
	n.up = true
	c.restoreNode(n)
	if e.Rebooted {
		for _, r := range n.sandboxes {
			r.version = 0 // take the new boot's record as it is
		}
	}
	var adopted []*fnState
	for i := range e.Records {
		u := &e.Records[i]
		known := n.sandboxes[u.ID] != nil
		c.applyUpdate(now, n, u)
		if r := n.sandboxes[u.ID]; r != nil && !known && r.fn != nil && !slices.Contains(adopted, r.fn) {
			adopted = append(adopted, r.fn)
		}
	}
	for _, r := range sortedRecs(n.sandboxes) {
		if r.state == sbTombstoned && r.drainFrom.IsZero() { // the draining ones go when drainDue says
			c.emit(Tombstone{Node: n.id, ID: r.id})
		}
	}
	// Recovered sandboxes are not scaled down for one stable window: the
	// autoscaler has no metrics for them yet.
	for _, fs := range adopted {
		live := 0
		for _, r := range fs.sandboxes {
			if r.state != sbTombstoned && r.rev == fs.spec.Revision {
				live++
			}
		}
		fs.kpa.Adopt(now, live)
		fs.desired = max(fs.desired, live)
		c.boundDesired(fs)
	}
	n.bootID = e.BootID
	n.downSince = time.Time{}
	n.lastHeartbeat = now
	c.place[n.idx].Schedulable = !n.rec.Drain || len(e.Versions) == 0
	c.maybeResume(now)
	for _, fs := range c.order {
		c.reconcile(now, fs)
	}
	for i := range e.Early {
		c.applyUpdates(now, n, &e.Early[i])
	}
	c.refreshEmergency() // the session is up: its emergency slots count
	c.offerDual(n)
	if e.Drained {
		// The worker drained on Hello: it takes work again.
		n.rec.Drain = false
		c.emit(PersistWorker{*n.rec})
	}
}

func (c *Reconciler) sessionDown(now time.Time, node string, withdraw bool) {
	n := c.nodes[node]
	if n == nil || !n.up {
		return
	}
	n.up = false
	n.downSince = now
	c.place[n.idx].Schedulable = false
	c.refreshEmergency()
	if withdraw {
		c.withdrawNode(n)
	}
}

// withdrawNode takes a node whose link just went down out of load
// balancing at once: data planes stop routing to its sandboxes. The records
// stay until the node's next handshake restores what still runs, or until
// NodeGrace passes and checkNodes fences the node and replaces them.
func (c *Reconciler) withdrawNode(n *nodeState) {
	withdrawn := 0
	for _, r := range sortedRecs(n.sandboxes) {
		if r.withdrawn || r.state == sbTombstoned {
			continue
		}
		if r.state == sbReady {
			c.emit(RemoveEndpoint{r.id})
			withdrawn++
		}
		r.withdrawn = true
	}
	if withdrawn > 0 {
		c.log.Warn("worker link down: its sandboxes are out of load balancing", "node", n.id, "sandboxes", withdrawn)
	}
}

// restoreNode undoes withdrawNode for the sandboxes the node still
// reports (called by the handshake, after dropping the others).
func (c *Reconciler) restoreNode(n *nodeState) {
	for _, r := range sortedRecs(n.sandboxes) {
		if !r.withdrawn {
			continue
		}
		r.withdrawn = false
		if r.state == sbReady {
			c.emit(AddEndpoint{Endpoint: endpointOf(r)})
		}
	}
}

// checkNodes fences nodes whose link has been down longer than the grace
// period: their sandboxes are counted gone and replaced elsewhere, and the
// node must drain before it takes work again (docs/reliability.md, case 16).
func (c *Reconciler) checkNodes(now time.Time) {
	for _, n := range c.nodeList {
		if n.up || n.downSince.IsZero() || now.Sub(n.downSince) < c.cfg.NodeGrace || len(n.sandboxes) == 0 {
			continue
		}
		c.log.Warn("worker unreachable past the grace period: replacing its sandboxes", "node", n.id, "sandboxes", len(n.sandboxes))
		n.rec.Drain = true
		c.emit(PersistWorker{*n.rec})
		var fns []*fnState
		for _, r := range sortedRecs(n.sandboxes) {
			n.invalid[r.id] = n.gen
			if !slices.Contains(fns, r.fn) {
				fns = append(fns, r.fn)
			}
			c.drop(r)
		}
		for _, fs := range fns {
			c.reconcile(now, fs)
		}
	}
}

// fenceSilent fences every worker that has not answered since the start.
func (c *Reconciler) fenceSilent(now time.Time) {
	if !c.paused {
		return
	}
	for _, n := range c.nodeList {
		if !n.up && n.gen == 0 && !n.rec.Drain {
			n.rec.Drain = true
			c.place[n.idx].Schedulable = false
			if n.downSince.IsZero() {
				n.downSince = now
			}
			c.log.Warn("worker silent since the control plane started: fencing it before placing", "node", n.id)
			c.emit(PersistWorker{*n.rec})
		}
	}
}

// maybeResume ends the startup pause once every known worker has answered
// its handshake: until then placing sandboxes could duplicate ones not yet
// reported.
func (c *Reconciler) maybeResume(now time.Time) {
	if !c.paused {
		return
	}
	for _, n := range c.nodeList {
		if !n.up && !n.rec.Drain {
			return
		}
	}
	c.resume(now, "every worker answered")
}

func (c *Reconciler) resume(now time.Time, why string) {
	if !c.paused {
		return
	}
	c.paused = false
	c.log.Info("scheduling resumed", "why", why)
	for _, fs := range c.order {
		c.reconcile(now, fs)
	}
}

// ---------------------------------------------------------------- updates

func (c *Reconciler) applyUpdates(now time.Time, n *nodeState, u *Updates) {
	for i := range u.Records {
		c.applyUpdate(now, n, &u.Records[i])
	}
	if hb := u.Heartbeat; hb != nil {
		tplMemChanged := n.heartbeat.templatesMB() != hb.Templates.MemoryMB
		n.heartbeat = hb
		n.lastHeartbeat = now
		if tplMemChanged {
			c.setAllocatable(n)
		}
		if hb.HeldSet {
			clear(n.templates)
			for _, t := range hb.Held {
				if n.templates == nil {
					n.templates = make(map[heldTemplate]struct{})
				}
				n.templates[heldTemplate{t.Function, t.Revision}] = struct{}{}
			}
		}
		if capa := hb.Capacity.MilliCPU; capa > 0 {
			c.place[n.idx].Load = float64(hb.Used.MilliCPU) / float64(capa)
		}
		if hb.Emergency.Slots > 0 || c.emergencyKey != "" {
			c.refreshEmergency()
		}
	}
}

// applyUpdate folds one worker record (a soft invalidation) into the
// table. Records carry versions; stale ones are ignored.
func (c *Reconciler) applyUpdate(now time.Time, n *nodeState, u *Record) {
	if _, inv := n.invalid[u.ID]; inv {
		n.invalid[u.ID] = n.gen // traffic for the id: keep the mark a session longer
		// Never adopted nor routed; but a sandbox the worker says runs
		// under an id replaced elsewhere is a stray process: end it
		// rather than leave it running unaccounted (a Create the worker
		// finished after the handshake that gave the id up).
		if !u.State.terminal() && u.State != StateTerminating && n.up {
			c.emit(Tombstone{Node: n.id, ID: u.ID})
		}
		return
	}
	r := n.sandboxes[u.ID]
	if r == nil {
		if !u.State.terminal() {
			c.adopt(now, n, u)
		}
		return
	}
	if u.Version != 0 && u.Version <= r.version {
		return
	}
	r.version = u.Version
	switch u.State {
	case StateCreating:
		if r.state == sbAssumed {
			r.state = sbPending
		}
	case StateReady:
		r.addr = u.Address
		if r.state == sbAssumed || r.state == sbPending {
			r.state = sbReady
			r.fn.failures = 0
			r.fn.observeColdStart(now.Sub(r.created))
			ep := endpointOf(r)
			ep.ReadyAfter, ep.Start, ep.Create = max(now.Sub(r.created), time.Nanosecond), u.Start, u.Create
			c.emit(AddEndpoint{ep})
			c.refreshCondition(r.fn)
		} else if r.state == sbReady {
			c.verified(r)
		}
	case StateTerminating:
		if r.state != sbTombstoned { // the worker gave up on it on its own
			if r.state == sbReady {
				c.emit(RemoveEndpoint{r.id})
			}
			r.state = sbTombstoned
			c.reconcile(now, r.fn)
		}
	default: // gone, failed, exited
		failed := r.state != sbTombstoned
		c.drop(r)
		if failed && !r.fn.deleted {
			c.noteFailure(now, r.fn, n.id, u)
		}
		c.reconcile(now, r.fn)
	}
}

// adopt takes a sandbox the worker reports but the control plane does not
// know (recover mode, or created by an earlier leader).
func (c *Reconciler) adopt(now time.Time, n *nodeState, u *Record) {
	fs := c.fns[u.Function]
	if fs == nil { // function deleted meanwhile: terminate it
		if n.up {
			c.emit(Tombstone{Node: n.id, ID: u.ID})
		}
		return
	}
	r := &sandboxRec{id: u.ID, fn: fs, rev: u.Revision, node: n, version: u.Version, addr: u.Address, created: now, timeout: time.Duration(fs.spec.Timeout),
		milliCPU: fs.spec.Resources.MilliCPU, memoryMB: fs.spec.Resources.MemoryMB}
	c.addRecord(r)
	n.seen[imageKey(fs.spec)] = struct{}{}
	switch u.State {
	case StateReady:
		r.state = sbReady
		c.emit(AddEndpoint{endpointOf(r)})
	case StateTerminating:
		r.state = sbTombstoned
	default:
		r.state = sbPending
	}
}

func endpointOf(r *sandboxRec) Endpoint {
	return Endpoint{SandboxID: r.id, Function: r.fn.spec.Name, Address: r.addr, Node: r.node.id}
}

// templatesMB is the memory the node's templates held at its last
// heartbeat (0 before the first).
func (hb *Heartbeat) templatesMB() int64 {
	if hb == nil {
		return 0
	}
	return hb.Templates.MemoryMB
}

// ---------------------------------------------------------------- unreachable

// verifyAgainAfter bounds how often one sandbox is checked on data planes'
// reports: a check whose answer was lost is asked again on a report after
// this long; reports in between are answered by the check in flight.
const verifyAgainAfter = time.Second

// reportUnreachable asks each reported sandbox's worker to check it: one
// data plane with a network fault cannot have healthy sandboxes killed.
func (c *Reconciler) reportUnreachable(now time.Time, rep *UnreachableReport) {
	for _, e := range rep.Endpoints {
		fs := c.fns[e.Function]
		if fs == nil {
			continue
		}
		r := fs.sandboxes[e.SandboxID]
		switch {
		case r == nil, r.state != sbReady, r.withdrawn, !r.node.up:
			continue // gone, on its way out, or its node's link is down
		case e.Address != "" && e.Address != r.addr:
			continue // about an earlier address of the sandbox
		case !r.verifyAsked.IsZero() && now.Sub(r.verifyAsked) < verifyAgainAfter:
			continue // a check is in flight
		}
		r.verifyAsked = now
		c.emit(Verify{Node: r.node.id, ID: r.id})
		c.log.Info("a data plane could not connect to a sandbox: its worker checks it", "data_plane", rep.DataPlane,
			"function", fs.spec.Name, "sandbox", r.id, "node", r.node.id, "err", e.Error)
	}
}

// verified takes a ready sandbox's record announced again. After a check a
// data plane asked for, it means the worker found the sandbox serving: it
// goes back to every data plane.
func (c *Reconciler) verified(r *sandboxRec) {
	if r.verifyAsked.IsZero() {
		return
	}
	r.verifyAsked = time.Time{}
	if !r.withdrawn {
		c.emit(AddEndpoint{endpointOf(r)})
	}
}

// ---------------------------------------------------------------- dual track

// EmergencyWorkers lists the live workers offering emergency slots, sorted
// by node id.
func (c *Reconciler) EmergencyWorkers() []EmergencyWorker {
	var out []EmergencyWorker
	for _, n := range c.nodeList {
		if !n.up || n.rec.Drain || n.heartbeat == nil || n.heartbeat.Emergency.Slots <= 0 || n.rec.Address == "" {
			continue
		}
		em := n.heartbeat.Emergency
		out = append(out, EmergencyWorker{Node: n.id, Address: n.rec.Address, Free: max(0, em.Slots-em.InUse)})
	}
	slices.SortFunc(out, func(a, b EmergencyWorker) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// refreshEmergency sends data planes the emergency worker list when it
// changed (a heartbeat, a session up or down).
func (c *Reconciler) refreshEmergency() {
	list := c.EmergencyWorkers()
	var b strings.Builder
	for _, w := range list {
		fmt.Fprintf(&b, "%s|%s|%d;", w.Node, w.Address, w.Free)
	}
	if key := b.String(); key != c.emergencyKey {
		c.emergencyKey = key
		c.emit(SetEmergencyWorkers{list})
	}
}

// offerDual sends node n every spec it needs before any of its sandboxes:
// dual-mode functions' (its emergency track serves calls against them) and
// those of the functions from source whose template it holds (the node
// makes their templates ahead of their first sandbox).
func (c *Reconciler) offerDual(n *nodeState) {
	if !n.up {
		return
	}
	for _, fs := range c.order {
		switch {
		case c.ModeOf(fs.spec) == spec.ModeDual:
			c.emit(Offer{Node: n.id, Spec: fs.spec})
		case fs.spec.Code != nil:
			if slices.Contains(c.templateNodes(fs.spec), n) {
				c.emit(Offer{Node: n.id, Spec: fs.spec})
			}
		}
	}
}

// offerToAll sends f's spec to every live node when it is a dual-mode
// function, and to the live nodes that hold its template when it is a
// function from source.
func (c *Reconciler) offerToAll(f *spec.Function) {
	var to []*nodeState
	switch {
	case c.ModeOf(f) == spec.ModeDual:
		to = c.nodeList
	case f.Code != nil:
		to = c.templateNodes(f)
	}
	for _, n := range to {
		if n.up {
			c.emit(Offer{Node: n.id, Spec: f})
		}
	}
}

// templateNodes are the live nodes that make f's template at deploy: the
// Config.TemplateFraction of them that score highest for f
// (templateset), all of them at a fraction of 0 or 1. Other nodes make
// one when a sandbox of f first starts there.
func (c *Reconciler) templateNodes(f *spec.Function) []*nodeState {
	up := make([]*nodeState, 0, len(c.nodeList))
	for _, n := range c.nodeList {
		if n.up {
			up = append(up, n)
		}
	}
	frac := c.cfg.TemplateFraction
	if frac == 0 {
		frac = 1
	}
	k := templateset.Count(frac, len(up))
	if k >= len(up) {
		return up
	}
	hashes := make([]uint64, len(up))
	for i, n := range up {
		hashes[i] = templateset.NodeHash(n.id)
	}
	cut := templateset.CutOf(f.Name, hashes, k, nil)
	out := up[:0]
	for i, n := range up {
		if cut.Admits(hashes[i], i) {
			out = append(out, n)
		}
	}
	return out
}

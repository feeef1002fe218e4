package dataplane

import (
	"iter"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/dataplane/endpoints"
	"github.com/brisk-faas/brisk/internal/dataplane/queue"
	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// endpoint is one Ready sandbox of a function. It is immutable; requests in
// flight keep their *endpoint after it leaves the set and release its tracker.
type endpoint struct {
	id      string
	addr    string
	seq     uint64 // data-plane-wide add order: later than a request's arrival means cold
	tracker *loadbalance.Tracker
	// older are the trackers e had before concurrency changes, kept while
	// calls they took may still run: those calls release them, not
	// tracker, and a withdrawal must wait for them too (inFlight).
	older []*loadbalance.Tracker
	idHdr []string  // []string{id}, shared as a header value (cap 1: an Add copies)
	conns *connPool // idle upstream connections to addr, shared by the endpoints at addr
	// How the sandbox started, for the cold-start spans (tracing.go):
	// when it reached this data plane (nanotime) and the control plane's
	// and worker's timings from the endpoint stream.
	added                           int64
	readyAfterUs, startUs, createUs int64
}

// fnConf is what the hot path needs from a spec, resolved once per revision.
type fnConf struct {
	revision     uint64
	capacity     int // per-sandbox concurrency; 0 = unlimited
	queueDepth   int
	queueTimeout time.Duration
	timeout      time.Duration
	lbName       string
	policy       loadbalance.Policy
	// extendDeadline: queue timeout + function timeout exceed the server's
	// WriteTimeout, so the request moves its own write deadline.
	extendDeadline bool
	// streamRequests: bodies stream to the sandbox, not read first (body.go).
	streamRequests bool
	// public: calls need no token (auth.go).
	public bool
	// namespace: the function's tenant, for namespaced tokens.
	namespace string
	// dual: calls that find no free sandbox take the emergency track
	// (emergency.go), which needs the wire spec and the keep-alive.
	dual      bool
	wire      *briskv1.FunctionSpec
	keepAlive time.Duration
	// async: how its asynchronous calls are retried (async.go).
	async async.Policy
	// memoryMB: what a sandbox requests (the Lambda API shows it).
	memoryMB int64
	// split: the function's traffic split between revisions (split.go);
	// nil: every call to this function.
	split *split
}

// epSet is one immutable view of a function, committed by the routing
// table (internal/dataplane/endpoints). Apply swaps a new one in, so a
// request sees a consistent conf, policy and endpoint list with a single
// atomic load.
type epSet = endpoints.Set[*fnConf, *endpoint]

// table is the data plane's routing table.
type table = endpoints.Table[*fnConf, *endpoint]

func (e *endpoint) SandboxID() string                 { return e.id }
func (e *endpoint) Address() string                   { return e.addr }
func (e *endpoint) LoadTracker() *loadbalance.Tracker { return e.tracker }

// keptIdle is how many of an endpoint's latest earlier trackers are kept
// even idle: a call that picked the endpoint from a set since replaced may
// reserve its slot only now, on a tracker one or two changes old when two
// concurrency changes came within moments.
const keptIdle = 3

// WithTracker is e on a new tracker, for a concurrency change; the copy
// keeps e's pool, which its hold is counted by (refPools), and e's
// trackers, whose calls may still run: the latest keptIdle always, older
// ones while busy.
func (e *endpoint) WithTracker(tr *loadbalance.Tracker) *endpoint {
	c := *e
	c.tracker = tr
	c.older = []*loadbalance.Tracker{e.tracker}
	for _, o := range e.older {
		if len(c.older) < keptIdle || o.InFlight() > 0 {
			c.older = append(c.older, o)
		}
	}
	return &c
}

// inFlight counts the calls running in e's sandbox through this data
// plane, on its tracker and on those before a concurrency change.
func (e *endpoint) inFlight() int {
	n := e.tracker.InFlight()
	for _, o := range e.older {
		n += o.InFlight()
	}
	return n
}

func (c *fnConf) Revision() uint64 { return c.revision }
func (c *fnConf) Concurrency() int { return c.capacity }

// function is the per-function state. Nothing here is guarded by a
// data-plane-wide lock: the set is copy-on-write and the queue has its own
// mutex, taken only when a request must wait or someone is waiting.
type function struct {
	name string
	set  atomic.Pointer[epSet]

	// listed: fn is in DataPlane.active. sent: its calls in flight and
	// queued as the last report carried them (inFlight<<32 | queued), so
	// that an urgent report lists only changes. Both guarded by activeMu.
	listed bool
	sent   uint64
	// q: the calls waiting for a slot (internal/dataplane/queue).
	q queue.Queue[*endpoint]

	stats  loadStats
	urgent atomic.Bool // queued for the next urgent report
	m      fnMetrics
	// cond is the control plane's word on why the function lacks
	// sandboxes (nil: nothing wrong); calls that find none say it.
	cond atomic.Pointer[fnCondition]
	// iat: inter-arrival times of a dual-mode function (emergency.go),
	// made on its first call: 8 KiB that most functions never use.
	iat atomic.Pointer[iatTracker]
	// splitSeq counts calls through the traffic split (split.go).
	splitSeq atomic.Uint64
}

// fnCondition is a function's condition from the control plane.
type fnCondition struct {
	why errReason
	msg string
	// failFast: the function's starts keep failing (FailFastAfter in a
	// row), or no node has room for its first sandbox: a call that finds no
	// sandbox is answered at once.
	failFast bool
}

// iats is fn's inter-arrival tracker, made on first use.
func (fn *function) iats() *iatTracker {
	if t := fn.iat.Load(); t != nil {
		return t
	}
	fn.iat.CompareAndSwap(nil, new(iatTracker))
	return fn.iat.Load()
}

func (d *DataPlane) newFunction(name string) *function {
	fn := &function{name: name}
	fn.q.Init(fn)
	fn.stats.reset(d.nanotime())
	return fn
}

// lookup returns the function routed to by name, or nil.
func (d *DataPlane) lookup(name string) *function {
	if v, ok := d.fns.Load(name); ok {
		return v.(*function)
	}
	return nil
}

// functions iterates over the routing table.
func (d *DataPlane) functions() iter.Seq2[string, *function] {
	return func(yield func(string, *function) bool) {
		d.fns.Range(func(k, v any) bool { return yield(k.(string), v.(*function)) })
	}
}

// newConf resolves a wire spec. Zero queue limits and timeouts on the wire
// mean the spec defaults; zero concurrency means unlimited (brisk.proto).
// prev's policy is kept when its name and capacity are unchanged so stateful
// policies (round-robin) keep their position across revisions.
func (d *DataPlane) newConf(p *briskv1.FunctionSpec, prev *fnConf) *fnConf {
	// Read from the wire, not through specpb.FromProto: a registration
	// burst applies one spec per function, and the conversion copies
	// fields the data plane never reads.
	c := &fnConf{
		revision:     p.GetRevision(),
		capacity:     max(int(p.GetConcurrency()), 0),
		queueDepth:   int(p.GetQueueDepth()),
		queueTimeout: time.Duration(p.GetQueueTimeoutMs()) * time.Millisecond,
		timeout:      time.Duration(p.GetTimeoutMs()) * time.Millisecond,
		lbName:       p.GetLoadBalancing(),
	}
	if c.queueDepth <= 0 {
		c.queueDepth = spec.DefaultQueueDepth
	}
	if c.queueTimeout <= 0 {
		c.queueTimeout = spec.DefaultQueueTimeout
	}
	if c.timeout <= 0 {
		c.timeout = spec.DefaultTimeout
	}
	c.extendDeadline = c.queueTimeout+c.timeout+deadlineSlack > d.cfg.WriteTimeout
	c.streamRequests = p.GetStreamRequests()
	c.public = p.GetAuth() == spec.AuthPublic
	c.namespace = p.GetNamespace()
	c.memoryMB = p.GetResources().GetMemoryMb()
	a := specpb.AsyncFromProto(p.GetAsync())
	c.async = async.Policy{MaxAttempts: a.MaxAttempts, MaxAge: time.Duration(a.MaxAge), Backoff: time.Duration(a.Backoff),
		BackoffMax: time.Duration(a.BackoffMax), RetryFunctionErrors: a.RetryFunctionErrors, Concurrency: a.Concurrency, UID: p.GetUid()}
	if p.GetScalingMode() == spec.ModeDual {
		c.dual, c.wire, c.keepAlive = true, p, time.Duration(p.GetKeepAliveMs())*time.Millisecond
	}
	if c.namespace == "" {
		c.namespace = spec.DefaultNamespace
	}
	c.split = newSplit(p.GetName(), p.GetTraffic())
	if prev != nil && prev.lbName == c.lbName && prev.capacity == c.capacity {
		c.policy = prev.policy
		return c
	}
	pol, err := loadbalance.New(c.lbName, c.capacity, d.rnd)
	if err != nil {
		d.log.Warn("unknown load-balancing policy; using the default", "function", p.GetName(), "policy", c.lbName, "err", err)
		c.lbName = ""
		pol, err = loadbalance.New("", c.capacity, d.rnd)
		if err != nil {
			panic("dataplane: default load-balancing policy: " + err.Error()) // broken invariant
		}
	}
	c.policy = pol
	return c
}

// Apply applies one batch from the control plane: a snapshot replaces all
// state, a delta adds or updates functions (newer revisions only), deletes
// functions, and adds or removes endpoints by sandbox id (the table's rules,
// internal/dataplane/endpoints). Functions and endpoints that survive a
// snapshot keep their objects, so queued requests stay queued and in-flight
// counts stay exact across a resync. Apply is serialised; the hot path never
// waits for it.
func (d *DataPlane) Apply(b *briskv1.EndpointBatch) {
	if b == nil {
		return
	}
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	defer func() { // after the table is written: wake calls waiting for a function
		ch := make(chan struct{})
		close(*d.applied.Swap(&ch))
	}()

	if b.GetEmergencySet() {
		d.em.setWorkers(b.GetEmergencyWorkers())
	}
	snapshot := b.GetSnapshot()
	d.table.Begin(snapshot)
	for _, ps := range b.GetFunctions() {
		d.table.Put(ps.GetName(), ps.GetRevision(), func(prev *fnConf, _ bool) *fnConf { return d.newConf(ps, prev) })
	}
	if !snapshot {
		for _, name := range b.GetDeletedFunctions() {
			d.table.Delete(name)
		}
	}
	for _, e := range b.GetAdded() {
		if !d.table.Add(e.GetFunction(), e.GetSandboxId(), e.GetAddress(), func(capacity int) *endpoint { return d.newEndpoint(e, capacity) }) {
			d.log.Warn("endpoint for unknown function ignored", "function", e.GetFunction(), "sandbox", e.GetSandboxId())
		}
	}
	for _, id := range b.GetRemoved() {
		d.table.Remove(id)
	}
	d.publish(d.table.Commit())
	d.applyConditions(b)
	d.applyAuth(b.GetAuth())
	if snapshot { // after the auth: a data plane that says it is synced checks tokens
		d.synced.Store(true)
	}
}

// publish makes a committed batch's changes visible to the hot path: new
// sets swapped in, new functions routed, deleted ones failed, freed
// capacity handed to waiters, pool holds moved. Apply holds applyMu.
func (d *DataPlane) publish(changes []endpoints.Change[*fnConf, *endpoint]) {
	nsChanged := false
	for _, c := range changes {
		var fn *function
		var prev, cur []*endpoint
		if c.Old != nil {
			prev = c.Old.Endpoints
		}
		switch {
		case c.New == nil:
			if fn = d.lookup(c.Name); fn != nil {
				d.fns.Delete(c.Name)
				fn.q.Close(errFunctionDeleted)
			}
		case c.Old == nil: // new (or deleted and made again in this batch: its deletion came first)
			// No lookup: at 40k functions a miss in the map costs as much
			// as the rest of a registration's Apply.
			fn = d.newFunction(c.Name)
			fn.set.Store(c.New)
			d.fns.Store(c.Name, fn)
		default:
			fn = d.lookup(c.Name)
			fn.set.Store(c.New)
		}
		if c.New != nil {
			cur = c.New.Endpoints
			if len(cur) > 0 {
				fn.m.used.Store(true)
			}
			fn.q.Dispatch()
		}
		d.refPools(prev, cur)
		if ons, nns := namespaceOfSet(c.Old), namespaceOfSet(c.New); ons != nns {
			if ons != "" {
				if d.nsCount[ons]--; d.nsCount[ons] <= 0 {
					delete(d.nsCount, ons)
				}
			}
			if nns != "" {
				d.nsCount[nns]++
			}
			nsChanged = true
		}
	}
	d.releaseLeftPools()
	if nsChanged {
		set := make(map[string]bool, len(d.nsCount))
		for ns := range d.nsCount {
			set[ns] = true
		}
		d.namespaces.Store(&set)
	}
}

func namespaceOfSet(s *epSet) string {
	if s == nil {
		return ""
	}
	return s.Conf.namespace
}

// applyConditions sets the functions' conditions a batch carries; a
// snapshot clears those it does not list.
func (d *DataPlane) applyConditions(b *briskv1.EndpointBatch) {
	if len(b.GetConditions()) == 0 && !b.GetSnapshot() {
		return
	}
	listed := make(map[string]bool, len(b.GetConditions()))
	for _, c := range b.GetConditions() {
		listed[c.GetFunction()] = true
		fn := d.lookup(c.GetFunction())
		if fn == nil {
			continue
		}
		if why := reasonOf(c.GetReason()); why != reasonNone {
			fc := &fnCondition{why: why, msg: c.GetMessage(),
				failFast: (why == reasonFunctionFailing || why == reasonNoCapacity) && c.GetFailFast()}
			fn.cond.Store(fc)
			if fc.failFast {
				fn.q.FailIfRefused() // calls waiting for a sandbox learn why now
			}
		} else {
			fn.cond.Store(nil)
		}
	}
	if b.GetSnapshot() {
		for name, fn := range d.functions() {
			if !listed[name] {
				fn.cond.Store(nil)
			}
		}
	}
}

func (d *DataPlane) newEndpoint(e *briskv1.Endpoint, capacity int) *endpoint {
	return &endpoint{
		id:      e.GetSandboxId(),
		addr:    e.GetAddress(),
		seq:     d.epSeq.Add(1),
		tracker: loadbalance.NewTracker(capacity),
		idHdr:   []string{e.GetSandboxId()},
		conns:   d.poolFor(e.GetAddress()),
		added:   d.nanotime(),

		readyAfterUs: e.GetReadyAfterUs(), startUs: e.GetStartUs(), createUs: e.GetCreateUs(),
	}
}

// refPools moves pool references from the endpoints of prev to those of cur
// (a set's endpoints, sorted by sandbox id, walked together). Connections
// are pooled per address, not per sandbox: the emulated runtime serves many
// sandboxes on one address, and a connection per cold start to it
// overflowed its accept queue. A pool closes when no endpoint at its
// address is left, so a sandbox given the address of a gone one later (an
// IP or port reused) starts with no connections of the gone one's. An
// endpoint copied onto a new tracker keeps its pool and its hold.
func (d *DataPlane) refPools(prev, cur []*endpoint) {
	i, j := 0, 0
	for i < len(prev) || j < len(cur) {
		var c int
		switch {
		case i == len(prev):
			c = 1
		case j == len(cur):
			c = -1
		default:
			c = strings.Compare(prev[i].id, cur[j].id)
		}
		switch {
		case c < 0: // left: released once the whole batch is published
			d.leftPools = append(d.leftPools, prev[i].conns)
			d.drainLeft(prev[i])
			i++
		case c > 0:
			cur[j].conns.refs++
			j++
		default:
			if prev[i].conns != cur[j].conns {
				d.leftPools = append(d.leftPools, prev[i].conns)
				cur[j].conns.refs++
			}
			i++
			j++
		}
	}
}

// drainLeft notes a withdrawn endpoint: reports list it while calls run
// in it, for the control plane kills the sandbox once no data plane lists
// it. One with calls now is reported at once.
func (d *DataPlane) drainLeft(ep *endpoint) {
	d.drainMu.Lock()
	d.draining = append(d.draining, drainingEndpoint{ep: ep})
	d.drainMu.Unlock()
	if ep.inFlight() > 0 {
		d.ringUrgent()
	}
}

// drainingEndpoint is a withdrawn endpoint the reports watch. An idle one
// is kept through one periodic report (aged: it was idle at one): a call
// that picked it from the set just replaced may reserve its slot only now.
type drainingEndpoint struct {
	ep   *endpoint
	aged bool
}

// drainingIDs lists the withdrawn endpoints that still run calls; the
// periodic report (periodic) also forgets those idle at two in a row.
func (d *DataPlane) drainingIDs(periodic bool) []string {
	d.drainMu.Lock()
	defer d.drainMu.Unlock()
	if len(d.draining) == 0 {
		return nil
	}
	var ids []string
	kept := d.draining[:0]
	for _, de := range d.draining {
		if de.ep.inFlight() == 0 {
			if periodic && de.aged {
				continue
			}
			de.aged = de.aged || periodic
			kept = append(kept, de)
			continue
		}
		// Every busy one is kept: a sandbox withdrawn, restored and
		// withdrawn again has two endpoints with calls.
		de.aged = false
		kept = append(kept, de)
		if !slices.Contains(ids, de.ep.id) {
			ids = append(ids, de.ep.id)
		}
	}
	clear(d.draining[len(kept):])
	d.draining = kept
	return ids
}

// releaseLeftPools drops the references of the endpoints that left in this
// batch. It runs after every function of the batch is published, so that a
// pool whose address passes from one function to another within a batch is
// never closed in between (and then handed to the new endpoint closed).
func (d *DataPlane) releaseLeftPools() {
	for i, p := range d.leftPools {
		d.unrefPool(p)
		d.leftPools[i] = nil
	}
	d.leftPools = d.leftPools[:0]
}

// poolFor returns the pool of addr, made on first use. Apply holds applyMu.
// A new pool starts with the batch's own hold, dropped with the batch's
// left pools: a pool made for an endpoint that the same batch removed again
// (never published, so never held) is closed then, not left behind.
func (d *DataPlane) poolFor(addr string) *connPool {
	p := d.pools[addr]
	if p == nil {
		p = newConnPool(addr)
		d.pools[addr] = p
		p.refs = 1
		d.leftPools = append(d.leftPools, p)
	}
	return p
}

func (d *DataPlane) unrefPool(p *connPool) {
	if p.refs--; p.refs > 0 {
		return
	}
	p.Close()
	if d.pools[p.Addr()] == p {
		delete(d.pools, p.Addr())
	}
}

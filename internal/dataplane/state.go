package dataplane

import (
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
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
	idHdr   []string  // []string{id}, shared as a header value (cap 1: an Add copies)
	conns   *connPool // idle upstream connections to addr, shared by the endpoints at addr
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

// epSet is one immutable view of a function. Apply builds a new one and swaps
// it in, so a request sees a consistent conf, policy and endpoint list with a
// single atomic load.
type epSet struct {
	conf     *fnConf
	eps      []*endpoint            // sorted by sandbox id (first-available order)
	trackers []*loadbalance.Tracker // trackers[i] == eps[i].tracker: the policy's input
}

// function is the per-function state. Nothing here is guarded by a
// data-plane-wide lock: the set is copy-on-write and the queue has its own
// mutex, taken only when a request must wait or someone is waiting.
type function struct {
	name string
	set  atomic.Pointer[epSet]

	// nwait mirrors the queue length so the fast path and releasers can skip
	// the mutex while nobody waits.
	nwait      atomic.Int32
	mu         sync.Mutex
	head, tail *waiter
	firstLow   *waiter // the first asynchronous waiter; guarded by mu
	nlow       int32   // asynchronous waiters; guarded by mu
	deleted    bool

	stats  loadStats
	urgent atomic.Bool // queued for the next urgent report
	m      fnMetrics
	// cond is the control plane's word on why the function lacks
	// sandboxes (nil: nothing wrong); calls that find none say it.
	cond atomic.Pointer[fnCondition]
	// iat: inter-arrival times of a dual-mode function (emergency.go).
	iat iatTracker
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

func (d *DataPlane) newFunction(name string) *function {
	fn := &function{name: name}
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
	s := specpb.FromProto(p)
	c := &fnConf{
		revision:     s.Revision,
		capacity:     max(s.Concurrency, 0),
		queueDepth:   s.Queue.Depth,
		queueTimeout: time.Duration(s.Queue.Timeout),
		timeout:      time.Duration(s.Timeout),
		lbName:       s.LoadBalancing,
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
	c.memoryMB = s.Resources.MemoryMB
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
		d.log.Warn("unknown load-balancing policy; using the default", "function", s.Name, "policy", c.lbName, "err", err)
		c.lbName = ""
		pol, err = loadbalance.New("", c.capacity, d.rnd)
		if err != nil {
			panic("dataplane: default load-balancing policy: " + err.Error()) // broken invariant
		}
	}
	c.policy = pol
	return c
}

// pendingFn accumulates one function's changes within an Apply.
type pendingFn struct {
	conf *fnConf
	eps  []*endpoint
}

// Apply applies one batch from the control plane: a snapshot replaces all
// state, a delta adds or updates functions (newer revisions only), deletes
// functions, and adds or removes endpoints by sandbox id. Functions and
// endpoints that survive a snapshot keep their objects, so queued requests
// stay queued and in-flight counts stay exact across a resync. Apply is
// serialised; the hot path never waits for it.
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

	// next overlays the routing table with this batch's changes (nil:
	// deleted); it is written to the table at the end.
	next := make(map[string]*function, len(b.GetFunctions()))
	get := func(name string) *function {
		if fn, ok := next[name]; ok {
			return fn
		}
		return d.lookup(name)
	}
	pending := make(map[*function]*pendingFn)
	touch := func(fn *function) *pendingFn {
		p := pending[fn]
		if p == nil {
			set := fn.set.Load()
			p = &pendingFn{conf: set.conf, eps: slices.Clone(set.eps)}
			pending[fn] = p
		}
		return p
	}

	if b.GetEmergencySet() {
		d.em.setWorkers(b.GetEmergencyWorkers())
	}
	if b.GetSnapshot() {
		defer d.synced.Store(true)
		for _, ps := range b.GetFunctions() {
			if fn := next[ps.GetName()]; fn != nil { // listed twice: the newer revision wins
				if p := pending[fn]; ps.GetRevision() >= p.conf.revision {
					p.conf = d.newConf(ps, p.conf)
				}
				continue
			}
			fn := d.lookup(ps.GetName())
			var prev *fnConf
			if fn == nil {
				fn = d.newFunction(ps.GetName())
			} else {
				prev = fn.set.Load().conf
			}
			next[fn.name] = fn
			pending[fn] = &pendingFn{conf: d.newConf(ps, prev)}
		}
		for name, fn := range d.functions() {
			if next[name] != fn {
				d.deleteFunction(fn)
				if next[name] == nil {
					next[name] = nil // absent from the snapshot: delete
				}
			}
		}
		bySandbox := make(map[string]*function, len(b.GetAdded()))
		for _, e := range b.GetAdded() {
			fn := next[e.GetFunction()]
			if fn == nil {
				d.log.Warn("endpoint for unknown function ignored", "function", e.GetFunction(), "sandbox", e.GetSandboxId())
				continue
			}
			if bySandbox[e.GetSandboxId()] != nil {
				continue // listed twice
			}
			p := pending[fn]
			var old *endpoint
			if d.sandboxes[e.GetSandboxId()] == fn {
				old = findEndpoint(fn.set.Load().eps, e.GetSandboxId())
			}
			if old != nil && old.addr == e.GetAddress() {
				p.eps = append(p.eps, old)
			} else {
				p.eps = append(p.eps, d.newEndpoint(e, p.conf.capacity))
			}
			bySandbox[e.GetSandboxId()] = fn
		}
		d.sandboxes = bySandbox
	} else {
		for _, ps := range b.GetFunctions() {
			fn := get(ps.GetName())
			if fn == nil {
				fn = d.newFunction(ps.GetName())
				next[fn.name] = fn
				pending[fn] = &pendingFn{conf: d.newConf(ps, nil)}
				continue
			}
			p := touch(fn)
			if ps.GetRevision() < p.conf.revision {
				continue // stale: an older revision overtaken by a newer one
			}
			p.conf = d.newConf(ps, p.conf)
		}
		for _, name := range b.GetDeletedFunctions() {
			fn := get(name)
			if fn == nil {
				continue
			}
			next[name] = nil
			if p := pending[fn]; p != nil {
				d.forgetSandboxes(fn, p.eps) // added earlier in this batch
				delete(pending, fn)
			}
			d.deleteFunction(fn)
		}
		for _, e := range b.GetAdded() {
			fn := get(e.GetFunction())
			if fn == nil {
				d.log.Warn("endpoint for unknown function ignored", "function", e.GetFunction(), "sandbox", e.GetSandboxId())
				continue
			}
			if other := d.sandboxes[e.GetSandboxId()]; other != nil && other != fn && get(other.name) == other {
				d.removeSandbox(touch(other), e.GetSandboxId())
			}
			p := touch(fn)
			i := slices.IndexFunc(p.eps, func(ep *endpoint) bool { return ep.id == e.GetSandboxId() })
			switch {
			case i < 0:
				p.eps = append(p.eps, d.newEndpoint(e, p.conf.capacity))
			case p.eps[i].addr != e.GetAddress():
				p.eps[i] = d.newEndpoint(e, p.conf.capacity)
			}
			d.sandboxes[e.GetSandboxId()] = fn
		}
		for _, id := range b.GetRemoved() {
			fn := d.sandboxes[id]
			delete(d.sandboxes, id)
			if fn == nil || get(fn.name) != fn {
				continue
			}
			d.removeSandbox(touch(fn), id)
		}
	}

	for fn, p := range pending {
		d.publish(fn, p)
	}
	d.releaseLeftPools()
	nsChanged := false
	for name, fn := range next {
		old := d.lookup(name)
		if fn == nil {
			d.fns.Delete(name)
		} else {
			d.fns.Store(name, fn)
		}
		if ons, nns := namespaceOfFn(old), namespaceOfFn(fn); ons != nns {
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
	if nsChanged {
		set := make(map[string]bool, len(d.nsCount))
		for ns := range d.nsCount {
			set[ns] = true
		}
		d.namespaces.Store(&set)
	}
	d.applyConditions(b)
	d.applyAuth(b.GetAuth())
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
				fn.failWaiters() // calls waiting for a sandbox learn why now
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

func (d *DataPlane) removeSandbox(p *pendingFn, id string) {
	p.eps = slices.DeleteFunc(p.eps, func(ep *endpoint) bool { return ep.id == id })
}

func (d *DataPlane) deleteFunction(fn *function) {
	if set := fn.set.Load(); set != nil { // nil: created earlier in this batch
		d.forgetSandboxes(fn, set.eps)
		for _, ep := range set.eps {
			d.leftPools = append(d.leftPools, ep.conns)
		}
	}
	fn.fail(errFunctionDeleted)
}

func (d *DataPlane) forgetSandboxes(fn *function, eps []*endpoint) {
	for _, ep := range eps {
		if d.sandboxes[ep.id] == fn {
			delete(d.sandboxes, ep.id)
		}
	}
}

func findEndpoint(eps []*endpoint, id string) *endpoint {
	for _, ep := range eps {
		if ep.id == id {
			return ep
		}
	}
	return nil
}

// publish swaps in a new set and hands freed capacity to waiters. A
// concurrency change needs new trackers; the old ones stay with the requests
// in flight on them, so the limit can be exceeded briefly during the switch.
func (d *DataPlane) publish(fn *function, p *pendingFn) {
	eps := p.eps
	for i, ep := range eps {
		if ep.tracker.Capacity() != p.conf.capacity {
			eps[i] = &endpoint{id: ep.id, addr: ep.addr, seq: ep.seq, tracker: loadbalance.NewTracker(p.conf.capacity), idHdr: ep.idHdr, conns: ep.conns}
		}
	}
	slices.SortFunc(eps, func(a, b *endpoint) int { return strings.Compare(a.id, b.id) })
	trackers := make([]*loadbalance.Tracker, len(eps))
	for i, ep := range eps {
		trackers[i] = ep.tracker
	}
	old := fn.set.Swap(&epSet{conf: p.conf, eps: eps, trackers: trackers})
	if len(eps) > 0 {
		fn.m.used.Store(true)
	}
	fn.maybeDispatch()
	var prev []*endpoint
	if old != nil {
		prev = old.eps
	}
	d.refPools(prev, eps)
}

// poolKey identifies an endpoint's hold on a pool: a concurrency change
// copies the endpoint but not the hold.
type poolKey struct {
	id    string
	conns *connPool
}

// refPools moves pool references from the endpoints of prev to those of cur.
// Connections are pooled per address, not per sandbox: the emulated runtime
// serves many sandboxes on one address, and a connection per cold start to
// it overflowed its accept queue. A pool closes when no endpoint at its
// address is left, so a sandbox given the address of a gone one later (an
// IP or port reused) starts with no connections of the gone one's.
func (d *DataPlane) refPools(prev, cur []*endpoint) {
	if len(prev) == 0 && len(cur) == 0 {
		return
	}
	in := make(map[poolKey]struct{}, len(prev))
	for _, ep := range prev {
		in[poolKey{ep.id, ep.conns}] = struct{}{}
	}
	for _, ep := range cur {
		k := poolKey{ep.id, ep.conns}
		if _, ok := in[k]; ok {
			delete(in, k) // kept
		} else {
			ep.conns.refs++
		}
	}
	for k := range in { // left: released once the whole batch is published
		d.leftPools = append(d.leftPools, k.conns)
	}
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
func (d *DataPlane) poolFor(addr string) *connPool {
	p := d.pools[addr]
	if p == nil {
		p = newConnPool(addr)
		d.pools[addr] = p
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

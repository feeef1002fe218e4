package controlplane

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/policy/placement"
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
	// asked to check it then (zero: no check pending). The worker answers
	// EXITED (replaced like any exit) or announces the sandbox again, which
	// puts it back on every data plane (unreachable.go).
	verifyAsked time.Time
	// What it requests, as placed: a later spec may ask for other amounts.
	milliCPU, memoryMB int64
}

type fnState struct {
	spec    *spec.Function
	kpa     *autoscale.KPA
	desired int
	// sandboxes holds every live record of the function, tombstoned included.
	sandboxes map[string]*sandboxRec
	deleted   bool

	// dpLoad is each data plane's latest reported load (a level, sampled
	// into the autoscaler once a second by sampleLoad). A slice, not a
	// map: a cluster has a few data planes, and one small map per function
	// was the largest part of the control plane's live heap with 10,000
	// functions (what each garbage collection must mark).
	dpLoad []dpSample

	panicking bool // the autoscaler's last decision was in panic mode

	failures     int       // consecutive failed starts
	backoffUntil time.Time // no new creates before this (crash-loop protection)
	lastFailure  string
	retryArmed   bool

	placeErr string // why the last placement found no node ("": it did not fail)
	quotaErr string // why its namespace's quota has no room for the next sandbox ("": it has)
	// cond is the condition last published to data planes: why the
	// function lacks sandboxes (a data-plane reason code and a message).
	cond fnCondition
}

// fnCondition says why a function has no (or too few) sandboxes.
type fnCondition struct {
	reason, message string
}

const (
	condNoCapacity      = "no-capacity"
	condFunctionFailing = "function-failing"
)

type nodeState struct {
	id string // immutable; rec may be replaced under the lock
	// conn is the link's gRPC connection to the worker (nil while none),
	// for calls beside the session: logs.
	conn      atomic.Pointer[grpc.ClientConn]
	rec       *store.Worker
	idx       int // index in cluster.place / cluster.nodeList
	sess      *session
	sandboxes map[string]*sandboxRec
	// invalid holds ids a handshake found missing at the worker (or that a
	// fence gave up), so that late updates for them are ignored, with the
	// session generation (gen) that last marked or ignored one. A mark lives
	// until a whole session has passed without traffic for its id
	// (docs/reliability.md, case 10): clearing every mark at the next handshake would let
	// a late record for the id, arriving in that next session, adopt it.
	invalid       map[string]uint64
	gen           uint64 // handshakes completed with this node
	bootID        string
	lastHeartbeat time.Time
	heartbeat     *briskv1.Heartbeat
	downSince     time.Time // zero while a session is live
	managed       bool      // a link goroutine runs for it
}

// Cluster is the control plane's in-memory state: functions with their
// autoscalers, nodes with their sessions, and the sandbox table. One mutex
// guards it; nothing under it does I/O.
type Cluster struct {
	mu  sync.Mutex
	clk clock.Clock
	log *slog.Logger
	cfg Config

	fns      map[string]*fnState
	nodes    map[string]*nodeState
	nodeList []*nodeState
	place    []placement.Node // parallel to nodeList, kept current in place
	placer   placement.Policy

	watchers map[*watcher]struct{}
	quotas   map[string]spec.Quota // namespace -> quota (quota.go)
	nsUse    map[string]*nsUsage
	// auth is what data planes need to check calls' tokens (setAuth); nil
	// until the control plane has loaded its tokens.
	auth  *briskv1.AuthConfig
	store store.Registry
	// paused holds placement after a restart until workers have reported
	// what they run.
	paused bool

	idPrefix string
	idSeq    atomic.Uint64
	// emergencyKey is the emergency worker list data planes last got
	// (emergency.go).
	emergencyKey string

	metrics *cpMetrics
}

func newCluster(cfg Config, m *cpMetrics) (*Cluster, error) {
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 0x9e3779b97f4a7c15))
	p, err := placement.New(cfg.Placement, rng)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(spec.ScalingModes, cfg.ScalingMode) {
		return nil, fmt.Errorf("scaling mode %q: want one of %v", cfg.ScalingMode, spec.ScalingModes)
	}
	c := &Cluster{
		clk: clock.Or(cfg.Clock), log: cfg.Logger, cfg: cfg,
		fns: make(map[string]*fnState), nodes: make(map[string]*nodeState), nsUse: make(map[string]*nsUsage),
		placer: p, watchers: make(map[*watcher]struct{}),
		idPrefix: hex.EncodeToString(seed[:6]), metrics: m,
	}
	if err := m.reg.Register(newFunctionCollector(c)); err != nil {
		return nil, err
	}
	return c, nil
}

// newID returns a sandbox id that is never reused: a per-process random
// prefix and a counter.
func (c *Cluster) newID() string {
	return c.idPrefix + "-" + strconv.FormatUint(c.idSeq.Add(1), 36)
}

// ---------------------------------------------------------------- functions

func (c *Cluster) kpaConfig(f *spec.Function) autoscale.Config {
	k := c.cfg.Autoscale
	s := f.Scaling
	util := c.cfg.TargetUtilization
	if s.TargetUtilization > 0 {
		util = s.TargetUtilization
	}
	if s.Target > 0 {
		t := s.Target
		if f.Concurrency > 0 {
			t = min(t, float64(f.Concurrency))
		}
		k.TargetConcurrency = max(0.01, t*util)
	} else {
		k.TargetConcurrency = autoscale.TargetFor(f.Concurrency, util)
	}
	k.MinScale, k.MaxScale = s.Min, s.Max
	if s.StableWindow > 0 {
		k.StableWindow = time.Duration(s.StableWindow)
	}
	if s.PanicWindowPct > 0 {
		k.PanicWindowPercent = s.PanicWindowPct
	}
	if s.PanicThreshold > 0 {
		k.PanicThreshold = s.PanicThreshold
	}
	if s.ScaleToZeroGrace > 0 {
		k.ScaleToZeroGrace = time.Duration(s.ScaleToZeroGrace)
	}
	if s.MaxScaleUpRate > 0 {
		k.MaxScaleUpRate = s.MaxScaleUpRate
	}
	if s.MaxScaleDownRate > 0 {
		k.MaxScaleDownRate = s.MaxScaleDownRate
	}
	if c.modeOf(f) == spec.ModeSync {
		k = autoscale.SyncConfig(k, keepAlive(k))
	}
	return k
}

// keepAlive is how long an idle sandbox lives under k: the stable window
// plus the scale-to-zero grace (sync mode holds its peak that long).
func keepAlive(k autoscale.Config) time.Duration {
	if k.HoldPeaks {
		return k.ScaleDownDelay
	}
	return k.StableWindow + k.ScaleToZeroGrace
}

// modeOf is f's effective scaling mode.
func (c *Cluster) modeOf(f *spec.Function) string {
	if f.Scaling.Mode != "" {
		return f.Scaling.Mode
	}
	return c.cfg.ScalingMode
}

// upsertFunction installs a new or updated function (already durable).
func (c *Cluster) upsertFunction(f *spec.Function) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	fs := c.fns[f.Name]
	if fs == nil {
		fs = &fnState{spec: f, kpa: autoscale.NewKPA(c.kpaConfig(f), now), sandboxes: make(map[string]*sandboxRec)}
		c.fns[f.Name] = fs
		fs.desired = f.Scaling.Min
	} else {
		fs.spec = f
		fs.kpa.SetConfig(c.kpaConfig(f))
		fs.failures, fs.backoffUntil = 0, time.Time{}
	}
	pf := c.wireSpec(f)
	c.offerToAllLocked(f)
	c.publishLocked(func(b *briskv1.EndpointBatch) {
		b.DeletedFunctions = without(b.DeletedFunctions, f.Name)
		b.Functions = append(withoutFn(b.Functions, f.Name), pf)
	})
	c.boundDesiredLocked(fs)
	c.reconcileLocked(fs)
}

// removeFunction tombstones every sandbox of a deleted function.
func (c *Cluster) removeFunction(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fs := c.fns[name]
	if fs == nil {
		return
	}
	fs.deleted, fs.desired = true, 0
	delete(c.fns, name)
	c.publishLocked(func(b *briskv1.EndpointBatch) {
		b.Functions = withoutFn(b.Functions, name)
		b.DeletedFunctions = append(without(b.DeletedFunctions, name), name)
	})
	c.reconcileLocked(fs)
}

func (c *Cluster) boundDesiredLocked(fs *fnState) {
	s := fs.spec.Scaling
	if fs.desired < s.Min {
		fs.desired = s.Min
	}
	if maxScale := c.maxScaleLocked(fs); maxScale > 0 && fs.desired > maxScale {
		fs.desired = maxScale // an unbounded max is bounded by the operator's cap and the namespace's
	}
	if s.Max > 0 && fs.desired > s.Max {
		fs.desired = s.Max
	}
}

// ---------------------------------------------------------------- scaling

// recordMetrics feeds one data-plane report into the autoscalers. An urgent
// report for a function at zero scales it up at once (Knative's Poke).
func (c *Cluster) recordMetrics(r *briskv1.MetricsReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for _, m := range r.GetFunctions() {
		fs := c.fns[m.GetFunction()]
		if fs == nil {
			continue
		}
		if !r.GetUrgent() {
			fs.setLoad(r.GetDataPlaneId(), m.GetAvgConcurrency(), now)
			continue
		}
		if !m.GetNoCapacity() {
			continue
		}
		if fs.desired == 0 && m.GetQueued() > 0 {
			// Activation: a waiting request always gets a sandbox, and the
			// autoscaler keeps it for at least a stable window (Knative keeps
			// a freshly active revision at 1 as long). Its load arrives with
			// the next periodic report, so nothing is recorded here: that
			// would count the same request twice in one bucket.
			fs.kpa.Adopt(now, 1)
			fs.desired = 1
			c.boundDesiredLocked(fs)
		} else {
			c.decideLocked(fs, now) // all busy: let panic mode react now
			c.coverQueuedLocked(fs, now, int(m.GetQueued()))
		}
		c.reconcileLocked(fs)
	}
}

// coverQueuedLocked makes room for requests a data plane holds with every
// slot busy. That demand is here now, while the autoscaler sees it only in
// its next one-second sample and acts on it at the next tick (up to ~3 s
// later, plus a cold start, for every queued request: the tail of trace
// replays). Every busy ready sandbox stays, and each queued request beyond
// the slots already being created gets one; the scale is held for a stable
// window after the demand reaches the autoscaler's samples (Adopt), as the
// autoscaler would hold a scale it reached itself, so that a tick deciding
// on samples from before the burst does not remove the sandboxes.
// loadSampleLag bounds how long load takes to reach an autoscaler window:
// a data plane's periodic report (every second) and the once-a-second sample.
const loadSampleLag = 2 * time.Second

func (c *Cluster) coverQueuedLocked(fs *fnState, now time.Time, queued int) {
	if queued <= 0 || fs.deleted {
		return
	}
	ready := 0
	for _, r := range fs.sandboxes {
		if r.state == sbReady && r.rev == fs.spec.Revision && !r.withdrawn {
			ready++
		}
	}
	cc := max(fs.spec.Concurrency, 1)
	need := ready + (queued+cc-1)/cc
	if need <= fs.desired {
		return
	}
	prev := fs.desired
	fs.desired = need
	c.boundDesiredLocked(fs)
	if fs.desired > prev {
		// The demand reaches the autoscaler's window only with the next
		// report and sample: the hold starts when it does.
		fs.kpa.Adopt(now.Add(loadSampleLag), fs.desired)
		c.log.Debug("scale up for queued requests", "function", fs.spec.Name, "desired", fs.desired, "was", prev, "queued", queued, "ready", ready)
	}
}

func (c *Cluster) decideLocked(fs *fnState, now time.Time) {
	ready := 0
	for _, r := range fs.sandboxes {
		if r.state == sbReady && r.rev == fs.spec.Revision && !r.withdrawn {
			ready++
		}
	}
	d := fs.kpa.Decide(now, ready)
	prev := fs.desired
	fs.desired = d.Desired
	c.boundDesiredLocked(fs)
	if fs.desired != prev {
		c.log.Debug("scale decision", "function", fs.spec.Name, "desired", fs.desired, "was", prev, "ready", ready,
			"stable_avg", d.StableAvg, "panic_avg", d.PanicAvg, "panic", d.Panic, "no_data", d.NoData)
	}
	fs.panicking = d.Panic
}

type dpSample struct {
	dataPlane string
	load      float64
	at        time.Time
}

// setLoad records data plane dp's latest load.
func (fs *fnState) setLoad(dp string, load float64, now time.Time) {
	for i := range fs.dpLoad {
		if fs.dpLoad[i].dataPlane == dp {
			fs.dpLoad[i].load, fs.dpLoad[i].at = load, now
			return
		}
	}
	fs.dpLoad = append(fs.dpLoad, dpSample{dp, load, now})
}

// loadStaleAfter drops a data plane's report from the sum: data planes stop
// reporting a function once it is idle, and a data plane may be gone.
const loadStaleAfter = 2500 * time.Millisecond

// sampleLoad records each function's load, summed over data planes, into its
// autoscaler: exactly one observation per second. Recording reports as they
// arrive would put two reports of one data plane into one 1-second bucket
// whenever its ticker jitters across a second boundary, doubling the load.
func (c *Cluster) sampleLoad() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for _, fs := range c.fns {
		if sum, ok := fs.sumLoad(now); ok {
			fs.kpa.Record(now, sum)
		}
	}
}

// sumLoad drops stale data planes' reports and sums the rest; false if
// there was nothing to sum (no data plane has reported since the last
// sample found them all stale).
func (fs *fnState) sumLoad(now time.Time) (float64, bool) {
	if len(fs.dpLoad) == 0 {
		return 0, false
	}
	sum := 0.0
	fresh := fs.dpLoad[:0]
	for _, s := range fs.dpLoad {
		if now.Sub(s.at) <= loadStaleAfter {
			fresh = append(fresh, s)
			sum += s.load
		}
	}
	clear(fs.dpLoad[len(fresh):]) // no stale data plane ids kept alive
	if len(fresh) == 0 {
		fresh = nil
	}
	fs.dpLoad = fresh
	return sum, true
}

// tickChunk bounds how many functions one tick handles per hold of the
// cluster lock: a tick over 10,000 functions held it for tens of
// milliseconds at once, and every cold start waiting for the lock then (the
// urgent report, the Ready update) took that long longer (the cold-start
// p99 of bench cold came from these stalls, every 2 s).
const tickChunk = 128

// tick runs one autoscaling round over every function.
func (c *Cluster) tick() {
	c.mu.Lock()
	now := c.clk.Now()
	fns := make([]*fnState, 0, len(c.fns))
	for _, fs := range c.fns {
		fns = append(fns, fs)
	}
	c.mu.Unlock()
	for i := 0; i < len(fns); i += tickChunk {
		c.mu.Lock()
		for _, fs := range fns[i:min(i+tickChunk, len(fns))] {
			if fs.deleted {
				continue
			}
			// A zero marks the bucket as observed: data planes stop reporting
			// idle functions, and an unobserved window would hold the scale.
			fs.kpa.Record(now, 0)
			c.decideLocked(fs, now)
			c.reconcileLocked(fs)
		}
		c.mu.Unlock()
		// Let waiting reports and worker updates in: a mutex released and
		// taken again at once stays with its holder (Go mutexes hand over
		// only to waiters starved for 1 ms), so without this the chunks ran
		// back to back and cold starts waited out the whole tick.
		runtime.Gosched()
	}
	c.mu.Lock()
	c.checkNodesLocked(now)
	c.mu.Unlock()
}

// ---------------------------------------------------------------- reconcile

// reconcileLocked moves a function's sandboxes toward its desired count:
// place new ones, tombstone surplus ones, retire old revisions once the
// current revision serves.
func (c *Cluster) reconcileLocked(fs *fnState) {
	if c.paused {
		return
	}
	cur := fs.spec.Revision
	want := fs.desired
	if fs.deleted {
		want = 0
	}
	var active, readyCur int
	for _, r := range fs.sandboxes {
		if r.state != sbTombstoned && r.rev == cur {
			active++
			if r.state == sbReady {
				readyCur++
			}
		}
	}
	now := c.clk.Now()
	switch {
	case active < want && now.Before(fs.backoffUntil):
		c.armRetryLocked(fs, fs.backoffUntil.Sub(now))
	case active < want:
		fs.placeErr, fs.quotaErr = "", ""
		for ; active < want; active++ {
			if why := c.quotaRoomLocked(fs); why != "" {
				fs.quotaErr = why
				break
			}
			if err := c.placeLocked(fs); err != nil {
				c.metrics.placementFailures.Inc()
				c.log.Debug("placement failed", "function", fs.spec.Name, "err", err)
				fs.placeErr = c.noRoomMessage(fs, err)
				c.armRetryLocked(fs, 500*time.Millisecond)
				break
			}
		}
	case active > want:
		fs.placeErr, fs.quotaErr = "", ""
		for _, r := range c.victimsLocked(fs, active-want) {
			c.tombstoneLocked(r)
		}
	default:
		fs.placeErr, fs.quotaErr = "", ""
	}
	c.refreshConditionLocked(fs)
	if readyCur >= want || fs.deleted {
		for _, r := range fs.sandboxes {
			if r.rev != cur && r.state != sbTombstoned {
				c.tombstoneLocked(r)
			}
		}
	}
}

// armRetryLocked reconciles the function again after d (placement found no
// room, or a crash-loop backoff is running).
func (c *Cluster) armRetryLocked(fs *fnState, d time.Duration) {
	if fs.retryArmed {
		return
	}
	fs.retryArmed = true
	time.AfterFunc(d, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		fs.retryArmed = false
		if !fs.deleted {
			c.reconcileLocked(fs)
		}
	})
}

// victimsLocked picks n current-revision sandboxes to remove: ones not yet
// serving first (no request is lost), then the newest ready ones.
func (c *Cluster) victimsLocked(fs *fnState, n int) []*sandboxRec {
	var cands []*sandboxRec
	for _, r := range fs.sandboxes {
		if r.state != sbTombstoned && r.rev == fs.spec.Revision {
			cands = append(cands, r)
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		if (cands[i].state == sbReady) != (cands[j].state == sbReady) {
			return cands[j].state == sbReady
		}
		return cands[i].created.After(cands[j].created)
	})
	return cands[:min(n, len(cands))]
}

// placeLocked chooses a node for one new sandbox and sends the Create.
func (c *Cluster) placeLocked(fs *fnState) error {
	req := placement.Resources{MilliCPU: fs.spec.Resources.MilliCPU, MemoryMB: fs.spec.Resources.MemoryMB}
	idx, err := c.placer.Place(c.place, placement.Request{Resources: req, Key: fs.spec.Name, Now: c.clk.Now()})
	if err != nil {
		return err
	}
	n := c.nodeList[idx]
	if n.sess == nil {
		return errors.New("placement chose a node without a session") // invariant: unschedulable
	}
	r := &sandboxRec{id: c.newID(), fn: fs, rev: fs.spec.Revision, node: n, state: sbAssumed, created: c.clk.Now(),
		milliCPU: req.MilliCPU, memoryMB: req.MemoryMB}
	fs.sandboxes[r.id] = r
	n.sandboxes[r.id] = r
	c.chargeLocked(r, 1)
	c.place[idx].Requested.MilliCPU += req.MilliCPU
	c.place[idx].Requested.MemoryMB += req.MemoryMB
	c.place[idx].Sandboxes++
	n.sess.create(fs.spec, r.id)
	c.metrics.creations.Inc()
	return nil
}

// tombstoneLocked withdraws a sandbox from data planes now and tells its
// worker to terminate it after the drain delay, so requests already routed
// to it can finish.
func (c *Cluster) tombstoneLocked(r *sandboxRec) {
	if r.state == sbTombstoned {
		return
	}
	if r.state == sbReady && !r.withdrawn {
		c.publishRemoveLocked(r.id)
	}
	r.state = sbTombstoned
	if s := r.node.sess; s != nil {
		s.tombstone(r.id, c.cfg.DrainDelay)
	}
}

// dropLocked forgets a sandbox that is gone (or invalid) and frees its
// resources in the placement view.
func (c *Cluster) dropLocked(r *sandboxRec) {
	if r.state == sbReady && !r.withdrawn {
		c.publishRemoveLocked(r.id)
	}
	delete(r.fn.sandboxes, r.id)
	delete(r.node.sandboxes, r.id)
	c.chargeLocked(r, -1)
	p := &c.place[r.node.idx]
	p.Requested.MilliCPU -= r.milliCPU
	p.Requested.MemoryMB -= r.memoryMB
	p.Sandboxes--
}

// ---------------------------------------------------------------- updates

// applyUpdateLocked folds one worker record (a soft invalidation) into the
// table. Records carry versions; stale ones are ignored.
func (c *Cluster) applyUpdateLocked(n *nodeState, u *briskv1.SandboxRecord) {
	if _, inv := n.invalid[u.GetId()]; inv {
		n.invalid[u.GetId()] = n.gen // traffic for the id: keep the mark a session longer
		return
	}
	r := n.sandboxes[u.GetId()]
	if r == nil {
		if !terminal(u.GetState()) {
			c.adoptLocked(n, u)
		}
		return
	}
	if u.GetVersion() != 0 && u.GetVersion() <= r.version {
		return
	}
	r.version = u.GetVersion()
	switch u.GetState() {
	case briskv1.SandboxState_SANDBOX_STATE_CREATING:
		if r.state == sbAssumed {
			r.state = sbPending
		}
	case briskv1.SandboxState_SANDBOX_STATE_READY:
		r.addr = u.GetAddress()
		if r.state == sbAssumed || r.state == sbPending {
			r.state = sbReady
			r.fn.failures = 0
			c.publishAddLocked(r)
			c.refreshConditionLocked(r.fn)
			c.metrics.readyLatency.Observe(c.clk.Now().Sub(r.created).Seconds())
		} else if r.state == sbReady {
			c.verifiedLocked(r)
		}
	case briskv1.SandboxState_SANDBOX_STATE_TERMINATING:
		if r.state != sbTombstoned { // the worker gave up on it on its own
			if r.state == sbReady {
				c.publishRemoveLocked(r.id)
			}
			r.state = sbTombstoned
			c.reconcileLocked(r.fn)
		}
	default: // gone, failed, exited
		failed := r.state != sbTombstoned
		c.dropLocked(r)
		if failed && !r.fn.deleted {
			c.noteFailureLocked(r.fn, u)
		}
		c.reconcileLocked(r.fn)
	}
}

// noteFailureLocked backs off creation for a function whose sandboxes keep
// dying, so a crash-looping command cannot hammer a worker.
func (c *Cluster) noteFailureLocked(fs *fnState, u *briskv1.SandboxRecord) {
	fs.failures++
	fs.lastFailure = u.GetMessage()
	d := c.cfg.FailureBackoff << min(fs.failures-1, 10)
	d = min(d, c.cfg.MaxFailureBackoff)
	fs.backoffUntil = c.clk.Now().Add(d)
	c.metrics.sandboxFailures.WithLabelValues(fs.spec.Name).Inc()
	c.log.Warn("sandbox failed", "function", fs.spec.Name, "sandbox", u.GetId(), "state", u.GetState().String(),
		"reason", u.GetMessage(), "backoff", d)
}

// adoptLocked takes a sandbox the worker reports but the control plane does
// not know (recover mode, or created by an earlier leader).
func (c *Cluster) adoptLocked(n *nodeState, u *briskv1.SandboxRecord) {
	fs := c.fns[u.GetFunction()]
	r := &sandboxRec{id: u.GetId(), rev: u.GetRevision(), node: n, version: u.GetVersion(), addr: u.GetAddress(), created: c.clk.Now()}
	if fs == nil { // function deleted meanwhile: terminate it
		if n.sess != nil {
			n.sess.tombstone(r.id, 0)
		}
		return
	}
	r.fn = fs
	r.milliCPU, r.memoryMB = fs.spec.Resources.MilliCPU, fs.spec.Resources.MemoryMB
	fs.sandboxes[r.id] = r
	n.sandboxes[r.id] = r
	c.chargeLocked(r, 1)
	p := &c.place[n.idx]
	p.Requested.MilliCPU += fs.spec.Resources.MilliCPU
	p.Requested.MemoryMB += fs.spec.Resources.MemoryMB
	p.Sandboxes++
	switch u.GetState() {
	case briskv1.SandboxState_SANDBOX_STATE_READY:
		r.state = sbReady
		c.publishAddLocked(r)
	case briskv1.SandboxState_SANDBOX_STATE_TERMINATING:
		r.state = sbTombstoned
	default:
		r.state = sbPending
	}
}

func terminal(s briskv1.SandboxState) bool {
	switch s {
	case briskv1.SandboxState_SANDBOX_STATE_GONE, briskv1.SandboxState_SANDBOX_STATE_FAILED, briskv1.SandboxState_SANDBOX_STATE_EXITED:
		return true
	}
	return false
}

// ---------------------------------------------------------------- nodes

// registerNode creates or refreshes a node from its durable record.
func (c *Cluster) registerNode(w *store.Worker) (n *nodeState, startLink bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n = c.nodes[w.ID]
	if n == nil {
		n = &nodeState{id: w.ID, rec: w, idx: len(c.nodeList), sandboxes: make(map[string]*sandboxRec), invalid: make(map[string]uint64)}
		c.nodes[w.ID] = n
		c.nodeList = append(c.nodeList, n)
		c.place = append(c.place, placement.Node{ID: w.ID})
	}
	n.rec = w
	p := &c.place[n.idx]
	p.Allocatable = placement.Resources{MilliCPU: w.Capacity.MilliCPU, MemoryMB: w.Capacity.MemoryMB}
	p.MaxSandboxes = w.MaxSandboxes
	startLink = !n.managed
	n.managed = true
	return n, startLink
}

// checkNodesLocked fences nodes whose link has been down longer than the
// grace period: their sandboxes are counted gone and replaced elsewhere, and
// the node must drain before it takes work again (docs/reliability.md, case 16).
// withdrawNodeLocked takes a node whose link just went down out of load
// balancing at once: data planes stop routing to its sandboxes. The records
// stay until the node's next handshake restores what still runs, or until
// NodeGrace passes and checkNodesLocked fences the node and replaces them.
func (c *Cluster) withdrawNodeLocked(n *nodeState) {
	withdrawn := 0
	for _, r := range n.sandboxes {
		if r.withdrawn || r.state == sbTombstoned {
			continue
		}
		if r.state == sbReady {
			c.publishRemoveLocked(r.id)
			withdrawn++
		}
		r.withdrawn = true
	}
	if withdrawn > 0 {
		c.log.Warn("worker link down: its sandboxes are out of load balancing", "node", n.rec.ID, "sandboxes", withdrawn)
	}
}

// restoreNodeLocked undoes withdrawNodeLocked for the sandboxes the node
// still reports (called by the handshake, after dropping the others).
func (c *Cluster) restoreNodeLocked(n *nodeState) {
	for _, r := range n.sandboxes {
		if !r.withdrawn {
			continue
		}
		r.withdrawn = false
		if r.state == sbReady {
			c.publishAddLocked(r)
		}
	}
}

func (c *Cluster) checkNodesLocked(now time.Time) {
	for _, n := range c.nodeList {
		if n.sess != nil || n.downSince.IsZero() || now.Sub(n.downSince) < c.cfg.NodeGrace || len(n.sandboxes) == 0 {
			continue
		}
		c.log.Warn("worker unreachable past the grace period: replacing its sandboxes", "node", n.rec.ID, "sandboxes", len(n.sandboxes))
		n.rec.Drain = true
		c.persistDrain(n.rec)
		fns := map[*fnState]struct{}{}
		for _, r := range n.sandboxes {
			n.invalid[r.id] = n.gen
			fns[r.fn] = struct{}{}
			c.dropLocked(r)
		}
		for fs := range fns {
			c.reconcileLocked(fs)
		}
	}
}

// ---------------------------------------------------------------- status

func (c *Cluster) functionStatus(name string) (FunctionStatus, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fs := c.fns[name]
	if fs == nil {
		return FunctionStatus{}, false
	}
	return fs.statusLocked(), true
}

func (fs *fnState) statusLocked() FunctionStatus {
	st := FunctionStatus{Desired: fs.desired, LastFailure: fs.lastFailure, Condition: fs.cond.reason, Message: fs.cond.message, Sandboxes: []SandboxStatus{}}
	for _, r := range fs.sandboxes {
		switch r.state {
		case sbReady:
			st.Ready++
		case sbTombstoned:
			st.Terminating++
		default:
			st.Pending++
		}
		st.Sandboxes = append(st.Sandboxes, SandboxStatus{ID: r.id, Node: r.node.rec.ID, State: r.state.String(), Address: r.addr, Revision: r.rev})
	}
	sort.Slice(st.Sandboxes, func(i, j int) bool { return st.Sandboxes[i].ID < st.Sandboxes[j].ID })
	return st
}

func (c *Cluster) nodeStatus() []NodeStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	out := make([]NodeStatus, 0, len(c.nodeList))
	for _, n := range c.nodeList {
		p := c.place[n.idx]
		ns := NodeStatus{ID: n.rec.ID, Address: n.rec.Address, Runtime: n.rec.Runtime, Connected: n.sess != nil,
			Drain: n.rec.Drain, Sandboxes: len(n.sandboxes), Capacity: n.rec.Capacity,
			Requested: spec.Resources{MilliCPU: p.Requested.MilliCPU, MemoryMB: p.Requested.MemoryMB}, HeartbeatMs: -1}
		if !n.lastHeartbeat.IsZero() {
			ns.HeartbeatMs = now.Sub(n.lastHeartbeat).Milliseconds()
		}
		if hb := n.heartbeat; hb != nil {
			ns.Used = spec.Resources{MilliCPU: hb.GetUsed().GetMilliCpu(), MemoryMB: hb.GetUsed().GetMemoryMb()}
			if em := hb.GetEmergency(); em.GetSlots() > 0 {
				ns.Emergency = &EmergencyStatus{Slots: int(em.GetSlots()), InUse: int(em.GetInUse()), Started: em.GetStarted(), Failed: em.GetFailed(),
					MemoryMBSeconds: em.GetMemoryMbSeconds()}
			}
		}
		out = append(out, ns)
	}
	return out
}

func without(list []string, s string) []string {
	out := list[:0]
	for _, v := range list {
		if v != s {
			out = append(out, v)
		}
	}
	return out
}

func withoutFn(list []*briskv1.FunctionSpec, name string) []*briskv1.FunctionSpec {
	out := list[:0]
	for _, v := range list {
		if v.GetName() != name {
			out = append(out, v)
		}
	}
	return out
}

// maybeResumeLocked ends the startup pause once every known worker has
// answered its handshake (or the grace period has passed, see Run): until
// then placing sandboxes could duplicate ones not yet reported.
func (c *Cluster) maybeResumeLocked() {
	if !c.paused {
		return
	}
	for _, n := range c.nodeList {
		if n.sess == nil && !n.rec.Drain {
			return
		}
	}
	c.resumeLocked("every worker answered")
}

func (c *Cluster) resumeLocked(why string) {
	if !c.paused {
		return
	}
	c.paused = false
	c.log.Info("scheduling resumed", "why", why)
	for _, fs := range c.fns {
		c.reconcileLocked(fs)
	}
}

// persistDrain writes a node's drain mark durably, off the caller's lock.
func (c *Cluster) persistDrain(w *store.Worker) {
	rec := *w
	go func() {
		if err := c.store.PutWorker(&rec); err != nil {
			c.log.Error("persisting drain mark", "node", rec.ID, "err", err)
		}
	}()
}

// noRoomMessage explains a failed placement for people.
func (c *Cluster) noRoomMessage(fs *fnState, err error) string {
	if !errors.Is(err, placement.ErrNoCapacity) {
		return err.Error()
	}
	connected := 0
	for _, n := range c.nodeList {
		if n.sess != nil && !n.rec.Drain {
			connected++
		}
	}
	if connected == 0 {
		return "no worker node is connected"
	}
	return fmt.Sprintf("no node has room for a sandbox (cpu %dm, memory %d MiB; %d nodes connected)",
		fs.spec.Resources.MilliCPU, fs.spec.Resources.MemoryMB, connected)
}

// conditionLocked says why fs lacks sandboxes, if anything is wrong: no
// node has room for the next one, or its starts keep failing and none is
// ready.
func (fs *fnState) conditionLocked() fnCondition {
	if fs.deleted {
		return fnCondition{}
	}
	if fs.quotaErr != "" {
		return fnCondition{condQuotaExceeded, fs.quotaErr}
	}
	if fs.placeErr != "" {
		return fnCondition{condNoCapacity, fs.placeErr}
	}
	if fs.failures > 0 {
		for _, r := range fs.sandboxes {
			if r.state == sbReady && r.rev == fs.spec.Revision {
				return fnCondition{}
			}
		}
		return fnCondition{condFunctionFailing, fmt.Sprintf("%d sandbox starts failed in a row, the last: %s", fs.failures, fs.lastFailure)}
	}
	return fnCondition{}
}

// refreshConditionLocked publishes fs's condition to data planes when it
// changed.
func (c *Cluster) refreshConditionLocked(fs *fnState) {
	cond := fs.conditionLocked()
	if cond == fs.cond {
		return
	}
	fs.cond = cond
	pc := &briskv1.FunctionCondition{Function: fs.spec.Name, Reason: cond.reason, Message: cond.message}
	c.publishLocked(func(b *briskv1.EndpointBatch) {
		for i, old := range b.Conditions {
			if old.GetFunction() == pc.Function {
				b.Conditions[i] = pc
				return
			}
		}
		b.Conditions = append(b.Conditions, pc)
	})
}

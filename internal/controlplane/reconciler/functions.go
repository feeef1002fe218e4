package reconciler

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/pkg/spec"
)

type fnState struct {
	spec    *spec.Function
	kpa     *autoscale.KPA
	desired int
	// sandboxes holds every live record of the function, tombstoned included.
	sandboxes map[string]*sandboxRec
	deleted   bool
	pos       int // index in Reconciler.order

	// dpLoad is each data plane's latest reported load (a level, sampled
	// into the autoscaler once a second). A slice, not a map: a cluster has
	// a few data planes, and one small map per function was the largest
	// part of the control plane's live heap with 10,000 functions.
	dpLoad []dpSample
	loaded bool // in Reconciler.loaded, the functions sampleLoad visits
	// rate is the function's invocation rate (calls/s) over the data
	// planes' last reports, for the locality policies' popularity.
	rate float64

	panicking bool // the autoscaler's last decision was in panic mode

	failures     int       // consecutive failed starts
	backoffUntil time.Time // no new creates before this (crash-loop protection)
	lastFailure  string
	retryArmed   bool
	// minStarved: the function lacks sandboxes of its scaling.min and
	// found no room for them; until it has them, no other function
	// places sandboxes beyond its own min (Reconciler.minStarved).
	minStarved bool

	// keep-alive: when the function last had calls, what a cold start of
	// it takes (created to ready), and since when it has held sandboxes
	// beyond its demand (gd; zero while it does not).
	lastUsed     time.Time
	coldStart    time.Duration
	surplusSince time.Time
	yieldedAt    time.Time // when it last gave idle sandboxes up (evictOn)

	placeErr string // why the last placement found no node ("": it did not fail)
	// full: the last placement failed for room on connected nodes, and no
	// room can come by itself (roomMayCome); not for want of a connected
	// node, which a worker restart or a cluster's start also brings, nor
	// for room held by calls, which end: calls wait those out.
	full     bool
	quotaErr string // why its namespace's quota has no room for the next sandbox
	// cond is the condition last published to data planes.
	cond fnCondition
}

type fnCondition struct {
	reason, message string
	failures        int
	// none: the function has no sandbox of its current revision, even one
	// starting, so a call waiting for one could only time out.
	none bool
}

// FailFastAfter is how many sandbox starts of a function must fail in a row
// before data planes answer its calls at once with the cause (503
// function-failing) instead of letting them wait for a sandbox; the control
// plane goes on retrying with back-off, and a start that succeeds clears it.
const FailFastAfter = 3

// failFast says whether data planes answer a call that finds no sandbox at
// once: the function's starts keep failing, or no node has room for its
// first sandbox and none can come by itself: the room is held by other
// functions' min sandboxes, or the function asks more than a node has (a
// call would wait out its queue timeout for nothing; the control plane
// goes on retrying, and room that appears clears the condition). Room held
// by other functions' calls, or by sandboxes still starting, comes back
// when they end or go idle: calls wait for it.
func (c fnCondition) failFast() bool {
	switch c.reason {
	case CondFunctionFailing:
		return c.failures >= FailFastAfter
	case CondNoCapacity:
		return c.none
	}
	return false
}

// Reasons a function lacks sandboxes, as data planes get them.
const (
	CondNoCapacity      = "no-capacity"
	CondFunctionFailing = "function-failing"
	CondQuotaExceeded   = "quota-exceeded"
)

type dpSample struct {
	dataPlane      string
	load, requests float64
	at             time.Time // of load and requests (periodic reports)
	// inFlight and queued are the calls running in the function's
	// sandboxes and waiting for one as of inFlightAt (periodic and urgent
	// reports).
	inFlight, queued int32
	inFlightAt       time.Time
	// skipLoad: the function yielded since this data plane's last periodic
	// report, so its next one covers load from before the yield, which the
	// autoscaler must not count (it would take the room back).
	skipLoad bool
}

// KPAConfig is f's autoscaler configuration: the cluster defaults with the
// spec's overrides, and sync mode's peak holding.
func (c *Reconciler) KPAConfig(f *spec.Function) autoscale.Config {
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
	ka := time.Duration(s.KeepAlive)
	switch {
	case c.ModeOf(f) == spec.ModeSync:
		if ka <= 0 {
			ka = KeepAlive(k)
		}
		k = autoscale.SyncConfig(k, ka)
	case ka > 0 && c.KeepAlivePolicyOf(f) == spec.KeepAliveTTL:
		k.ScaleDownDelay = ka // Knative's scale-down delay: the highest scale of the last ka is kept
	}
	return k
}

// KeepAlive is how long an idle sandbox lives under k: the stable window
// plus the scale-down delay and the scale-to-zero grace (sync mode holds
// its peak for the delay).
func KeepAlive(k autoscale.Config) time.Duration {
	if k.HoldPeaks {
		return k.ScaleDownDelay
	}
	return k.StableWindow + k.ScaleDownDelay + k.ScaleToZeroGrace
}

// KeepAliveOf is how long an idle sandbox of f lives with no memory
// pressure.
func (c *Reconciler) KeepAliveOf(f *spec.Function) time.Duration {
	if c.holdsIdle(f) {
		return gdKeepAlive(f) // hybrid: the most it keeps one (its fallback)
	}
	return KeepAlive(c.KPAConfig(f))
}

// ModeOf is f's effective scaling mode.
func (c *Reconciler) ModeOf(f *spec.Function) string {
	if f.Scaling.Mode != "" {
		return f.Scaling.Mode
	}
	return c.cfg.ScalingMode
}

// PlacementOf is f's effective placement policy name.
func (c *Reconciler) PlacementOf(f *spec.Function) string {
	if f.Placement != "" {
		return f.Placement
	}
	if c.cfg.Placement != "" {
		return c.cfg.Placement
	}
	return placement.NameKubernetes
}

// Publish is f as data planes and workers get it: the spec with the
// effective scaling mode, load balancing and the keep-alive of an idle
// regular sandbox.
func (c *Reconciler) Publish(f *spec.Function) Published {
	p := Published{Spec: f, ScalingMode: c.ModeOf(f), KeepAlive: c.KeepAliveOf(f), LoadBalancing: f.LoadBalancing}
	if p.LoadBalancing == "" {
		p.LoadBalancing = c.cfg.LoadBalancing
	}
	return p
}

func (c *Reconciler) upsertFunction(now time.Time, f *spec.Function) {
	fs := c.fns[f.Name]
	if fs == nil {
		fs = &fnState{spec: f, kpa: autoscale.NewKPA(c.KPAConfig(f), now)} // sandboxes: made by addRecord
		c.fns[f.Name] = fs
		fs.pos = len(c.order)
		c.order = append(c.order, fs)
		c.names = append(c.names, f.Name)
		fs.desired = f.Scaling.Min
	} else {
		fs.spec = f
		fs.kpa.SetConfig(c.KPAConfig(f))
		fs.failures, fs.backoffUntil = 0, time.Time{}
	}
	c.offerToAll(f)
	c.emit(PublishFunction{c.Publish(f)})
	c.boundDesired(fs)
	c.reconcile(now, fs)
}

func (c *Reconciler) removeFunction(now time.Time, name string) {
	fs := c.fns[name]
	if fs == nil {
		return
	}
	fs.deleted, fs.desired = true, 0
	c.setMinStarved(fs, false)
	delete(c.fns, name)
	last := c.order[len(c.order)-1]
	c.order[fs.pos], last.pos = last, fs.pos
	c.names[fs.pos] = last.spec.Name
	c.order[len(c.order)-1] = nil
	c.order = c.order[:len(c.order)-1]
	c.names = c.names[:len(c.names)-1]
	c.emit(DeleteFunction{name})
	c.keep.Forget(name)
	c.hybrid.Forget(name)
	c.reconcile(now, fs)
}

func (c *Reconciler) boundDesired(fs *fnState) {
	fs.desired = min(max(fs.desired, fs.spec.Scaling.Min), c.scaleCap(fs))
}

// scaleCap is the most sandboxes fs may have: its scaling.max, the
// operator's cap and its namespace's, whichever is lowest (none set:
// unbounded).
func (c *Reconciler) scaleCap(fs *fnState) int {
	limit := math.MaxInt
	if m := c.maxScale(fs); m > 0 {
		limit = m
	}
	if m := fs.spec.Scaling.Max; m > 0 {
		limit = min(limit, m)
	}
	return limit
}

// ---------------------------------------------------------------- scaling

// loadSampleLag bounds how long load takes to reach an autoscaler window:
// a data plane's periodic report (every second) and the once-a-second sample.
const loadSampleLag = 2 * time.Second

// loadStaleAfter drops a data plane's report from the sum: data planes stop
// reporting a function once it is idle, and a data plane may be gone.
const loadStaleAfter = 2500 * time.Millisecond

func (c *Reconciler) recordMetrics(now time.Time, r *LoadReport) {
	dp := r.DataPlane
	if len(c.draining) > 0 {
		c.recordDraining(now, dp, r.Draining)
	}
	if r.Urgent {
		c.recordInFlight(now, dp, r.Functions)
	}
	for i := range r.Functions {
		m := &r.Functions[i]
		fs := c.fns[m.Function]
		if fs == nil {
			continue
		}
		if !r.Urgent {
			c.setInFlight(fs, dp, m.InFlight, m.Queued, now)
			iv := r.Interval.Seconds()
			req := 0.0
			if iv > 0 {
				req = float64(m.Requests) / iv
			}
			c.setLoad(fs, dp, m.AvgConcurrency, req, now)
			c.touch(now, fs, m.Requests)
			continue
		}
		if !m.NoCapacity {
			continue
		}
		if fs.desired == 0 && m.Queued > 0 {
			// Activation: a waiting request always gets a sandbox, and the
			// autoscaler keeps it for at least a stable window (Knative keeps
			// a freshly active revision at 1 as long). Its load arrives with
			// the next periodic report, so nothing is recorded here: that
			// would count the same request twice in one bucket.
			fs.kpa.Adopt(now, 1)
			fs.desired = 1
			c.boundDesired(fs)
			if fs.readyCurrent() > 0 { // gd kept sandboxes at zero demand, all busy now
				c.coverQueued(fs, now, m.Queued)
			}
		} else {
			c.decide(fs, now) // all busy: let panic mode react now
			c.coverQueued(fs, now, m.Queued)
		}
		c.reconcile(now, fs)
	}
}

// coverQueued makes room for requests a data plane holds with every slot
// busy. That demand is here now, while the autoscaler sees it only in its
// next one-second sample and acts on it at the next tick (up to ~3 s later,
// plus a cold start, for every queued request: the tail of trace replays).
// Every busy ready sandbox stays, and each queued request beyond the slots
// already being created gets one; the scale is held for a stable window
// after the demand reaches the autoscaler's samples (Adopt), as the
// autoscaler would hold a scale it reached itself, so that a tick deciding
// on samples from before the burst does not remove the sandboxes.
func (c *Reconciler) coverQueued(fs *fnState, now time.Time, queued int) {
	if queued <= 0 || fs.deleted {
		return
	}
	ready := fs.readyCurrent()
	cc := max(fs.spec.Concurrency, 1)
	need := ready + (queued+cc-1)/cc
	if need <= fs.desired {
		return
	}
	prev := fs.desired
	fs.desired = need
	c.boundDesired(fs)
	if fs.desired > prev {
		fs.kpa.Adopt(now.Add(loadSampleLag), fs.desired)
		c.log.Debug("scale up for queued requests", "function", fs.spec.Name, "desired", fs.desired, "was", prev, "queued", queued, "ready", ready)
	}
}

// activeCurrent counts fs's sandboxes of its current revision that are not
// on their way out (starting or ready).
func (fs *fnState) activeCurrent() int {
	n := 0
	for _, r := range fs.sandboxes {
		if r.state != sbTombstoned && r.rev == fs.spec.Revision {
			n++
		}
	}
	return n
}

func (fs *fnState) readyCurrent() int {
	ready := 0
	for _, r := range fs.sandboxes {
		if r.state == sbReady && r.rev == fs.spec.Revision && !r.withdrawn {
			ready++
		}
	}
	return ready
}

func (c *Reconciler) decide(fs *fnState, now time.Time) {
	ready := fs.readyCurrent()
	if ready > fs.desired && c.holdsIdle(fs.spec) {
		// Idle sandboxes gd keeps are a cache, not the autoscaler's scale:
		// counted as ready they would slow its scale-down (rate limits).
		ready = fs.desired
	}
	d := fs.kpa.Decide(now, ready)
	if p := c.cfg.Predictor; p != nil {
		if conc, ok := p.Predict(now, fs.spec.Name); ok {
			k := c.KPAConfig(fs.spec)
			d = autoscale.WithPrediction(d, conc, k.TargetConcurrency, k.MaxScale)
		}
	}
	if c.hybridPrewarms(now, fs) {
		k := c.KPAConfig(fs.spec)
		d = autoscale.WithPrediction(d, 1, k.TargetConcurrency, k.MaxScale)
	}
	prev := fs.desired
	fs.desired = d.Desired
	c.boundDesired(fs)
	if fs.desired != prev {
		c.log.Debug("scale decision", "function", fs.spec.Name, "desired", fs.desired, "was", prev, "ready", ready,
			"stable_avg", d.StableAvg, "panic_avg", d.PanicAvg, "panic", d.Panic, "no_data", d.NoData)
	}
	fs.panicking = d.Panic
}

func (c *Reconciler) setLoad(fs *fnState, dp string, load, rate float64, now time.Time) {
	s := c.sample(fs, dp)
	if s.skipLoad || (s.at.IsZero() && now.Sub(fs.yieldedAt) <= loadStaleAfter) {
		load, s.skipLoad = 0, false
	}
	s.load, s.requests, s.at = load, rate, now
}

// forgetLoad drops the load fs's data planes have reported, and the load of
// each one's next periodic report: fs yielded its idle sandboxes.
func (fs *fnState) forgetLoad(now time.Time) {
	fs.yieldedAt = now
	for i := range fs.dpLoad {
		s := &fs.dpLoad[i]
		s.load, s.skipLoad = 0, true
	}
}

// sample is dp's entry in fs.dpLoad, added if missing.
func (c *Reconciler) sample(fs *fnState, dp string) *dpSample {
	for i := range fs.dpLoad {
		if fs.dpLoad[i].dataPlane == dp {
			return &fs.dpLoad[i]
		}
	}
	if !fs.loaded {
		fs.loaded = true
		c.loaded = append(c.loaded, fs)
	}
	fs.dpLoad = append(fs.dpLoad, dpSample{dataPlane: dp})
	return &fs.dpLoad[len(fs.dpLoad)-1]
}

// setInFlight records dp's counts of fs's calls in flight and queued at
// now.
func (c *Reconciler) setInFlight(fs *fnState, dp string, inFlight, queued int, now time.Time) {
	if inFlight <= 0 && queued <= 0 && len(fs.dpLoad) == 0 {
		return
	}
	s := c.sample(fs, dp)
	s.inFlight, s.queued, s.inFlightAt = int32(max(inFlight, 0)), int32(max(queued, 0)), now
}

// recordInFlight takes an urgent report's calls in flight and queued: it
// lists the functions whose counts changed since dp last reported them
// (and the waiting ones), so the others stand as last reported. A report
// costs its own length, not the number of busy functions: a data plane
// sends one whenever a call waits.
func (c *Reconciler) recordInFlight(now time.Time, dp string, ms []FunctionLoad) {
	for i := range ms {
		if fs := c.fns[ms[i].Function]; fs != nil {
			c.setInFlight(fs, dp, ms[i].InFlight, ms[i].Queued, now)
		}
	}
}

// sampleLoad records each function's load, summed over data planes, into its
// autoscaler: exactly one observation per second. Recording reports as they
// arrive would put two reports of one data plane into one 1-second bucket
// whenever its ticker jitters across a second boundary, doubling the load.
//
// Only the functions some data plane has reported are visited (c.loaded):
// walking every function each second cost 20 ms a second at 40,000.
func (c *Reconciler) sampleLoad(now time.Time) {
	kept := c.loaded[:0]
	for _, fs := range c.loaded {
		if fs.deleted {
			fs.loaded = false
			continue
		}
		if sum, ok := fs.sumLoad(now); ok {
			fs.kpa.Record(now, sum)
		}
		if len(fs.dpLoad) == 0 {
			fs.loaded = false // its rate is 0 now, as sumLoad leaves it
			continue
		}
		kept = append(kept, fs)
	}
	clear(c.loaded[len(kept):])
	c.loaded = kept
}

// sumLoad drops stale data planes' reports and sums the rest; false if
// there was nothing to sum.
func (fs *fnState) sumLoad(now time.Time) (float64, bool) {
	if len(fs.dpLoad) == 0 {
		fs.rate = 0
		return 0, false
	}
	sum, rate := 0.0, 0.0
	fresh := fs.dpLoad[:0]
	for _, s := range fs.dpLoad {
		loadFresh := now.Sub(s.at) <= loadStaleAfter
		if loadFresh || now.Sub(s.inFlightAt) <= loadStaleAfter {
			fresh = append(fresh, s)
		}
		if loadFresh {
			sum += s.load
			rate += s.requests
		}
	}
	clear(fs.dpLoad[len(fresh):]) // no stale data plane ids kept alive
	if len(fresh) == 0 {
		fresh = nil
	}
	fs.dpLoad, fs.rate = fresh, rate
	return sum, true
}

// FunctionNames lists every function, for chunked ticks: a copy of
// c.names (gathering the names from c.order took ~20 ms at 40,000
// functions, a cache miss each).
func (c *Reconciler) FunctionNames() []string { return slices.Clone(c.names) }

func (c *Reconciler) tick(now time.Time, names []string) {
	step := func(fs *fnState) {
		// A zero marks the bucket as observed: data planes stop reporting
		// idle functions, and an unobserved window would hold the scale.
		fs.kpa.Record(now, 0)
		c.decide(fs, now)
		c.reconcile(now, fs)
	}
	if names == nil {
		for _, fs := range c.order {
			step(fs)
		}
		return
	}
	for _, name := range names {
		if fs := c.fns[name]; fs != nil {
			step(fs)
		}
	}
}

// ---------------------------------------------------------------- reconcile

// reconcile moves a function's sandboxes toward its desired count: place
// new ones, tombstone surplus ones, retire old revisions once the current
// revision serves.
func (c *Reconciler) reconcile(now time.Time, fs *fnState) {
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
	switch {
	case active < want && now.Before(fs.backoffUntil):
		c.armRetry(fs, fs.backoffUntil)
	case active < want:
		fs.placeErr, fs.quotaErr = "", ""
		for ; active < want; active++ {
			if why := c.quotaRoom(fs); why != "" {
				fs.quotaErr = why
				break
			}
			if active >= fs.spec.Scaling.Min && c.minStarved > 0 && !fs.minStarved {
				// Room goes first to functions below their min: the
				// scale-out waits for them (evictFor's forMin).
				c.armRetry(fs, now.Add(500*time.Millisecond))
				break
			}
			if err := c.place1(now, fs); err != nil {
				coming := false // room, from evicted sandboxes
				if errors.Is(err, placement.ErrNoCapacity) {
					coming = c.evictFor(now, fs, want-active, false)
					if !coming && active < fs.spec.Scaling.Min && c.evictFor(now, fs, min(want, fs.spec.Scaling.Min)-active, true) {
						// Other functions' sandboxes beyond their min make
						// room for this one's min; until it has it, their
						// scale-out waits, or it would take the room back.
						c.setMinStarved(fs, true)
						coming = true
					}
				}
				if coming {
					// Not a failure to report: a retry once they are gone.
					c.armRetry(fs, now.Add(c.cfg.DrainDelay+100*time.Millisecond))
					break
				}
				c.stats.PlacementFailures++
				c.log.Debug("placement failed", "function", fs.spec.Name, "err", err)
				fs.placeErr = c.noRoomMessage(fs, err)
				fs.full = errors.Is(err, placement.ErrNoCapacity) && c.connectedNodes() > 0 && !c.roomMayCome(fs)
				c.armRetry(fs, now.Add(500*time.Millisecond))
				break
			}
		}
	case active > want:
		fs.placeErr, fs.quotaErr = "", ""
		n := active - want
		if c.holdSurplus(now, fs) {
			kept := c.scaleCap(fs) // gd: idle ones kept, within the function's bounds
			if c.KeepAlivePolicyOf(fs.spec) == spec.KeepAliveHybrid {
				kept = max(want, 1) // hybrid keeps the function loaded: one sandbox
			}
			n = active - kept
			if n <= 0 {
				break
			}
		}
		for _, r := range c.victims(fs, n) {
			c.tombstone(now, r)
		}
		fs.surplusSince = time.Time{} // the next surplus gets its own keep-alive
	default:
		fs.placeErr, fs.quotaErr = "", ""
	}
	if active <= want {
		fs.surplusSince = time.Time{}
	}
	if active >= min(want, fs.spec.Scaling.Min) {
		c.setMinStarved(fs, false)
	}
	c.refreshCondition(fs)
	if readyCur >= want || fs.deleted {
		var old []*sandboxRec
		for _, r := range fs.sandboxes {
			if r.rev != cur && r.state != sbTombstoned {
				old = append(old, r)
			}
		}
		slices.SortFunc(old, func(a, b *sandboxRec) int { return strings.Compare(a.id, b.id) })
		for _, r := range old {
			c.tombstone(now, r)
		}
	}
}

// setMinStarved sets fs.minStarved, counting starved functions in
// c.minStarved.
func (c *Reconciler) setMinStarved(fs *fnState, starved bool) {
	if fs.minStarved == starved {
		return
	}
	fs.minStarved = starved
	if starved {
		c.minStarved++
	} else {
		c.minStarved--
	}
}

// armRetry asks to reconcile the function again at t (placement found no
// room, or a crash-loop backoff is running).
func (c *Reconciler) armRetry(fs *fnState, at time.Time) {
	if fs.retryArmed || fs.deleted {
		return
	}
	fs.retryArmed = true
	c.emit(RetryAt{Function: fs.spec.Name, At: at})
}

// victims picks n current-revision sandboxes to remove: ones not yet
// serving first (no request is lost), then the newest ready ones.
func (c *Reconciler) victims(fs *fnState, n int) []*sandboxRec {
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
		if !cands[i].created.Equal(cands[j].created) {
			return cands[i].created.After(cands[j].created)
		}
		return cands[i].id > cands[j].id // deterministic among equals
	})
	return cands[:min(n, len(cands))]
}

// placerFor is the placement policy for fs: the cluster's, or the one its
// spec names (one instance per policy name, shared by the functions that
// name it: hashing policies keep their ring and popularity across them).
func (c *Reconciler) placerFor(fs *fnState) placement.Policy {
	name := fs.spec.Placement
	if name == "" || name == c.cfg.Placement {
		return c.placer
	}
	if p := c.placers[name]; p != nil {
		return p
	}
	p, err := placement.New(name, c.rng)
	if err != nil { // validated with the spec; a stored spec from a newer version
		c.log.Warn("unknown placement policy: using the cluster's", "function", fs.spec.Name, "placement", name)
		p = c.placer
	}
	c.placers[name] = p
	return p
}

// place1 chooses a node for one new sandbox and sends the Create.
func (c *Reconciler) place1(now time.Time, fs *fnState) error {
	res := placement.Resources{MilliCPU: fs.spec.Resources.MilliCPU, MemoryMB: fs.spec.Resources.MemoryMB}
	req := placement.Request{Resources: res, Key: fs.spec.Name, Now: now, Rate: fs.rate, Locality: c.localityFn(fs)}
	idx, err := c.placerFor(fs).Place(c.place, req)
	if err != nil {
		return err
	}
	n := c.nodeList[idx]
	if !n.up {
		return errors.New("placement chose a node without a session") // invariant: unschedulable
	}
	r := &sandboxRec{id: c.newID(), fn: fs, rev: fs.spec.Revision, node: n, state: sbAssumed, created: now, timeout: time.Duration(fs.spec.Timeout),
		milliCPU: res.MilliCPU, memoryMB: res.MemoryMB}
	c.addRecord(r)
	n.seen[imageKey(fs.spec)] = struct{}{}
	c.emit(Create{Node: n.id, ID: r.id, Spec: fs.spec})
	c.stats.Creations++
	return nil
}

// localityFn tells the locality policies what each node holds of fs: a
// running sandbox of it, its template (the node's heartbeat lists it), or
// its image (a node that ran it since it registered has it unpacked). The
// warm set is built on the first call.
func (c *Reconciler) localityFn(fs *fnState) func(i int) placement.Locality {
	key := imageKey(fs.spec)
	var warm map[*nodeState]struct{}
	built := false
	return func(i int) placement.Locality {
		if !built { // on first use: most policies never ask
			built = true
			for _, r := range fs.sandboxes {
				if r.state != sbTombstoned {
					if warm == nil {
						warm = make(map[*nodeState]struct{})
					}
					warm[r.node] = struct{}{}
				}
			}
		}
		n := c.nodeList[i]
		if _, ok := warm[n]; ok {
			return placement.LocalityWarm
		}
		if _, ok := n.templates[heldTemplate{fs.spec.Name, fs.spec.Revision}]; ok {
			return placement.LocalityTemplate
		}
		if _, ok := n.seen[key]; ok {
			return placement.LocalityImage
		}
		return placement.LocalityNone
	}
}

// imageKey is what a node caches for f: its image, or its command/builtin
// (keyed by the function).
func imageKey(f *spec.Function) string {
	if f.Image != "" {
		return "image:" + f.Image
	}
	return "fn:" + f.Name
}

// tombstone withdraws a sandbox from data planes now and tells its worker
// to terminate it once the calls already routed to it have finished
// (drainDue); one that was never routable goes after the drain delay.
func (c *Reconciler) tombstone(now time.Time, r *sandboxRec) {
	if r.state == sbTombstoned {
		return
	}
	routable := r.state == sbReady && !r.withdrawn
	r.state = sbTombstoned
	if routable {
		c.emit(RemoveEndpoint{r.id})
	}
	if routable && c.cfg.DrainDelay > 0 {
		// Data planes may have calls in it: it is killed once they have
		// all withdrawn it and finished them (drainDue).
		r.drainFrom = now
		c.draining = append(c.draining, r)
		c.wakeForDrain(now, now.Add(c.cfg.DrainDelay))
		return
	}
	if r.node.up {
		c.emit(Tombstone{Node: r.node.id, ID: r.id, After: c.cfg.DrainDelay})
	}
}

// drainDue sends the Tombstones of withdrawn sandboxes whose calls have
// ended: DrainDelay after the withdrawal (the data planes stop routing to
// them by then) and once no data plane reports calls still running in
// them. A data plane's word holds for loadStaleAfter (it repeats it in
// every report while the calls run); the function's timeout bounds the
// wait, for no call runs longer. Killing at the delay alone cut calls
// longer than it: a sandbox evicted as idle on a report a moment old had
// just taken a call.
func (c *Reconciler) drainDue(now time.Time) {
	kept := c.draining[:0]
	for _, r := range c.draining {
		if r.drainFrom.IsZero() || r.node.sandboxes[r.id] != r {
			continue // gone, or its node's handshake sent the Tombstone
		}
		since := now.Sub(r.drainFrom)
		held := false
		for dp, at := range r.drainHeld {
			if now.Sub(at) > loadStaleAfter {
				delete(r.drainHeld, dp)
			} else {
				held = true
			}
		}
		// The longest a call may run: its revision's timeout, or the
		// current one's if longer.
		limit := max(r.timeout, time.Duration(r.fn.spec.Timeout))
		if since < c.cfg.DrainDelay || held && since < c.cfg.DrainDelay+limit {
			kept = append(kept, r)
			continue
		}
		r.drainFrom, r.drainHeld = time.Time{}, nil
		if r.node.up {
			c.emit(Tombstone{Node: r.node.id, ID: r.id})
		}
	}
	clear(c.draining[len(kept):])
	c.draining = kept
	for _, r := range kept { // the earliest drain delay still to end (the list is in withdrawal order)
		if due := r.drainFrom.Add(c.cfg.DrainDelay); due.After(now) {
			c.wakeForDrain(now, due)
			break
		}
	}
}

// wakeForDrain asks for a step at at, when a drain delay ends, unless one
// is asked for by then already: the data planes' reports step the
// reconciler while they hold a sandbox, but nothing else need come at the
// delay's end (a quiet cluster; the simulator). The wake-up is a Retry of
// no function.
func (c *Reconciler) wakeForDrain(now, at time.Time) {
	if c.drainWake.After(now) && !c.drainWake.After(at) {
		return
	}
	c.drainWake = at
	c.emit(RetryAt{At: at})
}

// recordDraining notes which withdrawn sandboxes dp still has calls in:
// those it lists, and no longer those it leaves out.
func (c *Reconciler) recordDraining(now time.Time, dp string, ids []string) {
	for _, r := range c.draining {
		if slices.Contains(ids, r.id) {
			if r.drainHeld == nil {
				r.drainHeld = map[string]time.Time{}
			}
			r.drainHeld[dp] = now
		} else {
			delete(r.drainHeld, dp)
		}
	}
}

// noRoomMessage explains a failed placement for people: the sandbox's
// request and, for the first few connected nodes, the resource each lacks.
func (c *Reconciler) noRoomMessage(fs *fnState, err error) string {
	if !errors.Is(err, placement.ErrNoCapacity) {
		return err.Error()
	}
	need := placement.Resources{MilliCPU: fs.spec.Resources.MilliCPU, MemoryMB: fs.spec.Resources.MemoryMB}
	const shown = 3
	var short []string
	for i, n := range c.nodeList {
		if n.up && !n.rec.Drain && len(short) < shown {
			short = append(short, "node "+n.id+": "+lacking(&c.place[i], need))
		}
	}
	connected := c.connectedNodes()
	if connected == 0 {
		return "no worker node is connected"
	}
	msg := fmt.Sprintf("no node has room for a sandbox of %dm CPU and %d MiB, and no idle sandbox to evict for it (%s",
		need.MilliCPU, need.MemoryMB, strings.Join(short, "; "))
	if connected > shown {
		msg += fmt.Sprintf("; %d more nodes", connected-shown)
	}
	return msg + ")"
}

// connectedNodes counts the nodes new sandboxes may go to: connected and
// not draining.
func (c *Reconciler) connectedNodes() int {
	k := 0
	for _, n := range c.nodeList {
		if n.up && !n.rec.Drain {
			k++
		}
	}
	return k
}

// lacking names what node p lacks for a sandbox asking need.
func lacking(p *placement.Node, need placement.Resources) string {
	switch {
	case p.MaxSandboxes > 0 && p.Sandboxes >= p.MaxSandboxes:
		return fmt.Sprintf("sandboxes %d of %d", p.Sandboxes, p.MaxSandboxes)
	case need.MilliCPU > p.Allocatable.MilliCPU-p.Requested.MilliCPU:
		return fmt.Sprintf("CPU %dm of %dm requested", p.Requested.MilliCPU, p.Allocatable.MilliCPU)
	case need.MemoryMB > p.Allocatable.MemoryMB-p.Requested.MemoryMB:
		return fmt.Sprintf("memory %d of %d MiB requested", p.Requested.MemoryMB, p.Allocatable.MemoryMB)
	}
	return "refused by the placement policy"
}

// condition says why fs lacks sandboxes, if anything is wrong.
func (fs *fnState) condition() fnCondition {
	if fs.deleted {
		return fnCondition{}
	}
	if fs.quotaErr != "" {
		return fnCondition{reason: CondQuotaExceeded, message: fs.quotaErr}
	}
	if fs.placeErr != "" {
		return fnCondition{reason: CondNoCapacity, message: fs.placeErr, none: fs.full && fs.activeCurrent() == 0}
	}
	if fs.failures > 0 {
		for _, r := range fs.sandboxes {
			if r.state == sbReady && r.rev == fs.spec.Revision {
				return fnCondition{}
			}
		}
		return fnCondition{reason: CondFunctionFailing, message: fmt.Sprintf("%d sandbox starts failed in a row, the last: %s", fs.failures, fs.lastFailure), failures: fs.failures}
	}
	return fnCondition{}
}

// conditionOut is fs's condition as data planes get it.
func (fs *fnState) conditionOut() Condition {
	return Condition{Function: fs.spec.Name, Reason: fs.cond.reason, Message: fs.cond.message, FailFast: fs.cond.failFast()}
}

// refreshCondition publishes fs's condition when it changed.
func (c *Reconciler) refreshCondition(fs *fnState) {
	cond := fs.condition()
	if cond == fs.cond {
		return
	}
	fs.cond = cond
	c.emit(SetCondition{fs.conditionOut()})
}

// noteFailure backs off creation for a function whose sandboxes keep
// dying, so a crash-looping command cannot hammer a worker.
func (c *Reconciler) noteFailure(now time.Time, fs *fnState, node string, u *Record) {
	fs.failures++
	fs.lastFailure = u.Message
	d := c.cfg.FailureBackoff << min(fs.failures-1, 10)
	d = min(d, c.cfg.MaxFailureBackoff)
	fs.backoffUntil = now.Add(d)
	c.emit(SandboxFailed{Function: fs.spec.Name, ID: u.ID, Node: node, State: u.State.String(), Reason: u.Message, Backoff: d})
}

package autoscale

import (
	"math"
	"time"
)

// Decision is the outcome of one KPA.Decide.
type Decision struct {
	Desired   int     // sandboxes wanted, after bounds, activation scale and the grace rule; never negative
	Panic     bool    // the KPA is in panic mode
	StableAvg float64 // average concurrency over the stable window
	PanicAvg  float64 // average concurrency over the panic window
	NoData    bool    // nothing recorded within the stable window: Desired is the previous decision
}

// KPA is the per-function Knative Pod Autoscaler state machine (docs/policies.md,
// Autoscaling: KPA).
// It is not safe for concurrent use; the caller owns the only goroutine that steps it.
type KPA struct {
	cfg                 Config
	stableWin, panicWin avgWindow
	delay               *maxWindow // nil without ScaleDownDelay

	last int // last decided scale; 0 means the function is (going) cold

	panicking    bool
	panicTime    time.Time // last decision that was over the panic threshold
	maxPanicPods int       // panic mode never decides below this

	zeroing   bool      // the computed want has been 0 since zeroSince
	zeroSince time.Time // start of the current run of zero wants, for ScaleToZeroGrace

	adopted     int       // scale taken over by Adopt
	adoptedTill time.Time // no decision falls below adopted before this
}

// NewKPA returns a KPA with no data, out of panic mode, and a last decision of 0.
// Fields of cfg that fail Validate are replaced by their defaults. Unlike Knative, a
// fresh KPA never starts in panic mode (it is not told the ready count); a control
// plane that takes over running sandboxes calls Adopt instead. now is the creation
// time and is not needed by the state machine yet; it keeps the step signature uniform.
func NewKPA(cfg Config, now time.Time) *KPA {
	_ = now
	cfg = cfg.normalized()
	k := &KPA{
		cfg:       cfg,
		stableWin: newAvgWindow(cfg.StableWindow),
		panicWin:  newAvgWindow(cfg.PanicWindow()),
	}
	if cfg.ScaleDownDelay > 0 {
		k.delay = newMaxWindow(cfg.ScaleDownDelay)
	}
	return k
}

// SetConfig applies an updated function config. Window data survives (rings are
// resized, newest buckets first), as does the scale-down-delay history. Disabling
// panic mode leaves it at once.
func (k *KPA) SetConfig(cfg Config) {
	cfg = cfg.normalized()
	k.stableWin.resize(cfg.StableWindow)
	k.panicWin.resize(cfg.PanicWindow())
	switch {
	case cfg.ScaleDownDelay == 0:
		k.delay = nil
	case k.delay == nil:
		k.delay = newMaxWindow(cfg.ScaleDownDelay)
	case cfg.ScaleDownDelay != k.cfg.ScaleDownDelay:
		k.delay = k.delay.resized(cfg.ScaleDownDelay)
	}
	if cfg.PanicDisabled {
		k.exitPanic()
	}
	k.cfg = cfg
}

// Record adds one observation of in-flight requests (including requests queued for
// capacity), as the time-weighted average over the reporting interval ending at now.
// Values recorded into the same 1-second bucket are summed, as in Knative, so each data
// plane may record its own average and the bucket holds the function-wide total; a
// source must record at most once per second. Callers keep recording, zeros included,
// while sandboxes exist: the KPA treats a stable window without records as no data
// and then holds its last decision. NaN and infinite values are ignored.
func (k *KPA) Record(now time.Time, concurrency float64) {
	if math.IsNaN(concurrency) || math.IsInf(concurrency, 0) {
		return
	}
	sec := now.Unix()
	k.stableWin.record(sec, concurrency)
	k.panicWin.record(sec, concurrency)
	if k.cfg.HoldPeaks && k.delay != nil && concurrency > 0 {
		k.delay.record(sec, clampCount(math.Ceil(concurrency/k.cfg.TargetConcurrency), 0, math.MaxInt32))
	}
}

// WantsPoke reports whether a report of concurrency should trigger an immediate Decide
// instead of waiting for the next tick (Knative's Poke): the function was decided cold
// and load arrived.
func (k *KPA) WantsPoke(concurrency float64) bool {
	return k.last == 0 && concurrency > 0
}

// Adopt makes scale the last decision and keeps every decision at or above it (within
// MaxScale) until one stable window after now. A control plane that restarts without
// window history uses it to keep running sandboxes until enough data has arrived; this
// replaces Knative's start-in-panic rule.
func (k *KPA) Adopt(now time.Time, scale int) {
	scale = max(scale, 0)
	k.last = scale
	k.adopted = scale
	k.adoptedTill = now.Add(k.cfg.StableWindow)
	k.zeroing = false
}

// Yield makes scale the last decision and forgets the load that led to the
// previous one: the function's idle sandboxes above scale were taken for
// another function's waiting calls, and it must not take their room back
// before load of its own arrives again. The windows, panic mode, the
// scale-down delay's history and an adoption are dropped, so the next Decide
// without new records holds scale (no data) and one with records starts from
// them alone. now keeps the step signature uniform.
func (k *KPA) Yield(now time.Time, scale int) {
	_ = now
	k.stableWin.reset()
	k.panicWin.reset()
	if k.delay != nil {
		k.delay.length = 0
	}
	k.exitPanic()
	k.last = max(scale, 0)
	k.adopted, k.adoptedTill = 0, time.Time{}
	k.zeroing = false
}

// Decide runs one autoscaling decision at now with ready sandboxes (Ready, not pending).
// Knative ticks every 2s; callers also call it at once when WantsPoke says so.
func (k *KPA) Decide(now time.Time, ready int) Decision {
	sec := now.Unix()
	if k.stableWin.empty(sec) {
		// Knative skips the tick; bounds and adoption still hold.
		k.last = k.floorAdopted(now, k.bound(k.last))
		return Decision{Desired: k.last, Panic: k.panicking, NoData: true}
	}
	d := Decision{
		StableAvg: round6(k.stableWin.average(sec)),
		PanicAvg:  round6(k.panicWin.average(sec)),
	}
	want := k.want(now, max(ready, 0), d.StableAvg, d.PanicAvg)
	want = k.holdBeforeZero(now, k.bound(want))
	k.last = k.floorAdopted(now, want)
	d.Desired, d.Panic = k.last, k.panicking
	return d
}

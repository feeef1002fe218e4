package autoscale

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Knative constants (pkg/apis/autoscaling, pkg/autoscaler/config).
const (
	// TargetMin is the smallest per-sandbox target TargetFor returns.
	TargetMin = 0.01
	// DefaultConcurrencyTarget is the soft target used when containerConcurrency is 0 (unlimited).
	DefaultConcurrencyTarget = 100
	// BucketSize is the width of one averaging bucket.
	BucketSize = time.Second

	minStableWindow = time.Second // Knative's minimum is 6s; brisk allows less for tests.
	maxStableWindow = time.Hour
	maxDelay        = time.Hour
)

// Config is the per-function KPA configuration (Knative defaults).
type Config struct {
	TargetConcurrency  float64       // per-sandbox target in-flight after utilization (CC=1 at 70% -> 0.7); > 0
	StableWindow       time.Duration // default 60s; whole seconds in [1s, 1h]
	PanicWindowPercent float64       // default 10; in [1, 100]; see PanicWindow
	PanicThreshold     float64       // default 2.0 (200%); > 1
	MaxScaleUpRate     float64       // default 1000; > 1
	MaxScaleDownRate   float64       // default 2; > 1
	ScaleToZeroGrace   time.Duration // default 30s; >= 0
	EnableScaleToZero  bool          // default true
	MinScale, MaxScale int           // default 0 / 0 (0 = unbounded); MinScale <= MaxScale unless MaxScale == 0
	ActivationScale    int           // default 1; minimum scale when waking from zero
	ScaleDownDelay     time.Duration // default 0; whole seconds in [0, 1h]
	PanicDisabled      bool          // PulseNet-style regular track: panic mode off
	// HoldPeaks feeds every recorded concurrency, not only each decision's
	// want, into the scale-down delay's maximum, so that one second's peak
	// is kept for the whole delay (sync mode: SyncConfig). Needs a delay.
	HoldPeaks bool
}

// DefaultConfig returns Knative's defaults: CC=1 at 70% utilization, 60s stable window,
// 10% panic window, 200% panic threshold, rates 1000/2, 30s grace, scale to zero on.
func DefaultConfig() Config {
	return Config{
		TargetConcurrency:  TargetFor(1, 0.7),
		StableWindow:       60 * time.Second,
		PanicWindowPercent: 10,
		PanicThreshold:     2,
		MaxScaleUpRate:     1000,
		MaxScaleDownRate:   2,
		ScaleToZeroGrace:   30 * time.Second,
		EnableScaleToZero:  true,
		ActivationScale:    1,
	}
}

// TargetFor is Knative's ResolveMetricTarget for the concurrency metric: the per-sandbox
// target is containerConcurrency (or DefaultConcurrencyTarget when it is 0, unlimited)
// times utilization, but at least TargetMin. Like Knative's config parser, a utilization
// above 1 is read as a percentage (70 means 0.7).
func TargetFor(containerConcurrency int, utilization float64) float64 {
	total := float64(DefaultConcurrencyTarget)
	if containerConcurrency > 0 {
		total = float64(containerConcurrency)
	}
	if utilization > 1 {
		utilization /= 100
	}
	if math.IsNaN(utilization) {
		return TargetMin
	}
	return math.Max(TargetMin, total*utilization)
}

// PanicWindow is Knative's panic window: StableWindow*PanicWindowPercent/100 rounded to
// whole seconds, and at least one bucket.
func (c Config) PanicWindow() time.Duration {
	d := time.Duration(float64(c.StableWindow) * c.PanicWindowPercent / 100).Round(time.Second)
	return max(d, BucketSize)
}

// ErrInvalidConfig matches (errors.Is) every error Validate returns.
var ErrInvalidConfig = errors.New("autoscale: invalid config")

// fieldError names the offending field, its value and the rule it broke.
type fieldError struct {
	field string
	value any
	rule  string
}

func (e *fieldError) Error() string {
	return fmt.Sprintf("autoscale: %s %v %s", e.field, e.value, e.rule)
}

func (e *fieldError) Is(target error) bool { return target == ErrInvalidConfig }

// Validate reports every field out of its allowed range, joined; nil means the
// config is usable as is.
func (c Config) Validate() error {
	var errs []error
	bad := func(field string, value any, rule string) {
		errs = append(errs, &fieldError{field, value, rule})
	}
	if !(c.TargetConcurrency > 0) || math.IsInf(c.TargetConcurrency, 1) {
		bad("target concurrency", c.TargetConcurrency, "out of range (0, +Inf)")
	}
	if c.StableWindow < minStableWindow || c.StableWindow > maxStableWindow {
		bad("stable window", c.StableWindow, "out of range [1s, 1h]")
	} else if c.StableWindow%time.Second != 0 {
		bad("stable window", c.StableWindow, "is not a whole number of seconds")
	}
	if !(c.PanicWindowPercent >= 1 && c.PanicWindowPercent <= 100) {
		bad("panic window percent", c.PanicWindowPercent, "out of range [1, 100]")
	}
	if !(c.PanicThreshold > 1) {
		bad("panic threshold", c.PanicThreshold, "out of range (1, +Inf)")
	}
	if !(c.MaxScaleUpRate > 1) {
		bad("max scale up rate", c.MaxScaleUpRate, "out of range (1, +Inf)")
	}
	if !(c.MaxScaleDownRate > 1) {
		bad("max scale down rate", c.MaxScaleDownRate, "out of range (1, +Inf)")
	}
	if c.ScaleToZeroGrace < 0 {
		bad("scale to zero grace", c.ScaleToZeroGrace, "out of range [0, +Inf)")
	}
	errs = append(errs, c.validateScales()...)
	if c.ScaleDownDelay < 0 || c.ScaleDownDelay > maxDelay {
		bad("scale down delay", c.ScaleDownDelay, "out of range [0, 1h]")
	} else if c.ScaleDownDelay%time.Second != 0 {
		bad("scale down delay", c.ScaleDownDelay, "is not a whole number of seconds")
	}
	return errors.Join(errs...)
}

// validateScales checks the integer bounds, which depend on each other.
func (c Config) validateScales() []error {
	var errs []error
	if c.MinScale < 0 {
		errs = append(errs, &fieldError{"min scale", c.MinScale, "out of range [0, +Inf)"})
	}
	if c.MaxScale < 0 {
		errs = append(errs, &fieldError{"max scale", c.MaxScale, "out of range [0, +Inf) (0 = unbounded)"})
	}
	if c.MaxScale > 0 && c.MinScale > c.MaxScale {
		errs = append(errs, &fieldError{"min scale", c.MinScale, fmt.Sprintf("out of range [0, max scale %d]", c.MaxScale)})
	}
	if c.ActivationScale < 1 {
		errs = append(errs, &fieldError{"activation scale", c.ActivationScale, "out of range [1, +Inf)"})
	}
	return errs
}

// normalized replaces every field that fails Validate with its default (a MinScale
// above MaxScale is lowered to MaxScale), so that a KPA never runs on values that
// would break its arithmetic. Callers are expected to Validate first.
func (c Config) normalized() Config {
	d := DefaultConfig()
	if !(c.TargetConcurrency > 0) || math.IsInf(c.TargetConcurrency, 1) {
		c.TargetConcurrency = d.TargetConcurrency
	}
	if c.StableWindow < minStableWindow || c.StableWindow > maxStableWindow || c.StableWindow%time.Second != 0 {
		c.StableWindow = d.StableWindow
	}
	if !(c.PanicWindowPercent >= 1 && c.PanicWindowPercent <= 100) {
		c.PanicWindowPercent = d.PanicWindowPercent
	}
	if !(c.PanicThreshold > 1) {
		c.PanicThreshold = d.PanicThreshold
	}
	if !(c.MaxScaleUpRate > 1) {
		c.MaxScaleUpRate = d.MaxScaleUpRate
	}
	if !(c.MaxScaleDownRate > 1) {
		c.MaxScaleDownRate = d.MaxScaleDownRate
	}
	c.ScaleToZeroGrace = max(c.ScaleToZeroGrace, 0)
	c.MinScale, c.MaxScale = max(c.MinScale, 0), max(c.MaxScale, 0)
	if c.MaxScale > 0 {
		c.MinScale = min(c.MinScale, c.MaxScale)
	}
	c.ActivationScale = max(c.ActivationScale, 1)
	if c.ScaleDownDelay < 0 || c.ScaleDownDelay > maxDelay || c.ScaleDownDelay%time.Second != 0 {
		c.ScaleDownDelay = d.ScaleDownDelay
	}
	return c
}

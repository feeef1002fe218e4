package autoscale

import (
	"math"
	"time"
)

// Predictor is the hook for a predictive autoscaler: a forecaster (a
// histogram of inter-arrival times, a time-series model, a trace oracle in
// the simulator) that says how much concurrency a function will need, so
// that sandboxes start before the requests arrive instead of after the KPA
// has seen them. Implementations follow the package's rules: now is passed
// in, no clock, no I/O.
type Predictor interface {
	// Predict returns the concurrency (in-flight requests, the KPA's
	// metric) key is expected to need at now, or ok = false when it has no
	// forecast for key.
	Predict(now time.Time, key string) (concurrency float64, ok bool)
}

// PredictorFunc adapts a function to a Predictor.
type PredictorFunc func(now time.Time, key string) (float64, bool)

// Predict calls f.
func (f PredictorFunc) Predict(now time.Time, key string) (float64, bool) { return f(now, key) }

// WithPrediction combines a KPA decision with a forecast: it raises
// d.Desired to ceil(predicted / target), the sandboxes the predicted
// concurrency needs at the per-sandbox target (the same rule as the KPA's
// ceil(average / target)), and never lowers it, so the reactive KPA still
// covers load the forecast missed and scale-down stays the KPA's call. The
// raise is capped at maxScale when maxScale > 0 (the function's
// Config.MaxScale); a decision already above the cap is left alone.
//
// A forecast that is not a finite positive number, or a target that is not
// finite and positive, leaves d unchanged; a target below TargetMin counts
// as TargetMin, as in TargetFor. The prediction is rounded to six decimals
// before the ceiling, like the KPA's window averages, so 0.7000000001 at
// target 0.7 is one sandbox, not two. A decision at 0 with a positive
// forecast becomes at least 1: the function is pre-warmed.
func WithPrediction(d Decision, predicted, target float64, maxScale int) Decision {
	if !(predicted > 0) || math.IsInf(predicted, 1) || !(target > 0) || math.IsInf(target, 1) {
		return d
	}
	want := math.Ceil(round6(predicted) / math.Max(target, TargetMin))
	limit := float64(math.MaxInt32)
	if maxScale > 0 {
		limit = float64(maxScale)
	}
	if w := int(math.Min(want, limit)); w > d.Desired {
		d.Desired = w
	}
	return d
}

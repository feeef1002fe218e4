package autoscale

import (
	"math"
	"testing"
	"time"
)

func TestWithPrediction(t *testing.T) {
	base := Decision{Desired: 3, StableAvg: 2.1, PanicAvg: 1.9}
	tests := []struct {
		label             string
		desired           int
		predicted, target float64
		maxScale          int
		want              int
	}{
		{"raises to ceil(p/target)", 3, 7, 1, 0, 7},
		{"rounds up", 3, 6.1, 1, 0, 7},
		{"target 0.7", 3, 7, 0.7, 0, 10},
		{"float noise does not add a sandbox", 0, 0.7000000001, 0.7, 0, 1},
		{"never lowers", 3, 1, 1, 0, 3},
		{"pre-warms a cold function", 0, 0.2, 1, 0, 1},
		{"capped by maxScale", 3, 50, 1, 10, 10},
		{"a decision above the cap stays", 12, 50, 1, 10, 12},
		{"no forecast: zero", 3, 0, 1, 0, 3},
		{"negative forecast", 3, -5, 1, 0, 3},
		{"NaN forecast", 3, math.NaN(), 1, 0, 3},
		{"infinite forecast", 3, math.Inf(1), 1, 0, 3},
		{"zero target", 3, 5, 0, 0, 3},
		{"NaN target", 3, 5, math.NaN(), 0, 3},
		{"tiny target counts as TargetMin", 0, 1, 1e-9, 0, 100},
		{"huge forecast stays in int32", 0, 1e300, 1, 0, math.MaxInt32},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			d := base
			d.Desired = tt.desired
			got := WithPrediction(d, tt.predicted, tt.target, tt.maxScale)
			if got.Desired != tt.want {
				t.Errorf("Desired = %d, want %d", got.Desired, tt.want)
			}
			got.Desired = d.Desired
			if got != d {
				t.Errorf("other fields changed: %+v, was %+v", got, d)
			}
		})
	}
}

// A predictor plugged into the KPA loop: a cold function is pre-warmed
// before its first request, and the reactive decision still wins above the
// forecast.
func TestPredictorHook(t *testing.T) {
	var p Predictor = PredictorFunc(func(now time.Time, key string) (float64, bool) {
		if key == "ns/cron" && now.Sub(t0) >= 59*time.Minute {
			return 2.5, true // the hourly batch is about to start
		}
		return 0, false
	})
	cfg := DefaultConfig()
	cfg.TargetConcurrency = 1
	k := NewKPA(cfg, t0)
	at := t0.Add(59 * time.Minute)
	d := k.Decide(at, 0)
	if d.Desired != 0 {
		t.Fatalf("KPA alone wants %d for an idle function", d.Desired)
	}
	if c, ok := p.Predict(at, "ns/cron"); !ok || WithPrediction(d, c, cfg.TargetConcurrency, cfg.MaxScale).Desired != 3 {
		t.Errorf("prediction 2.5 at target 1 should pre-warm 3 sandboxes")
	}
	if _, ok := p.Predict(at, "ns/other"); ok {
		t.Error("forecast for a function the predictor does not know")
	}
}

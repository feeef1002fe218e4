package prewarm

import (
	"testing"
	"time"
)

// every is a schedule ticking every d after the time it is asked about
// (as "@every" does: relative, not aligned to the clock).
type every time.Duration

func (e every) Next(t time.Time) time.Time { return t.Add(time.Duration(e)) }

func TestCronForecastWindow(t *testing.T) {
	c := NewCron(4*time.Second, 5*time.Second)
	tick := time.Date(2026, 1, 1, 10, 10, 0, 0, time.UTC)
	// Ticks every 10 minutes after 10:00:00, e.g. a trigger made then.
	c.SetSchedules("f", []Ticks{{every(10 * time.Minute), tick.Add(-10 * time.Minute)}})
	for _, x := range []struct {
		at   time.Duration // from the tick
		want bool
	}{
		{-10 * time.Second, false},
		{-5*time.Second - time.Millisecond, false},
		{-5 * time.Second, true}, // lead 1 s (default) + margin 4 s
		{0, true},
		{4 * time.Second, true},
		{5 * time.Second, false}, // hold over
		{2 * time.Minute, false},
	} {
		v, ok := c.Predict(tick.Add(x.at), "f")
		if ok != x.want || ok && v != 1 {
			t.Errorf("at tick%+v: %v %v, want forecast %v", x.at, v, ok, x.want)
		}
	}
	if _, ok := c.Predict(tick, "g"); ok {
		t.Error("a function without schedules has a forecast")
	}
	// A measured cold start moves the window (asked again from the start:
	// the forecast walks forward only).
	c.SetSchedules("f", []Ticks{{every(10 * time.Minute), tick.Add(-10 * time.Minute)}})
	c.ObserveColdStart("f", 3*time.Second)
	if got := c.Lead("f"); got != 7*time.Second {
		t.Errorf("lead %s, want the measured 3 s + margin 4 s", got)
	}
	if _, ok := c.Predict(tick.Add(-7*time.Second), "f"); !ok {
		t.Error("no forecast a measured cold start before the tick")
	}
	// The forecast walks on to later ticks (and never back).
	if _, ok := c.Predict(tick.Add(10*time.Minute-3*time.Second), "f"); !ok {
		t.Error("no forecast before the next tick")
	}
	if _, ok := c.Predict(tick.Add(15*time.Minute), "f"); ok {
		t.Error("a forecast between ticks")
	}
	c.ObserveColdStart("f", 7*time.Second)
	if got := c.Lead("f"); got != 4*time.Second+4*time.Second {
		t.Errorf("lead %s, want the moving average (3·3+7)/4 = 4 s + margin", got)
	}
	// Frequent ticks: the forecast never ends (no cold start, ever).
	c.SetSchedules("f", []Ticks{{every(8 * time.Second), tick}})
	for s := 0; s < 60; s++ {
		if _, ok := c.Predict(tick.Add(time.Duration(s)*time.Second), "f"); !ok {
			t.Fatalf("gap in the forecast at +%ds with ticks every 8 s", s)
		}
	}
	c.SetSchedules("f", nil)
	if _, ok := c.Predict(tick, "f"); ok {
		t.Error("a forecast after the schedules went")
	}
	if got := c.Lead("f"); got != 8*time.Second {
		t.Errorf("the measured cold start was forgotten: lead %s", got)
	}
}

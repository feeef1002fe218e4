package autoscale

import (
	"math"
	mathrand "math/rand"
	"testing"
	"testing/quick"
	"time"
)

// TestAvgWindowKnativeCases replays the expectations of Knative's
// TestTimedFloat64BucketsWindowAverage on a 5-second window.
func TestAvgWindowKnativeCases(t *testing.T) {
	w := newAvgWindow(5 * time.Second)
	check := func(label string, now int64, want float64) {
		t.Helper()
		if got := round6(w.average(now)); got != want {
			t.Errorf("%s: average(%d) = %v, want %v", label, now, got, want)
		}
	}
	w.record(0, 1)
	check("partial window after the first write", 0, 1)
	for i := int64(1); i < 5; i++ {
		w.record(i, float64(i+1))
	}
	check("full window", 4, 15./5)
	check("now lags behind the newest write", 3, 15./5)
	check("short hole drops the oldest buckets", 6, (15.-1-2)/(5-2))
	check("a window without writes gives 0", 10, 0)
	w.record(6, 91)
	check("write after a hole counts the gap as 0", 6, (15.-1-2+91)/5)

	w.record(64, 1984)
	check("a whole idle window resets the first write", 64, 1984)
	w.record(61, 4)
	check("an earlier write moves the first write back", 64, (4.+1984)/4)
	w.record(65, 5)
	check("one more second", 65, (4.+1984+5)/5)
	w.record(62, 10)
	check("an earlier write inside the window adds", 65, (4.+10+1984+5)/5)
	w.record(59, 10)
	check("a write older than the window is ignored", 65, (4.+10+1984+5)/5)
	w.record(60, 10)
	check("a write exactly a window old is ignored", 65, (4.+10+1984+5)/5)
	w.record(70, 10)
	check("a gap of exactly one window resets", 70, 10)
}

func TestAvgWindowEmptyAfterMoreThanAWindow(t *testing.T) {
	w := newAvgWindow(5 * time.Second)
	if !w.empty(0) {
		t.Fatal("a fresh window is not empty")
	}
	w.record(10, 1)
	if w.empty(15) || !w.empty(16) {
		t.Fatalf("empty(15), empty(16) = %v, %v; want false, true (Knative: now-last > window)", w.empty(15), w.empty(16))
	}
}

// refWindow is a dumb reference for avgWindow: it keeps every accepted observation in
// a slice and recomputes everything on each query from the rules in docs/policies.md,
// KPA: windows.
type refWindow struct {
	n           int64
	obs         []refObs // accepted observations of the current run
	first, last int64
}

type refObs struct {
	sec int64
	v   float64
}

func (r *refWindow) record(sec int64, v float64) {
	switch {
	case len(r.obs) == 0 || sec >= r.last+r.n: // first write, or a whole window without data
		r.obs, r.first, r.last = nil, sec, sec
	case sec <= r.last-r.n: // older than the window
		return
	}
	r.obs = append(r.obs, refObs{sec, v})
	r.first, r.last = min(r.first, sec), max(r.last, sec)
}

func (r *refWindow) average(now int64) float64 {
	if len(r.obs) == 0 || now-r.last >= r.n {
		return 0
	}
	end := max(now, r.last)
	sum := 0.0
	for _, o := range r.obs {
		if o.sec > end-r.n && o.sec <= end {
			sum += o.v
		}
	}
	return sum / float64(min(r.last-r.first+1, r.n-(end-r.last)))
}

func (r *refWindow) empty(now int64) bool { return len(r.obs) == 0 || now-r.last > r.n }

// windowOp is one random record or query; time moves forward by a small random step,
// sometimes jumps past a window, and sometimes writes into the past.
type windowOp struct {
	Step  uint8
	Back  uint8
	Query bool
	Value uint16
}

func TestAvgWindowMatchesReference(t *testing.T) {
	prop := func(size uint8, ops []windowOp) bool {
		n := int64(size%12) + 1
		w, ref := newAvgWindow(time.Duration(n)*time.Second), &refWindow{n: n}
		now := int64(-5) // cross 0 to exercise slots of negative seconds
		for _, op := range ops {
			now += int64(op.Step % 8)
			if op.Step%31 == 0 {
				now += 3 * n // a long idle gap
			}
			sec := now - int64(op.Back%16)*int64(op.Back/16%2) // half the ops go back in time
			if op.Query {
				got, want := w.average(sec), ref.average(sec)
				if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) || w.empty(sec) != ref.empty(sec) {
					t.Logf("n=%d sec=%d: average %v empty %v, reference %v %v", n, sec, got, w.empty(sec), want, ref.empty(sec))
					return false
				}
				continue
			}
			v := float64(op.Value) / 7
			if op.Value%4 == 0 {
				v = 0 // the reconciler's idle seconds: the ring is made on a non-zero write
			}
			w.record(sec, v)
			ref.record(sec, v)
		}
		return true
	}
	cfg := &quick.Config{MaxCount: 2000, Rand: newQuickRand()}
	if err := quick.Check(prop, cfg); err != nil {
		t.Fatal(err)
	}
}

// An idle function's windows hold no ring: zeros mark its seconds observed
// (a later burst is averaged over them) without allocating.
func TestAvgWindowIdleHoldsNoRing(t *testing.T) {
	w := newAvgWindow(60 * time.Second)
	sec := int64(1000)
	if n := testing.AllocsPerRun(100, func() { sec++; w.record(sec, 0) }); n != 0 {
		t.Errorf("recording zeros: %v allocations", n)
	}
	if w.buckets != nil || w.average(sec) != 0 || w.empty(sec) {
		t.Fatalf("after zeros: ring %v, average %v, empty %v; want no ring, 0, not empty", w.buckets != nil, w.average(sec), w.empty(sec))
	}
	w.resize(30 * time.Second)
	if w.buckets != nil {
		t.Fatal("a resize made a ring of zeros")
	}
	sec++ // the resized window still counts its last 30 idle seconds as observed
	w.record(sec, 62)
	if got, want := w.average(sec), 62.0/30; got != want {
		t.Errorf("a burst after 30+ idle seconds in a 30 s window: average %v, want %v", got, want)
	}
}

func TestAvgWindowResizeKeepsNewestBuckets(t *testing.T) {
	tests := []struct {
		label     string
		from, to  time.Duration
		firstData int64 // data is i at second i for i in [firstData, 5]
		want      float64
	}{
		{"grow keeps the average over the data seen", 5 * time.Second, 10 * time.Second, 1, (1. + 2 + 3 + 4 + 5) / 5},
		{"shrink keeps the newest buckets", 5 * time.Second, 2 * time.Second, 1, (4. + 5) / 2},
		{"same size is a no-op", 5 * time.Second, 5 * time.Second, 1, 3},
		// Knative would divide by the whole old window (10 buckets) here.
		{"grow keeps a partial window partial", 10 * time.Second, 20 * time.Second, 4, (4. + 5) / 2},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			w := newAvgWindow(tt.from)
			for s := tt.firstData; s <= 5; s++ {
				w.record(s, float64(s))
			}
			w.resize(tt.to)
			if got := w.average(5); got != tt.want {
				t.Fatalf("average after resize %v -> %v = %v, want %v", tt.from, tt.to, got, tt.want)
			}
		})
	}
}

// TestMaxWindowMatchesReference checks the ascending-minima window against the brute
// maximum of every value recorded in the last n seconds.
func TestMaxWindowMatchesReference(t *testing.T) {
	prop := func(size uint8, steps []uint8, values []uint8) bool {
		n := int64(size%10) + 1
		m := newMaxWindow(time.Duration(n) * time.Second)
		type rec struct {
			sec int64
			v   int
		}
		var all []rec
		sec := int64(0)
		for i, s := range steps {
			sec += int64(s % 4) // 0 records twice in one second
			v := 0
			if i < len(values) {
				v = int(values[i] % 50)
			}
			m.record(sec, v)
			all = append(all, rec{sec, v})
			want := 0
			for _, r := range all {
				if sec-r.sec < n {
					want = max(want, r.v)
				}
			}
			if m.current() != want {
				t.Logf("n=%d sec=%d: current %d, want %d", n, sec, m.current(), want)
				return false
			}
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000, Rand: newQuickRand()}); err != nil {
		t.Fatal(err)
	}
}

func TestMaxWindowTreatsBackwardTimeAsNewest(t *testing.T) {
	m := newMaxWindow(3 * time.Second)
	for sec := int64(100); sec > 0; sec-- { // would overflow the ring if indexes went down
		m.record(sec, int(sec))
	}
	if got := m.current(); got != 100 {
		t.Fatalf("current = %d, want 100", got)
	}
}

func TestPanicWindow(t *testing.T) {
	tests := []struct {
		stable  time.Duration
		percent float64
		want    time.Duration
	}{
		{60 * time.Second, 10, 6 * time.Second},
		{6 * time.Second, 10, time.Second}, // 0.6s rounds to 1s
		{time.Second, 1, time.Second},      // at least one bucket
		{15 * time.Second, 10, 2 * time.Second},
		{25 * time.Second, 10, 3 * time.Second}, // 2.5s rounds half away from zero
		{time.Hour, 100, time.Hour},
	}
	for _, tt := range tests {
		c := Config{StableWindow: tt.stable, PanicWindowPercent: tt.percent}
		if got := c.PanicWindow(); got != tt.want {
			t.Errorf("PanicWindow(%v, %v%%) = %v, want %v", tt.stable, tt.percent, got, tt.want)
		}
	}
}

// newQuickRand seeds testing/quick (which needs math/rand v1) so failures reproduce.
func newQuickRand() *mathrand.Rand { return mathrand.New(mathrand.NewSource(42)) }

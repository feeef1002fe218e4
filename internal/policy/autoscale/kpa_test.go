package autoscale

import (
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is an arbitrary whole second; scenario times are seconds after it.
var t0 = time.Unix(1_700_000_000, 0)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

// step is one line of a KPA scenario: record a value every second, decide, or adopt.
type step struct {
	op       string // "rec", "decide" or "adopt"
	from, to int    // rec: seconds [from, to]; decide/adopt: from is the time
	value    float64
	ready    int // decide: ready sandboxes; adopt: the adopted scale
	want     Decision
}

func rec(from, to int, v float64) step { return step{op: "rec", from: from, to: to, value: v} }

// decide expects a decision in stable mode with data.
func decide(sec, ready, desired int) step {
	return step{op: "decide", from: sec, ready: ready, want: Decision{Desired: desired}}
}

func decidePanic(sec, ready, desired int) step {
	return step{op: "decide", from: sec, ready: ready, want: Decision{Desired: desired, Panic: true}}
}

func decideNoData(sec, ready, desired int) step {
	return step{op: "decide", from: sec, ready: ready, want: Decision{Desired: desired, NoData: true}}
}

func adopt(sec, scale int) step { return step{op: "adopt", from: sec, ready: scale} }

// run plays steps against k and reports every decision that differs in Desired, Panic or NoData.
func run(t *testing.T, k *KPA, steps []step) {
	t.Helper()
	for i, s := range steps {
		switch s.op {
		case "rec":
			for sec := s.from; sec <= s.to; sec++ {
				k.Record(at(sec), s.value)
			}
		case "adopt":
			k.Adopt(at(s.from), s.ready)
		case "decide":
			got := k.Decide(at(s.from), s.ready)
			if got.Desired != s.want.Desired || got.Panic != s.want.Panic || got.NoData != s.want.NoData {
				t.Fatalf("step %d: Decide(t+%ds, ready=%d) = %+v, want Desired=%d Panic=%v NoData=%v",
					i, s.from, s.ready, got, s.want.Desired, s.want.Panic, s.want.NoData)
			}
		}
	}
}

// target1 is the default config with one request in flight per sandbox as the target.
func target1(c *Config) { c.TargetConcurrency = 1 }

func TestKPAScenarios(t *testing.T) {
	tests := []struct {
		label string
		cfg   func(*Config)
		steps []step
	}{{
		// ceil(1/0.7) = 2, and dppc/max(1,ready) = 2/1 reaches the 200% threshold.
		label: "scale from zero on first concurrency with target 0.7 panics to 2",
		cfg:   func(*Config) {},
		steps: []step{rec(0, 0, 1), decidePanic(0, 0, 2)},
	}, {
		label: "scale from zero with target 1 gives 1 in stable mode",
		cfg:   target1,
		steps: []step{rec(0, 0, 1), decide(0, 0, 1)},
	}, {
		label: "steady concurrency 10 with target 1 gives 10",
		cfg:   target1,
		steps: []step{rec(0, 59, 10), decide(59, 10, 10)},
	}, {
		// Panic avg 20 over the 6s panic window: 20/10 ready = 200%; stable avg 660/60 = 11.
		label: "panic entry when the panic average doubles",
		cfg:   target1,
		steps: []step{rec(0, 53, 10), rec(54, 59, 20), decidePanic(59, 10, 20)},
	}, {
		// 19/10 < 200%: the stable average (540+114)/60 = 10.9 decides.
		label: "just under double stays stable",
		cfg:   target1,
		steps: []step{rec(0, 53, 10), rec(54, 59, 19), decide(59, 10, 11)},
	}, {
		// At t+70 the stable want is 11 and the panic want 10, but panic keeps the 20.
		label: "never shrinks during panic",
		cfg:   target1,
		steps: []step{rec(0, 53, 10), rec(54, 59, 20), decidePanic(59, 10, 20),
			rec(60, 70, 5), decidePanic(70, 20, 20)},
	}, {
		// The last over-threshold decision was t+59: panic holds through t+119 and ends
		// strictly after, when the stable average (10) has absorbed the surge.
		label: "exits panic one stable window after the last over-threshold decision",
		cfg:   target1,
		steps: []step{rec(0, 53, 10), rec(54, 59, 20), decidePanic(59, 10, 20),
			rec(60, 120, 10), decidePanic(119, 20, 20), decide(120, 20, 10)},
	}, {
		label: "panic disabled stays in stable mode",
		cfg:   func(c *Config) { target1(c); c.PanicDisabled = true },
		steps: []step{rec(0, 53, 10), rec(54, 59, 20), decide(59, 10, 11)},
	}, {
		label: "max scale up rate limits growth to ceil(rate*ready)",
		cfg:   func(c *Config) { target1(c); c.MaxScaleUpRate = 2 },
		steps: []step{rec(0, 59, 100), decidePanic(59, 3, 6)},
	}, {
		label: "max scale up rate counts zero ready as one",
		cfg:   func(c *Config) { target1(c); c.MaxScaleUpRate = 2 },
		steps: []step{rec(0, 59, 100), decidePanic(59, 0, 2)},
	}, {
		label: "max scale down rate 2 halves",
		cfg:   target1,
		steps: []step{rec(0, 59, 0), decide(59, 10, 5)},
	}, {
		label: "max scale down rate 4 quarters, rounding down",
		cfg:   func(c *Config) { target1(c); c.MaxScaleDownRate = 4 },
		steps: []step{rec(0, 59, 0), decide(59, 10, 2)},
	}, {
		label: "min scale is a floor",
		cfg:   func(c *Config) { target1(c); c.MinScale = 3 },
		steps: []step{rec(0, 59, 1), decide(59, 1, 3)},
	}, {
		label: "max scale is a ceiling",
		cfg:   func(c *Config) { target1(c); c.MaxScale = 4 },
		steps: []step{rec(0, 59, 10), decide(59, 10, 4)},
	}, {
		label: "activation scale wakes to at least it",
		cfg:   func(c *Config) { target1(c); c.ActivationScale = 3 },
		steps: []step{rec(0, 0, 1), decide(0, 0, 3)},
	}, {
		// The stable average first reaches 0 at t+60; one sandbox stays for the 30s grace.
		label: "scale to zero only after the grace period",
		cfg:   target1,
		steps: []step{rec(0, 0, 1), decide(0, 0, 1), rec(1, 60, 0), decide(60, 1, 1),
			rec(61, 89, 0), decide(89, 1, 1), rec(90, 90, 0), decide(90, 1, 0), decide(90, 0, 0)},
	}, {
		label: "scale to zero with zero grace is immediate",
		cfg:   func(c *Config) { target1(c); c.ScaleToZeroGrace = 0 },
		steps: []step{rec(0, 0, 1), decide(0, 0, 1), rec(1, 60, 0), decide(60, 1, 0)},
	}, {
		label: "scale to zero disabled keeps one",
		cfg:   func(c *Config) { target1(c); c.EnableScaleToZero = false },
		steps: []step{rec(0, 0, 1), decide(0, 0, 1), rec(1, 60, 0), decide(60, 1, 1), rec(61, 90, 0), decide(90, 1, 1)},
	}, {
		// The blip at t+75 makes the want 1 again, which restarts the grace at t+135.
		label: "a non-zero want restarts the grace period",
		cfg:   target1,
		steps: []step{rec(0, 0, 1), decide(0, 0, 1), rec(1, 60, 0), decide(60, 1, 1),
			rec(61, 74, 0), rec(75, 75, 0.5), rec(76, 90, 0), decide(90, 1, 1),
			rec(91, 135, 0), decide(135, 1, 1), rec(136, 164, 0), decide(164, 1, 1),
			rec(165, 165, 0), decide(165, 1, 0)},
	}, {
		// 6s stable window: want drops to max(2, floor(10/2)) = 5 at t+11, but the 10
		// decided at t+5 is held until it is 10s old.
		label: "scale down delay holds the max of the last delay",
		cfg: func(c *Config) {
			target1(c)
			c.StableWindow, c.ScaleDownDelay = 6*time.Second, 10*time.Second
		},
		steps: []step{rec(0, 5, 10), decide(5, 10, 10), rec(6, 11, 2), decide(11, 10, 10),
			rec(12, 14, 2), decide(14, 10, 10), rec(15, 15, 2), decide(15, 10, 5)},
	}, {
		label: "without scale down delay the same dip scales down at once",
		cfg:   func(c *Config) { target1(c); c.StableWindow = 6 * time.Second },
		steps: []step{rec(0, 5, 10), decide(5, 10, 10), rec(6, 11, 2), decide(11, 10, 5)},
	}, {
		label: "scale down delay does not delay scale up",
		cfg: func(c *Config) {
			target1(c)
			c.StableWindow, c.ScaleDownDelay = 6*time.Second, 10*time.Second
		},
		steps: []step{rec(0, 5, 2), decide(5, 2, 2), rec(6, 11, 3), decide(11, 2, 3)},
	}, {
		label: "no data keeps the initial zero",
		cfg:   target1,
		steps: []step{decideNoData(0, 0, 0), decideNoData(100, 3, 0)},
	}, {
		// Last write t+10; at t+71 nothing is within the 60s window.
		label: "no data keeps the previous decision",
		cfg:   target1,
		steps: []step{rec(10, 10, 3), decide(10, 3, 3), decideNoData(71, 3, 3)},
	}, {
		label: "no data still applies min scale",
		cfg:   func(c *Config) { target1(c); c.MinScale = 2 },
		steps: []step{decideNoData(0, 0, 2)},
	}, {
		label: "no data with scale to zero disabled gives one",
		cfg:   func(c *Config) { target1(c); c.EnableScaleToZero = false },
		steps: []step{decideNoData(0, 0, 1)},
	}, {
		// Zeros would allow floor(5/2) = 2; the adoption holds 5 until t+60.
		label: "adopt prevents scale down for a stable window",
		cfg:   target1,
		steps: []step{adopt(0, 5), decideNoData(0, 5, 5), rec(1, 30, 0), decide(30, 5, 5),
			rec(31, 59, 0), decide(59, 5, 5), rec(60, 60, 0), decide(60, 5, 2)},
	}, {
		label: "adopt does not prevent scale up",
		cfg:   target1,
		steps: []step{adopt(0, 5), rec(1, 30, 8), decide(30, 5, 8)},
	}, {
		label: "adopt is capped by max scale",
		cfg:   func(c *Config) { target1(c); c.MaxScale = 3 },
		steps: []step{adopt(0, 5), decideNoData(0, 5, 3), rec(1, 30, 0), decide(30, 5, 3)},
	}, {
		label: "without adopt the same zeros scale down",
		cfg:   target1,
		steps: []step{rec(1, 30, 0), decide(30, 5, 2)},
	}}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.cfg(&cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatalf("scenario config invalid: %v", err)
			}
			run(t, NewKPA(cfg, t0), tt.steps)
		})
	}
}

func TestKPAReportsWindowAverages(t *testing.T) {
	k := NewKPA(DefaultConfig(), t0)
	run(t, k, []step{rec(0, 53, 10), rec(54, 59, 20)})
	d := k.Decide(at(59), 100)
	if d.StableAvg != 11 || d.PanicAvg != 20 {
		t.Fatalf("StableAvg, PanicAvg = %v, %v; want 11, 20", d.StableAvg, d.PanicAvg)
	}
}

func TestKPAWantsPokeOnlyWhenColdAndLoaded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ScaleToZeroGrace = 0
	target1(&cfg)
	k := NewKPA(cfg, t0)
	if !k.WantsPoke(1) || k.WantsPoke(0) {
		t.Fatalf("fresh KPA: WantsPoke(1), WantsPoke(0) = %v, %v; want true, false", k.WantsPoke(1), k.WantsPoke(0))
	}
	run(t, k, []step{rec(0, 0, 1), decide(0, 0, 1)})
	if k.WantsPoke(5) {
		t.Fatal("WantsPoke(5) after scaling to 1 = true, want false")
	}
	run(t, k, []step{rec(1, 60, 0), decide(60, 1, 0)})
	if !k.WantsPoke(0.5) {
		t.Fatal("WantsPoke(0.5) after scaling to 0 = false, want true")
	}
}

func TestKPASetConfigKeepsWindowData(t *testing.T) {
	for _, window := range []time.Duration{10 * time.Second, 60 * time.Second, 120 * time.Second} {
		k := NewKPA(DefaultConfig(), t0)
		run(t, k, []step{rec(0, 59, 7)})
		cfg := DefaultConfig()
		cfg.StableWindow = window
		k.SetConfig(cfg)
		if d := k.Decide(at(59), 10); d.StableAvg != 7 || d.PanicAvg != 7 || d.NoData {
			t.Errorf("window %v: after SetConfig Decide = %+v, want averages 7 with data", window, d)
		}
	}
}

func TestKPASetConfigKeepsScaleDownDelayHistory(t *testing.T) {
	cfg := DefaultConfig()
	target1(&cfg)
	cfg.StableWindow, cfg.ScaleDownDelay = 6*time.Second, 10*time.Second
	k := NewKPA(cfg, t0)
	run(t, k, []step{rec(0, 5, 10), decide(5, 10, 10), rec(6, 15, 2)})
	cfg.ScaleDownDelay = 20 * time.Second
	k.SetConfig(cfg)
	// 10s after the 10 was decided: the old delay would drop it, the new one keeps it.
	run(t, k, []step{decide(15, 10, 10), rec(16, 25, 2), decide(25, 10, 5)})
}

func TestKPASetConfigPanicDisabledLeavesPanic(t *testing.T) {
	cfg := DefaultConfig()
	target1(&cfg)
	k := NewKPA(cfg, t0)
	run(t, k, []step{rec(0, 53, 10), rec(54, 59, 20), decidePanic(59, 10, 20)})
	cfg.PanicDisabled = true
	k.SetConfig(cfg)
	run(t, k, []step{rec(60, 60, 10), decide(60, 20, 11)})
}

func TestKPAAdoptionSurvivesAMaxScaleChange(t *testing.T) {
	cfg := DefaultConfig()
	k := NewKPA(cfg, t0)
	k.Adopt(at(0), 5)
	cfg.MaxScale = 3
	k.SetConfig(cfg)
	run(t, k, []step{decideNoData(1, 5, 3)})
	cfg.MaxScale = 0
	k.SetConfig(cfg)
	run(t, k, []step{decideNoData(2, 3, 5)})
}

func TestNewKPAReplacesInvalidFieldsWithDefaults(t *testing.T) {
	// A zero Config fails Validate everywhere; NewKPA must still behave like the defaults.
	bad, good := NewKPA(Config{}, t0), NewKPA(DefaultConfig(), t0)
	for _, k := range []*KPA{bad, good} {
		run(t, k, []step{rec(0, 0, 1)})
	}
	if b, g := bad.Decide(at(0), 0), good.Decide(at(0), 0); b.Desired != g.Desired || b.Desired != 2 {
		t.Fatalf("zero config decided %+v, default %+v; want Desired 2 for both", b, g)
	}
}

// TestKPADecisionsAreDeterministicAndBounded drives random valid configs with random
// traffic twice and checks that both runs agree and every decision respects the bounds.
func TestKPADecisionsAreDeterministicAndBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 200 {
		cfg := randomConfig(rng)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("iteration %d: random config invalid: %v", iter, err)
		}
		seed := rng.Uint64()
		a, b := playRandom(cfg, seed), playRandom(cfg, seed)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("iteration %d decision %d: runs differ: %+v vs %+v", iter, i, a[i], b[i])
			}
			d := a[i]
			if d.Desired < cfg.MinScale || (cfg.MaxScale > 0 && d.Desired > cfg.MaxScale) ||
				(!cfg.EnableScaleToZero && d.Desired < 1) {
				t.Fatalf("iteration %d decision %d: Desired %d outside bounds of %+v", iter, i, d.Desired, cfg)
			}
		}
	}
}

func randomConfig(rng *rand.Rand) Config {
	c := DefaultConfig()
	c.TargetConcurrency = 0.01 + rng.Float64()*10
	c.StableWindow = time.Duration(1+rng.IntN(90)) * time.Second
	c.PanicWindowPercent = 1 + rng.Float64()*99
	c.PanicThreshold = 1.01 + rng.Float64()*3
	c.MaxScaleUpRate = 1.01 + rng.Float64()*10
	c.MaxScaleDownRate = 1.01 + rng.Float64()*4
	c.ScaleToZeroGrace = time.Duration(rng.IntN(60)) * time.Second
	c.EnableScaleToZero = rng.IntN(4) != 0
	c.MaxScale = rng.IntN(20)
	c.MinScale = rng.IntN(3)
	if c.MaxScale > 0 {
		c.MinScale = min(c.MinScale, c.MaxScale)
	}
	c.ActivationScale = 1 + rng.IntN(3)
	c.ScaleDownDelay = time.Duration(rng.IntN(20)) * time.Second
	c.PanicDisabled = rng.IntN(3) == 0
	return c
}

// playRandom runs 600 seconds of bursty traffic, deciding every 2s with ready lagging
// the previous decision, and returns every decision.
func playRandom(cfg Config, seed uint64) []Decision {
	rng := rand.New(rand.NewPCG(seed, seed))
	k := NewKPA(cfg, t0)
	var out []Decision
	ready, load := 0, 0.0
	for sec := range 600 {
		if rng.IntN(20) == 0 {
			load = float64(rng.IntN(4)) * rng.Float64() * 50
		}
		if rng.IntN(10) != 0 { // occasionally a report is missing
			k.Record(at(sec), load)
		}
		if rng.IntN(100) == 0 {
			k.Adopt(at(sec), rng.IntN(10))
		}
		if sec%2 == 0 {
			d := k.Decide(at(sec), ready)
			out = append(out, d)
			ready = d.Desired
		}
	}
	return out
}

func TestKPAHotPathDoesNotAllocate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ScaleDownDelay = 10 * time.Second
	k := NewKPA(cfg, t0)
	sec := 0
	if n := testing.AllocsPerRun(1000, func() {
		sec++
		k.Record(at(sec), float64(sec%17))
		k.Decide(at(sec), sec%23)
	}); n != 0 {
		t.Fatalf("Record+Decide allocate %v times per run, want 0", n)
	}
}

// A function that yields its idle sandboxes holds the yielded scale until
// load of its own arrives: the window's old load, panic mode, the
// scale-down delay and an adoption no longer bring the room back.
func TestKPAYieldForgetsTheLoadBehindTheScale(t *testing.T) {
	cfg := DefaultConfig()
	target1(&cfg)
	cfg.ScaleDownDelay = 30 * time.Second
	k := NewKPA(cfg, t0)
	// A burst into panic, then quiet: the window, the delay and panic mode
	// all keep 4.
	run(t, k, []step{rec(0, 5, 1), rec(6, 10, 4), decidePanic(10, 1, 4), rec(11, 12, 0), decidePanic(12, 4, 4)})
	k.Adopt(at(12), 4)
	k.Yield(at(13), 1)
	run(t, k, []step{decideNoData(14, 1, 1)})
	// Idle records lead to zero after the grace, as for any idle function.
	run(t, k, []step{rec(15, 15, 0), decide(15, 1, 1), rec(16, 46, 0), decide(46, 1, 0)})
	// New load is decided on alone.
	run(t, k, []step{rec(47, 47, 2), decide(47, 0, 1)})
}

package keepalive

import (
	"cmp"
	"math"
	"time"
)

// Hybrid is the hybrid histogram policy of Shahrad et al. ("Serverless in
// the Wild", USENIX ATC'20, §4), Azure Functions' production policy. It
// learns each function's idle times (from the end of its last activity to
// its next call) in a histogram of HybridConfig.Bin-wide bins over
// HybridConfig.Range, and from it decides two windows per function:
//
//   - pre-warm: how long after its activity ends the function is unloaded
//     before a sandbox is brought back (0: it is not unloaded);
//   - keep-alive: how long that sandbox is then kept (from the pre-warm
//     point, or from the activity's end when the pre-warm is 0).
//
// When the histogram is representative (enough idle times, and bin counts
// concentrated: their coefficient of variation at least MinCV), the
// pre-warm window is its Head percentile less Margin and the keep-alive
// reaches its Tail percentile plus Margin. When it is not, the function
// gets the Fallback keep-alive with no pre-warm (a fixed keep-alive, as
// before the policy knew it). When most idle times fall beyond the range,
// the histogram cannot say: the next idle time is forecast as the mean of
// the recent out-of-range ones, pre-warmed ForecastMargin before it and
// kept 2×ForecastMargin (the paper fits an ARIMA model there; brisk's
// forecast is the simpler mean, docs/policies.md).
//
// Like every policy it is a pure value: the caller passes idle times in
// and asks for windows; it reads no clock and is not safe for concurrent
// use.
type Hybrid struct {
	cfg HybridConfig
	fns map[string]*idleHistogram
}

// HybridConfig holds the policy's parameters; zero fields take the paper's
// values (DefaultHybridConfig). Durations and percentages are positive.
type HybridConfig struct {
	Bin, Range time.Duration
	// Head and Tail are the percentiles (0-100) the windows come from.
	Head, Tail float64
	// Margin widens the windows on both sides (a fraction).
	Margin float64
	// MinCV is the least coefficient of variation of the bin counts for
	// a representative histogram; MinSamples the fewest idle times.
	MinCV      float64
	MinSamples int
	// OutOfRange is the fraction of idle times beyond Range above which
	// the next one is forecast instead.
	OutOfRange float64
	// ForecastMargin is the forecast's window on either side (a fraction).
	ForecastMargin float64
}

// DefaultHybridConfig: 1-minute bins over 4 hours, the 5th and 99th
// percentiles with a 10 % margin, representative from a CV of 2, as in
// the paper.
func DefaultHybridConfig() HybridConfig {
	return HybridConfig{Bin: time.Minute, Range: 4 * time.Hour, Head: 5, Tail: 99, Margin: 0.10, MinCV: 2, MinSamples: 10,
		OutOfRange: 0.5, ForecastMargin: 0.15}
}

// HybridWindows is what Hybrid decides for one function.
type HybridWindows struct {
	Prewarm, KeepAlive time.Duration
	// Mode says where they came from: "histogram", "forecast" or
	// "fallback".
	Mode string
}

type idleHistogram struct {
	bins       []uint32
	inRange    int
	outOfRange int
	recentOOR  []time.Duration // the last few idle times beyond the range
	// windows is what the histogram says, computed once per change: the
	// reconciler asks at every decision, idle times come rarely.
	windows HybridWindows
	stale   bool
}

// NewHybrid returns the policy with cfg (zero fields: the defaults).
func NewHybrid(cfg HybridConfig) *Hybrid {
	d := DefaultHybridConfig()
	cfg.Bin, cfg.Range = cmp.Or(cfg.Bin, d.Bin), cmp.Or(cfg.Range, d.Range)
	cfg.Head, cfg.Tail, cfg.Margin = cmp.Or(cfg.Head, d.Head), cmp.Or(cfg.Tail, d.Tail), cmp.Or(cfg.Margin, d.Margin)
	cfg.MinCV, cfg.MinSamples = cmp.Or(cfg.MinCV, d.MinCV), cmp.Or(cfg.MinSamples, d.MinSamples)
	cfg.OutOfRange, cfg.ForecastMargin = cmp.Or(cfg.OutOfRange, d.OutOfRange), cmp.Or(cfg.ForecastMargin, d.ForecastMargin)
	return &Hybrid{cfg: cfg, fns: map[string]*idleHistogram{}}
}

// Observe records an idle time of key.
func (h *Hybrid) Observe(key string, idle time.Duration) {
	if idle < 0 {
		return
	}
	f := h.fns[key]
	if f == nil {
		f = &idleHistogram{bins: make([]uint32, int(h.cfg.Range/h.cfg.Bin))}
		h.fns[key] = f
	}
	if idle >= h.cfg.Range {
		f.outOfRange++
		f.recentOOR = append(f.recentOOR, idle)
		if len(f.recentOOR) > 8 {
			f.recentOOR = f.recentOOR[1:]
		}
		f.stale = true
		return
	}
	f.bins[int(idle/h.cfg.Bin)]++
	f.inRange++
	f.stale = true
}

// Forget drops what the policy learned of key (a deleted function).
func (h *Hybrid) Forget(key string) { delete(h.fns, key) }

// Windows decides key's windows; fallback is its keep-alive while its
// histogram is not representative.
func (h *Hybrid) Windows(key string, fallback time.Duration) HybridWindows {
	f := h.fns[key]
	if f == nil {
		return HybridWindows{KeepAlive: fallback, Mode: "fallback"}
	}
	if f.stale {
		f.windows, f.stale = h.decide(f), false
	}
	if f.windows.Mode == "fallback" {
		return HybridWindows{KeepAlive: fallback, Mode: "fallback"}
	}
	return f.windows
}

// decide computes f's windows; a fallback leaves KeepAlive to the caller's.
func (h *Hybrid) decide(f *idleHistogram) HybridWindows {
	total := f.inRange + f.outOfRange
	if total >= h.cfg.MinSamples && float64(f.outOfRange) > h.cfg.OutOfRange*float64(total) {
		var sum time.Duration
		for _, d := range f.recentOOR {
			sum += d
		}
		mean := sum / time.Duration(len(f.recentOOR))
		m := time.Duration(float64(mean) * h.cfg.ForecastMargin)
		return HybridWindows{Prewarm: mean - m, KeepAlive: 2 * m, Mode: "forecast"}
	}
	if f.inRange < h.cfg.MinSamples || cv(f.bins) < h.cfg.MinCV {
		return HybridWindows{Mode: "fallback"}
	}
	head := percentileBin(f.bins, f.inRange, h.cfg.Head)
	tail := percentileBin(f.bins, f.inRange, h.cfg.Tail) + 1 // the bin's upper edge
	pre := time.Duration(float64(time.Duration(head)*h.cfg.Bin) * (1 - h.cfg.Margin))
	if head == 0 {
		pre = 0 // calls come within a bin of the last: never unload
	}
	keep := time.Duration(float64(time.Duration(tail)*h.cfg.Bin)*(1+h.cfg.Margin)) - pre
	return HybridWindows{Prewarm: pre, KeepAlive: keep, Mode: "histogram"}
}

// percentileBin is the bin holding the p-th percentile of n counts.
func percentileBin(bins []uint32, n int, p float64) int {
	want := int(math.Ceil(p / 100 * float64(n)))
	want = max(want, 1)
	seen := 0
	for i, c := range bins {
		seen += int(c)
		if seen >= want {
			return i
		}
	}
	return len(bins) - 1
}

// cv is the coefficient of variation of the bin counts.
func cv(bins []uint32) float64 {
	var sum, sq float64
	for _, c := range bins {
		x := float64(c)
		sum += x
		sq += x * x
	}
	n := float64(len(bins))
	mean := sum / n
	if mean == 0 {
		return 0
	}
	v := sq/n - mean*mean
	return math.Sqrt(max(v, 0)) / mean
}

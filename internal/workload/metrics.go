package workload

import (
	"math"
	"slices"
	"strconv"
)

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of ascending values,
// interpolating linearly between the two closest ranks — numpy's default,
// which the papers' analysis scripts use — or NaN when there are none.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	h := p / 100 * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	if lo < 0 {
		return sorted[0]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// Dist summarises a distribution (milliseconds, or a ratio for slowdown).
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// NewDist sorts values in place and summarises them; an empty input gives
// the zero Dist (JSON cannot carry NaN).
func NewDist(values []float64) Dist {
	if len(values) == 0 {
		return Dist{}
	}
	slices.Sort(values)
	sum := 0.0
	for _, v := range values {
		sum += v
	}
	return Dist{N: len(values), Mean: sum / float64(len(values)), P50: Percentile(values, 50), P90: Percentile(values, 90),
		P99: Percentile(values, 99), P999: Percentile(values, 99.9), Max: values[len(values)-1]}
}

// Summary is the part of summary.json every command writes. It covers the
// measured phase (phase 2) only.
type Summary struct {
	// Issued counts calls the generator sent (or refused to send for
	// overload); Completed those answered 200 with a body; Failed the rest.
	Issued    int `json:"issued"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// ThroughputRPS is Completed over the span from the first send to the
	// last successful reply.
	ThroughputRPS float64 `json:"throughput_rps"`
	// LatencyMs is the response time (send to last byte) of completed calls.
	LatencyMs Dist `json:"latency_ms"`
	// LatenessMs is how late the generator sent (all issued calls).
	LatenessMs Dist `json:"lateness_ms"`
	// ColdStarts counts replies with X-Brisk-Timing cold=true.
	ColdStarts int `json:"cold_starts"`
	// Statuses counts replies by HTTP status ("0": no reply).
	Statuses        map[string]int `json:"statuses"`
	ConnTimeouts    int            `json:"connection_timeouts"`
	FuncTimeouts    int            `json:"function_timeouts"`
	WarmupIssued    int            `json:"warmup_issued"`
	WarmupCompleted int            `json:"warmup_completed"`
}

// Summarize computes the Summary of recs.
func Summarize(recs []Record) Summary {
	s := Summary{Statuses: map[string]int{}}
	var lat, late []float64
	first, last := int64(math.MaxInt64), int64(math.MinInt64)
	for i := range recs {
		r := &recs[i]
		if r.StartTime == 0 {
			continue // never sent: the run was cut short
		}
		if r.Phase == 1 {
			s.WarmupIssued++
			if r.OK() {
				s.WarmupCompleted++
			}
			continue
		}
		s.Issued++
		s.Statuses[strconv.Itoa(r.Status)]++
		late = append(late, float64(r.LatenessUs)/1000)
		if r.ConnTimeout {
			s.ConnTimeouts++
		}
		if r.FuncTimeout {
			s.FuncTimeouts++
		}
		if !r.OK() {
			s.Failed++
			continue
		}
		s.Completed++
		if r.Cold {
			s.ColdStarts++
		}
		lat = append(lat, float64(r.ResponseUs)/1000)
		first, last = min(first, r.StartTime), max(last, r.StartTime+r.ResponseUs)
	}
	s.LatencyMs, s.LatenessMs = NewDist(lat), NewDist(late)
	if s.Completed > 0 && last > first {
		s.ThroughputRPS = float64(s.Completed) / (float64(last-first) / 1e6)
	}
	return s
}

// SlowdownOptions are the papers' filters for the Dirigent and KubeDirect
// variants (docs/benchmarks.md, "Metric definitions").
type SlowdownOptions struct {
	// WarmupColumns is subtracted from an invocation id's column number to
	// give its minute of the measured phase.
	WarmupColumns int
	// SkipMinutes drops the first minutes of the measured phase: 10 in both
	// papers' scripts (ids min0.…min9. with no warm-up).
	SkipMinutes int
	// ColumnsPerMinute is 60 in second granularity, else 1.
	ColumnsPerMinute int
}

// DefaultSkipMinutes is the papers' first-10-minutes exclusion.
const DefaultSkipMinutes = 10

// Slowdown is the slowdown part of a replay summary. Slowdown of one call
// is responseTime / requestedDuration.
type Slowdown struct {
	// GeomeanP99, brisk's headline: over every completed measured-phase
	// call (no minute or slowdown<1 filter), each function's p99
	// slowdown; then the geometric mean over functions.
	GeomeanP99 float64 `json:"geomean_p99"`
	Functions  int     `json:"functions"`
	// DirigentGmeanMedian: calls of measured minutes ≥ SkipMinutes with
	// slowdown ≥ 1; each function's geometric mean; then the median over
	// functions. Null when the filters leave no call.
	DirigentGmeanMedian *float64 `json:"dirigent_gmean_median"`
	// KubeDirectMeanMedian: the same filters; each function's arithmetic
	// mean; then the median over functions.
	KubeDirectMeanMedian *float64 `json:"kubedirect_mean_median"`
	FilteredFunctions    int      `json:"filtered_functions"`
	FilteredCalls        int      `json:"filtered_calls"`
	SkipMinutes          int      `json:"skip_minutes"`
	// DroppedBelowOne counts calls the slowdown<1 filter removed.
	DroppedBelowOne int `json:"dropped_below_one"`
}

// PerFunction holds the per-function values behind the slowdown CDFs.
type PerFunction struct {
	P99, DirigentGmean, KubeDirectMean []float64
	SchedMeanMs                        []float64 // mean scheduling latency per function
}

// Slowdowns computes the three slowdown variants over completed phase-2
// calls with a positive requested duration.
func Slowdowns(recs []Record, opt SlowdownOptions) (Slowdown, PerFunction) {
	cpm := max(opt.ColumnsPerMinute, 1)
	all := map[string][]float64{}
	filtered := map[string][]float64{}
	out := Slowdown{SkipMinutes: opt.SkipMinutes}
	for i := range recs {
		r := &recs[i]
		if r.Phase != 2 || !r.OK() || r.RequestedUs <= 0 || r.ResponseUs <= 0 {
			continue
		}
		sd := float64(r.ResponseUs) / float64(r.RequestedUs)
		all[r.Function] = append(all[r.Function], sd)
		if m := r.Minute(); m < 0 || (m-opt.WarmupColumns)/cpm < opt.SkipMinutes {
			continue
		}
		if sd < 1 {
			out.DroppedBelowOne++
			continue
		}
		filtered[r.Function] = append(filtered[r.Function], sd)
		out.FilteredCalls++
	}
	var pf PerFunction
	for _, name := range sortedKeys(all) {
		v := all[name]
		slices.Sort(v)
		pf.P99 = append(pf.P99, Percentile(v, 99))
	}
	out.Functions = len(pf.P99)
	out.GeomeanP99 = geomean(pf.P99)
	for _, name := range sortedKeys(filtered) {
		v := filtered[name]
		pf.DirigentGmean = append(pf.DirigentGmean, geomean(v))
		pf.KubeDirectMean = append(pf.KubeDirectMean, mean(v))
	}
	out.FilteredFunctions = len(pf.DirigentGmean)
	if out.FilteredFunctions > 0 {
		d := slices.Sorted(slices.Values(pf.DirigentGmean))
		k := slices.Sorted(slices.Values(pf.KubeDirectMean))
		dm, km := Percentile(d, 50), Percentile(k, 50)
		out.DirigentGmeanMedian, out.KubeDirectMeanMedian = &dm, &km
	}
	return out, pf
}

// SchedulingLatency returns, for completed phase-2 calls, responseTime −
// actualDuration in ms, and each function's mean of it.
func SchedulingLatency(recs []Record) (values, perFunctionMean []float64) {
	byFn := map[string][]float64{}
	for i := range recs {
		r := &recs[i]
		if r.Phase != 2 || !r.OK() {
			continue
		}
		v := float64(r.ResponseUs-r.ActualUs) / 1000
		values = append(values, v)
		byFn[r.Function] = append(byFn[r.Function], v)
	}
	for _, name := range sortedKeys(byFn) {
		perFunctionMean = append(perFunctionMean, mean(byFn[name]))
	}
	return values, perFunctionMean
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// geomean is exp(mean(ln v)); 0 for an empty input.
func geomean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += math.Log(x)
	}
	return math.Exp(s / float64(len(v)))
}

// MemorySample is the cluster's reserved memory at one instant, and how
// much of it belonged to sandboxes serving a request.
type MemorySample struct {
	At         float64 // seconds from the start of sampling
	ReservedMB float64 // Σ requested MiB of live sandboxes
	BusyMB     float64 // the part of ReservedMB whose sandbox had a request in flight
}

// MemoryCost is the memory reserved by sandboxes over a run.
type MemoryCost struct {
	// GBs is ∫ reserved memory dt in GiB·s (left Riemann sum over samples).
	GBs float64 `json:"gb_s"`
	// IdleShare is the share of GBs reserved by sandboxes with no request
	// in flight.
	IdleShare float64 `json:"idle_share"`
	Samples   int     `json:"samples"`
	Method    string  `json:"method"`
}

// ComputeMemoryCost integrates samples (ascending At); each sample holds
// until the next.
func ComputeMemoryCost(samples []MemorySample) MemoryCost {
	c := MemoryCost{Samples: len(samples)}
	var reserved, busy float64
	for i := 0; i+1 < len(samples); i++ {
		dt := samples[i+1].At - samples[i].At
		if dt <= 0 {
			continue
		}
		reserved += samples[i].ReservedMB * dt
		busy += min(samples[i].BusyMB, samples[i].ReservedMB) * dt
	}
	c.GBs = reserved / 1024
	if reserved > 0 {
		c.IdleShare = 1 - busy/reserved
	}
	return c
}

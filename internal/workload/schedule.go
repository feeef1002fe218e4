package workload

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// IAT is an inter-arrival-time distribution inside one column.
type IAT int

// The loader's distributions (docs/benchmarks.md, "brisk replay").
const (
	Exponential IAT = iota // Exp(1) gaps rescaled to fill the column
	Uniform                // U[0,1) gaps rescaled to fill the column
	Equidistant            // n equal gaps
)

func (d IAT) String() string {
	switch d {
	case Exponential:
		return "exponential"
	case Uniform:
		return "uniform"
	case Equidistant:
		return "equidistant"
	}
	return "IAT(" + strconv.Itoa(int(d)) + ")"
}

// ParseIAT parses exponential|uniform|equidistant, each optionally with the
// _shift suffix.
func ParseIAT(s string) (d IAT, shift bool, err error) {
	base, shift := strings.CutSuffix(s, "_shift")
	switch base {
	case "exponential":
		return Exponential, shift, nil
	case "uniform":
		return Uniform, shift, nil
	case "equidistant":
		return Equidistant, shift, nil
	}
	return 0, false, fmt.Errorf("IAT distribution %q: want exponential, uniform or equidistant, optionally with _shift", s)
}

// Granularity is what one trace column counts.
type Granularity int

const (
	Minute Granularity = iota // the Azure trace: invocations per minute
	Second                    // the loader's "second" mode: each column is one second
)

// Period is the length of one column.
func (g Granularity) Period() time.Duration {
	if g == Second {
		return time.Second
	}
	return time.Minute
}

func (g Granularity) prefix() string {
	if g == Second {
		return "sec"
	}
	return "min"
}

// ParseGranularity parses minute|second.
func ParseGranularity(s string) (Granularity, error) {
	switch s {
	case "minute":
		return Minute, nil
	case "second":
		return Second, nil
	}
	return 0, fmt.Errorf("granularity %q: want minute or second", s)
}

// The loader's clamps on drawn values.
const (
	DefaultMinRuntime = time.Millisecond
	DefaultMaxRuntime = 60 * time.Second
	DefaultMinMemory  = 1
	DefaultMaxMemory  = 10240
)

// ScheduleConfig says how to turn a trace window into invocations.
type ScheduleConfig struct {
	Seed        uint64
	IAT         IAT
	Shift       bool // rotate each column's arrivals by a random offset
	Granularity Granularity
	// WarmupColumns are the first columns of the window: phase 1. The rest
	// are the measured phase 2.
	WarmupColumns int
	// Runtime and memory clamps; zero means the loader's defaults
	// [1 ms, 60 s] and [1, 10240] MiB.
	MinRuntime, MaxRuntime   time.Duration
	MinMemoryMB, MaxMemoryMB int
}

func (c *ScheduleConfig) defaults() {
	c.MinRuntime = cmp.Or(c.MinRuntime, DefaultMinRuntime)
	c.MaxRuntime = cmp.Or(c.MaxRuntime, DefaultMaxRuntime)
	c.MinMemoryMB = cmp.Or(c.MinMemoryMB, DefaultMinMemory)
	c.MaxMemoryMB = cmp.Or(c.MaxMemoryMB, DefaultMaxMemory)
}

// Invocation is one scheduled call.
type Invocation struct {
	Offset    time.Duration // from the start of the run, in trace time (µs resolution)
	Func      int32         // index into Schedule.Functions
	Column    int32         // column of the window, warm-up included
	Index     int32         // k-th invocation of the function in its column
	RuntimeMs int32
	MemoryMB  int32
}

// Schedule is a whole run's invocations, sorted by offset (ties: function
// index, then k).
type Schedule struct {
	Functions     []Function
	Invocations   []Invocation
	Granularity   Granularity
	WarmupColumns int
	Columns       int // warm-up included
}

// Phase is 1 for warm-up invocations and 2 for measured ones.
func (s *Schedule) Phase(inv *Invocation) int {
	if int(inv.Column) < s.WarmupColumns {
		return 1
	}
	return 2
}

// InvocationID is the loader's id: min<column>.inv<k> (sec… in second
// granularity), the column counted from the start of the window.
func (s *Schedule) InvocationID(inv *Invocation) string {
	return s.Granularity.prefix() + strconv.Itoa(int(inv.Column)) + ".inv" + strconv.Itoa(int(inv.Index))
}

// ColumnCounts returns the number of scheduled invocations per column.
func (s *Schedule) ColumnCounts() []int {
	out := make([]int, s.Columns)
	for i := range s.Invocations {
		out[s.Invocations[i].Column]++
	}
	return out
}

// BuildSchedule draws the invocations of every function of t. Each function
// has its own random streams (one for arrivals, one for runtime and memory),
// seeded from Seed and its row, so the schedule is the same for a seed
// whatever else changes: another IAT keeps the runtimes, a function subset
// keeps each function's arrivals.
func BuildSchedule(t *Trace, cfg ScheduleConfig) (*Schedule, error) {
	cfg.defaults()
	if cfg.WarmupColumns < 0 || cfg.WarmupColumns >= t.Columns {
		return nil, fmt.Errorf("schedule: %d warm-up columns of %d: want at least one measured column", cfg.WarmupColumns, t.Columns)
	}
	if cfg.MinRuntime > cfg.MaxRuntime || cfg.MinMemoryMB > cfg.MaxMemoryMB {
		return nil, fmt.Errorf("schedule: runtime clamp [%s, %s] or memory clamp [%d, %d] MiB is empty",
			cfg.MinRuntime, cfg.MaxRuntime, cfg.MinMemoryMB, cfg.MaxMemoryMB)
	}
	s := &Schedule{Functions: t.Functions, Granularity: cfg.Granularity, WarmupColumns: cfg.WarmupColumns, Columns: t.Columns}
	s.Invocations = make([]Invocation, 0, t.Invocations())
	period := cfg.Granularity.Period().Microseconds()
	var offs []int64
	for fi := range t.Functions {
		f := &t.Functions[fi]
		arrivals := rand.New(rand.NewPCG(cfg.Seed, mix(uint64(f.Row)<<1)))
		specs := rand.New(rand.NewPCG(cfg.Seed, mix(uint64(f.Row)<<1|1)))
		for col, n := range f.Invocations {
			if n == 0 {
				continue // an idle column is 60 s without arrivals
			}
			offs = columnOffsets(arrivals, cfg.IAT, cfg.Shift, n, period, offs[:0])
			base := int64(col) * period
			for k, o := range offs {
				s.Invocations = append(s.Invocations, Invocation{
					Offset:    time.Duration(base+o) * time.Microsecond,
					Func:      int32(fi),
					Column:    int32(col),
					Index:     int32(k),
					RuntimeMs: int32(DrawRuntime(specs, &f.Duration, cfg.MinRuntime, cfg.MaxRuntime)),
					MemoryMB:  int32(DrawMemory(specs, &f.Memory, cfg.MinMemoryMB, cfg.MaxMemoryMB)),
				})
			}
		}
	}
	slices.SortFunc(s.Invocations, func(a, b Invocation) int {
		if c := cmp.Compare(a.Offset, b.Offset); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Func, b.Func); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Column, b.Column); c != 0 {
			return c
		}
		return cmp.Compare(a.Index, b.Index)
	})
	return s, nil
}

// mix is splitmix64's finaliser: nearby rows get unrelated PCG states.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// columnOffsets returns the n arrival offsets inside one column of period
// µs, ascending, in [0, period). The n gaps between consecutive arrivals and
// from the last arrival to the column's end sum to exactly period: the
// loader rescales exponential and uniform draws so the column's count is
// kept. Without shift the first arrival is at 0; with shift the arrivals
// are rotated by a uniform offset in [0, period).
func columnOffsets(r *rand.Rand, d IAT, shift bool, n int, period int64, out []int64) []int64 {
	gaps := make([]float64, n)
	total := 0.0
	for i := range gaps {
		switch d {
		case Exponential:
			gaps[i] = r.ExpFloat64()
		case Uniform:
			gaps[i] = r.Float64()
		default:
			gaps[i] = 1
		}
		total += gaps[i]
	}
	if total == 0 { // n uniform draws of exactly 0: vanishingly rare
		for i := range gaps {
			gaps[i] = 1
		}
		total = float64(n)
	}
	// Offsets are rounded cumulative sums, so rounding never accumulates
	// and the last gap closes the column exactly.
	cum := 0.0
	for i := 0; i < n; i++ {
		o := int64(math.Round(cum / total * float64(period)))
		out = append(out, min(o, period-1))
		cum += gaps[i]
	}
	if shift {
		sh := r.Int64N(period)
		for i := range out {
			out[i] = (out[i] + sh) % period
		}
		slices.Sort(out)
	}
	return out
}

// duration quantile levels and memory quantile levels of the trace files.
var (
	durationLevels = []float64{0, 0.01, 0.25, 0.50, 0.75, 0.99, 1}
	memoryLevels   = []float64{0.01, 0.05, 0.25, 0.50, 0.75, 0.95, 0.99, 1}
)

// DrawRuntime draws a runtime in ms the loader's way: a uniform quantile q
// picks the percentile bracket of durations.csv containing it (0–1, 1–25,
// 25–50, 50–75, 75–99, 99–100), and the value is uniform inside the
// bracket, rounded to a whole millisecond, then clamped to [lo, hi].
func DrawRuntime(r *rand.Rand, d *DurationStats, lo, hi time.Duration) int {
	v := drawBracket(r, durationLevels, []float64{d.P0, d.P1, d.P25, d.P50, d.P75, d.P99, d.P100})
	return int(min(max(v, lo.Milliseconds()), hi.Milliseconds()))
}

// DrawMemory draws memory in MiB from the brackets 1–5, 5–25, 25–50, 50–75,
// 75–95, 95–99, 99–100 of memory.csv; a quantile below 1 % takes pct1 (the
// trace has no pct0). The value is rounded and clamped to [lo, hi].
func DrawMemory(r *rand.Rand, m *MemoryStats, lo, hi int) int {
	v := drawBracket(r, memoryLevels, []float64{m.P1, m.P5, m.P25, m.P50, m.P75, m.P95, m.P99, m.P100})
	return int(min(max(v, int64(lo)), int64(hi)))
}

// drawBracket draws q ~ U[0,1); below levels[0] it returns vals[0]; else
// it finds the bracket levels[i] < q ≤ levels[i+1] and returns a uniform
// value between vals[i] and vals[i+1], rounded half up.
func drawBracket(r *rand.Rand, levels, vals []float64) int64 {
	q, u := r.Float64(), r.Float64() // always two draws: streams stay aligned
	if q < levels[0] {
		return int64(math.Round(vals[0]))
	}
	i := 0
	for i < len(levels)-2 && q > levels[i+1] {
		i++
	}
	a, b := vals[i], vals[i+1]
	if b < a { // non-monotonic percentiles: draw between them anyway
		a, b = b, a
	}
	return int64(math.Floor(a + u*(b-a) + 0.5))
}

// ResourceRequest is the loader's per-function resource request: the
// function's pct100 memory and one vCPU, both divided by the overcommit
// factor 10 (docs/benchmarks.md, "brisk replay"), memory clamped to [1, 10240] MiB.
func ResourceRequest(f *Function) (milliCPU, memoryMB int64) {
	const overcommit = 10
	mem := int64(math.Ceil(f.Memory.P100 / overcommit))
	return 1000 / overcommit, min(max(mem, 1), DefaultMaxMemory)
}

// WriteCSV writes the schedule as function,offset_us,runtime_ms,memory_mb,
// with offsets multiplied by timeScale (1 = trace time).
func (s *Schedule) WriteCSV(w io.Writer, timeScale float64) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	bw.WriteString("function,offset_us,runtime_ms,memory_mb\n")
	var b []byte
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		b = append(b[:0], s.Functions[inv.Func].Name()...)
		b = append(b, ',')
		b = strconv.AppendInt(b, ScaleOffset(inv.Offset, timeScale).Microseconds(), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(inv.RuntimeMs), 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(inv.MemoryMB), 10)
		b = append(b, '\n')
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ScaleOffset compresses a trace offset by timeScale (0.1: a minute of
// trace in 6 s), to the microsecond.
func ScaleOffset(d time.Duration, timeScale float64) time.Duration {
	if timeScale == 1 {
		return d
	}
	return time.Duration(math.Round(float64(d.Microseconds())*timeScale)) * time.Microsecond
}

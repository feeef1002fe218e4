package workload

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Trace file names inside a trace directory.
const (
	InvocationsFile = "invocations.csv"
	DurationsFile   = "durations.csv"
	MemoryFile      = "memory.csv"
)

// Trace is a parsed trace window: one Function per row of invocations.csv
// (in file order), each joined with its durations and memory rows.
type Trace struct {
	Functions []Function
	// Columns is the number of minute (or second) columns in the window.
	Columns int
}

// Function is one trace row.
type Function struct {
	// Row is the 0-based data row in invocations.csv; brisk names the
	// function trace-func-<Row>.
	Row              int
	Hash, Owner, App string
	Trigger          string
	Invocations      []int // per column of the window
	Duration         DurationStats
	Memory           MemoryStats
}

// Name is the function name brisk registers for the row.
func (f *Function) Name() string { return FunctionName(f.Row) }

// FunctionName is the name of trace row r: the loader's trace-func-<row>
// without its random suffix, so repeated runs address the same functions.
func FunctionName(row int) string { return "trace-func-" + strconv.Itoa(row) }

// Total is the number of invocations in the window.
func (f *Function) Total() int {
	n := 0
	for _, c := range f.Invocations {
		n += c
	}
	return n
}

// DurationStats is a durations.csv row, in milliseconds. The percentiles
// are weighted percentiles of 30-second averages (traces/README.md).
type DurationStats struct {
	Average, Count, Minimum, Maximum float64
	P0, P1, P25, P50, P75, P99, P100 float64
}

// MemoryStats is a memory.csv row, in MB. Azure dropped pct0.
type MemoryStats struct {
	SampleCount, Average                  float64
	P1, P5, P25, P50, P75, P95, P99, P100 float64
}

// TraceOptions selects the window of minute columns to read.
type TraceOptions struct {
	// StartColumn skips this many columns after Trigger.
	StartColumn int
	// Columns is how many columns to read (warm-up plus experiment); the
	// trace must have at least StartColumn+Columns.
	Columns int
}

// LoadTrace reads invocations.csv, durations.csv and memory.csv from dir.
// Other files (dirigent.csv) are ignored.
func LoadTrace(dir string, opt TraceOptions) (*Trace, error) {
	open := func(name string) (*os.File, error) {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", dir, err)
		}
		return f, nil
	}
	inv, err := open(InvocationsFile)
	if err != nil {
		return nil, err
	}
	defer inv.Close()
	dur, err := open(DurationsFile)
	if err != nil {
		return nil, err
	}
	defer dur.Close()
	mem, err := open(MemoryFile)
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	t, err := ParseTrace(inv, dur, mem, opt)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", dir, err)
	}
	return t, nil
}

// ParseTrace parses the three trace files. The invocation counts are read
// by position after the Trigger column, as the loader does (the labels are
// minute-of-day in some samples, 1..1440 in others); everything else is
// read by header name, so both memory.csv column orders parse, and numbers
// may be integers or floats.
func ParseTrace(invocations, durations, memory io.Reader, opt TraceOptions) (*Trace, error) {
	if opt.StartColumn < 0 || opt.Columns <= 0 {
		return nil, fmt.Errorf("trace window: start column %d and %d columns: want start ≥ 0 and at least one column", opt.StartColumn, opt.Columns)
	}
	durs, err := parseStats(durations, DurationsFile, []string{"Average", "Count", "Minimum", "Maximum",
		"percentile_Average_0", "percentile_Average_1", "percentile_Average_25", "percentile_Average_50",
		"percentile_Average_75", "percentile_Average_99", "percentile_Average_100"})
	if err != nil {
		return nil, err
	}
	mems, err := parseStats(memory, MemoryFile, []string{"SampleCount", "AverageAllocatedMb",
		"AverageAllocatedMb_pct1", "AverageAllocatedMb_pct5", "AverageAllocatedMb_pct25", "AverageAllocatedMb_pct50",
		"AverageAllocatedMb_pct75", "AverageAllocatedMb_pct95", "AverageAllocatedMb_pct99", "AverageAllocatedMb_pct100"})
	if err != nil {
		return nil, err
	}

	r := newCSVReader(invocations)
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", InvocationsFile, err)
	}
	col := columnIndex(header)
	trig, ok := col["Trigger"]
	if !ok {
		return nil, fmt.Errorf("%s: no Trigger column in header", InvocationsFile)
	}
	hashCol, ok := col["HashFunction"]
	if !ok {
		return nil, fmt.Errorf("%s: no HashFunction column in header", InvocationsFile)
	}
	first := trig + 1 + opt.StartColumn
	if avail := len(header) - trig - 1; opt.StartColumn+opt.Columns > avail {
		return nil, fmt.Errorf("%s: has %d minute columns after Trigger; the window needs %d (start %d + %d)",
			InvocationsFile, avail, opt.StartColumn+opt.Columns, opt.StartColumn, opt.Columns)
	}
	t := &Trace{Columns: opt.Columns}
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", InvocationsFile, err)
		}
		if len(rec) != len(header) {
			return nil, fmt.Errorf("%s line %d: %d fields, header has %d", InvocationsFile, line, len(rec), len(header))
		}
		f := Function{Row: len(t.Functions), Hash: rec[hashCol], Trigger: rec[trig], Invocations: make([]int, opt.Columns)}
		if i, ok := col["HashOwner"]; ok {
			f.Owner = rec[i]
		}
		if i, ok := col["HashApp"]; ok {
			f.App = rec[i]
		}
		for i := range f.Invocations {
			v, err := parseCount(rec[first+i])
			if err != nil {
				return nil, fmt.Errorf("%s line %d column %d (%s): %w", InvocationsFile, line, first+i+1, header[first+i], err)
			}
			f.Invocations[i] = v
		}
		d, ok := durs[f.Hash]
		if !ok {
			return nil, fmt.Errorf("%s line %d: function %s has no row in %s", InvocationsFile, line, f.Hash, DurationsFile)
		}
		m, ok := mems[f.Hash]
		if !ok {
			return nil, fmt.Errorf("%s line %d: function %s has no row in %s", InvocationsFile, line, f.Hash, MemoryFile)
		}
		f.Duration = DurationStats{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10]}
		f.Memory = MemoryStats{m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9]}
		t.Functions = append(t.Functions, f)
	}
	if len(t.Functions) == 0 {
		return nil, fmt.Errorf("%s: no functions", InvocationsFile)
	}
	return t, nil
}

// Invocations is the window's total number of invocations.
func (t *Trace) Invocations() int {
	n := 0
	for i := range t.Functions {
		n += t.Functions[i].Total()
	}
	return n
}

// Busiest returns a trace with the n functions that have the most
// invocations in the window (ties: the earlier row), kept in row order and
// under their row names. n ≤ 0 or ≥ the function count returns t.
func (t *Trace) Busiest(n int) *Trace {
	if n <= 0 || n >= len(t.Functions) {
		return t
	}
	idx := make([]int, len(t.Functions))
	for i := range idx {
		idx[i] = i
	}
	totals := make([]int, len(t.Functions))
	for i := range t.Functions {
		totals[i] = t.Functions[i].Total()
	}
	sort.SliceStable(idx, func(a, b int) bool { return totals[idx[a]] > totals[idx[b]] })
	idx = idx[:n]
	sort.Ints(idx)
	out := &Trace{Columns: t.Columns, Functions: make([]Function, n)}
	for i, j := range idx {
		out.Functions[i] = t.Functions[j]
	}
	return out
}

// Replicate returns a trace of k copies of t's functions: copy c of row r
// is row c×stride+r (stride: one more than the highest row), with the same per-column counts and
// runtime and memory brackets and, being another row, its own draws of
// arrival times and runtimes. It makes a provider-region-sized synthetic
// load from a sample (k = 100: azure_500 becomes 50,000 functions). With
// the equidistant IAT without a shift there is nothing to draw, and every
// copy's arrivals are its original's.
func (t *Trace) Replicate(k int) *Trace {
	if k <= 1 {
		return t
	}
	stride := 0
	for _, f := range t.Functions {
		stride = max(stride, f.Row+1)
	}
	out := &Trace{Columns: t.Columns, Functions: make([]Function, 0, len(t.Functions)*k)}
	for c := range k {
		for _, f := range t.Functions { // the copies share the read-only counts
			f.Row = c*stride + f.Row
			if c > 0 {
				f.Hash = fmt.Sprintf("%s-x%d", f.Hash, c)
			}
			out.Functions = append(out.Functions, f)
		}
	}
	return out
}

func newCSVReader(r io.Reader) *csv.Reader {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	return cr
}

func columnIndex(header []string) map[string]int {
	m := make(map[string]int, len(header))
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if _, dup := m[h]; !dup {
			m[h] = i
		}
	}
	return m
}

// parseStats reads a per-function statistics file into HashFunction →
// the named columns' values, in the order of names.
func parseStats(rd io.Reader, file string, names []string) (map[string][]float64, error) {
	r := newCSVReader(rd)
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", file, err)
	}
	col := columnIndex(header)
	hash, ok := col["HashFunction"]
	if !ok {
		return nil, fmt.Errorf("%s: no HashFunction column in header", file)
	}
	idx := make([]int, len(names))
	for i, n := range names {
		j, ok := col[n]
		if !ok {
			return nil, fmt.Errorf("%s: no %s column in header", file, n)
		}
		idx[i] = j
	}
	out := make(map[string][]float64)
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(rec) != len(header) {
			return nil, fmt.Errorf("%s line %d: %d fields, header has %d", file, line, len(rec), len(header))
		}
		h := rec[hash]
		if _, dup := out[h]; dup {
			return nil, fmt.Errorf("%s line %d: function %s appears twice", file, line, h)
		}
		vals := make([]float64, len(names))
		for i, j := range idx {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[j]), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("%s line %d column %s: %q is not a number", file, line, names[i], rec[j])
			}
			vals[i] = v
		}
		out[h] = vals
	}
}

// parseCount accepts "12" and "12.0": some tools write counts as floats.
func parseCount(s string) (int, error) {
	s = strings.TrimSpace(s)
	if v, err := strconv.Atoi(s); err == nil && v >= 0 {
		return v, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v != math.Trunc(v) || v > math.MaxInt32 {
		return 0, fmt.Errorf("%q is not a non-negative integer count", s)
	}
	return int(v), nil
}

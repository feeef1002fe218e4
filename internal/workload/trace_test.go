package workload

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// traceDir returns traces/name under the module root (the repository
// carries the trace samples).
func traceDir(t *testing.T, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	p := filepath.Join(dir, "traces", name)
	if _, err := os.Stat(filepath.Join(p, InvocationsFile)); err != nil {
		t.Fatalf("trace %s: %v", p, err)
	}
	return p
}

func TestScheduleReproducesTraceCounts(t *testing.T) {
	tests := []struct {
		trace string
		want  int
	}{
		{"azure_500", 171_558},
		{"azure_100", 19_058},
		{"azure_10_fullday", 272_540},
	}
	for _, tc := range tests {
		t.Run(tc.trace, func(t *testing.T) {
			tr, err := LoadTrace(traceDir(t, tc.trace), TraceOptions{Columns: 30})
			if err != nil {
				t.Fatal(err)
			}
			if got := tr.Invocations(); got != tc.want {
				t.Fatalf("trace window has %d invocations, want %d", got, tc.want)
			}
			for _, iat := range []IAT{Exponential, Uniform, Equidistant} {
				s, err := BuildSchedule(tr, ScheduleConfig{Seed: 42, IAT: iat})
				if err != nil {
					t.Fatal(err)
				}
				if len(s.Invocations) != tc.want {
					t.Fatalf("%s: %d invocations scheduled, want %d", iat, len(s.Invocations), tc.want)
				}
				// Per function and column, the count is the trace's.
				got := make([][]int, len(tr.Functions))
				for i := range got {
					got[i] = make([]int, tr.Columns)
				}
				for _, inv := range s.Invocations {
					got[inv.Func][inv.Column]++
					if lo, hi := time.Duration(inv.Column)*time.Minute, time.Duration(inv.Column+1)*time.Minute; inv.Offset < lo || inv.Offset >= hi {
						t.Fatalf("%s: invocation of column %d at %s, outside [%s, %s)", iat, inv.Column, inv.Offset, lo, hi)
					}
				}
				for i := range tr.Functions {
					if !slices.Equal(got[i], tr.Functions[i].Invocations) {
						t.Fatalf("%s: function row %d: per-minute counts %v, trace has %v", iat, i, got[i], tr.Functions[i].Invocations)
					}
				}
				if !slices.IsSortedFunc(s.Invocations, func(a, b Invocation) int { return int(a.Offset - b.Offset) }) {
					t.Fatalf("%s: schedule not sorted by offset", iat)
				}
			}
		})
	}
}

func TestScheduleDeterministicForSeed(t *testing.T) {
	tr, err := LoadTrace(traceDir(t, "azure_100"), TraceOptions{Columns: 10})
	if err != nil {
		t.Fatal(err)
	}
	build := func(seed uint64, iat IAT, shift bool) *Schedule {
		s, err := BuildSchedule(tr, ScheduleConfig{Seed: seed, IAT: iat, Shift: shift})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := build(42, Exponential, false), build(42, Exponential, false)
	if !slices.Equal(a.Invocations, b.Invocations) {
		t.Fatal("two schedules for seed 42 differ")
	}
	var bufA, bufB bytes.Buffer
	a.WriteCSV(&bufA, 1)
	b.WriteCSV(&bufB, 1)
	if !bytes.Equal(bufA.Bytes(), bufB.Bytes()) {
		t.Fatal("dry-run CSVs for seed 42 differ")
	}
	if c := build(43, Exponential, false); slices.Equal(a.Invocations, c.Invocations) {
		t.Fatal("seeds 42 and 43 give the same schedule")
	}
	// Runtimes and memory come from their own stream: another IAT keeps them.
	type spec struct{ fn, col, k, rt, mb int32 }
	specs := func(s *Schedule) []spec {
		var out []spec
		for _, inv := range s.Invocations {
			out = append(out, spec{inv.Func, inv.Column, inv.Index, inv.RuntimeMs, inv.MemoryMB})
		}
		slices.SortFunc(out, func(x, y spec) int {
			if x.fn != y.fn {
				return int(x.fn - y.fn)
			}
			if x.col != y.col {
				return int(x.col - y.col)
			}
			return int(x.k - y.k)
		})
		return out
	}
	if !slices.Equal(specs(a), specs(build(42, Uniform, true))) {
		t.Fatal("changing the IAT distribution changed the drawn runtimes or memory")
	}
	// A subset keeps each function's draws.
	sub := tr.Busiest(5)
	s2, err := BuildSchedule(sub, ScheduleConfig{Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	for _, inv := range s2.Invocations {
		row := sub.Functions[inv.Func].Row
		if !slices.ContainsFunc(a.Invocations, func(x Invocation) bool {
			return tr.Functions[x.Func].Row == row && x == Invocation{inv.Offset, x.Func, inv.Column, inv.Index, inv.RuntimeMs, inv.MemoryMB}
		}) {
			t.Fatalf("function row %d: invocation %+v not in the full schedule", row, inv)
		}
	}
}

func TestColumnOffsetsFillThePeriod(t *testing.T) {
	const period = int64(60_000_000)
	r := rand.New(rand.NewPCG(1, 2))
	for _, iat := range []IAT{Exponential, Uniform, Equidistant} {
		for _, shift := range []bool{false, true} {
			for _, n := range []int{1, 2, 3, 7, 100, 5000} {
				offs := columnOffsets(r, iat, shift, n, period, nil)
				if len(offs) != n {
					t.Fatalf("%s shift=%v n=%d: %d offsets", iat, shift, n, len(offs))
				}
				if !slices.IsSorted(offs) || offs[0] < 0 || offs[n-1] >= period {
					t.Fatalf("%s shift=%v n=%d: offsets not sorted inside [0, period): first %d last %d", iat, shift, n, offs[0], offs[n-1])
				}
				// The n gaps, the last one wrapping to the next column's
				// first arrival position, sum to exactly the period.
				sum := int64(0)
				for i := 1; i < n; i++ {
					sum += offs[i] - offs[i-1]
				}
				sum += period - offs[n-1] + offs[0]
				if sum != period {
					t.Fatalf("%s shift=%v n=%d: gaps sum to %d µs, want %d", iat, shift, n, sum, period)
				}
				if !shift && offs[0] != 0 {
					t.Fatalf("%s n=%d: first arrival at %d µs, want the column start", iat, n, offs[0])
				}
				if iat == Equidistant && !shift {
					for i := 1; i < n; i++ {
						if d := offs[i] - offs[i-1]; math.Abs(float64(d)-float64(period)/float64(n)) > 1 {
							t.Fatalf("equidistant n=%d: gap %d µs, want %.1f", n, d, float64(period)/float64(n))
						}
					}
				}
			}
		}
	}
}

func TestExponentialGapsLookExponential(t *testing.T) {
	// With many arrivals in a column the rescaled Exp(1) gaps have a
	// coefficient of variation near 1, uniform ones near 1/√3, equidistant 0.
	r := rand.New(rand.NewPCG(7, 7))
	cv := func(iat IAT) float64 {
		offs := columnOffsets(r, iat, false, 20000, 60_000_000, nil)
		var gaps []float64
		for i := 1; i < len(offs); i++ {
			gaps = append(gaps, float64(offs[i]-offs[i-1]))
		}
		m := mean(gaps)
		v := 0.0
		for _, g := range gaps {
			v += (g - m) * (g - m)
		}
		return math.Sqrt(v/float64(len(gaps))) / m
	}
	if c := cv(Exponential); c < 0.9 || c > 1.1 {
		t.Errorf("exponential gaps: CV %.3f, want ≈ 1", c)
	}
	if c := cv(Uniform); c < 0.52 || c > 0.63 {
		t.Errorf("uniform gaps: CV %.3f, want ≈ 0.577", c)
	}
	if c := cv(Equidistant); c > 0.01 {
		t.Errorf("equidistant gaps: CV %.3f, want ≈ 0", c)
	}
}

func TestRuntimeAndMemoryWithinBrackets(t *testing.T) {
	d := DurationStats{P0: 10, P1: 20, P25: 30, P50: 40, P75: 50, P99: 60, P100: 70}
	m := MemoryStats{P1: 5.4, P5: 6, P25: 7, P50: 8, P75: 9, P95: 10, P99: 11, P100: 12.6}
	r := rand.New(rand.NewPCG(3, 4))
	const n = 200_000
	perBracket := map[int]int{}
	for range n {
		rt := DrawRuntime(r, &d, DefaultMinRuntime, DefaultMaxRuntime)
		if rt < 10 || rt > 70 {
			t.Fatalf("runtime %d outside [10, 70]", rt)
		}
		perBracket[min((rt-10)/10, 5)]++
		mb := DrawMemory(r, &m, DefaultMinMemory, DefaultMaxMemory)
		if mb < 5 || mb > 13 {
			t.Fatalf("memory %d outside [round(5.4), round(12.6)]", mb)
		}
	}
	// Bracket probabilities 1, 24, 25, 25, 24, 1 % (boundary values go to
	// either side, so allow a few points).
	want := []float64{0.01, 0.24, 0.25, 0.25, 0.24, 0.01}
	for b, p := range want {
		got := float64(perBracket[b]) / n
		if math.Abs(got-p) > 0.02 {
			t.Errorf("runtime bracket %d: %.3f of draws, want ≈ %.2f", b, got, p)
		}
	}
	// Clamps.
	big := DurationStats{P0: 70_000, P1: 80_000, P25: 90_000, P50: 100_000, P75: 110_000, P99: 120_000, P100: 600_000}
	zero := DurationStats{}
	for range 1000 {
		if v := DrawRuntime(r, &big, DefaultMinRuntime, DefaultMaxRuntime); v != 60_000 {
			t.Fatalf("runtime %d: want the 60 s clamp", v)
		}
		if v := DrawRuntime(r, &zero, DefaultMinRuntime, DefaultMaxRuntime); v != 1 {
			t.Fatalf("runtime %d: want the 1 ms clamp", v)
		}
		if v := DrawMemory(r, &MemoryStats{P1: 0.1, P5: 0.2, P25: 0.2, P50: 0.3, P75: 0.3, P95: 0.4, P99: 0.4, P100: 0.4}, DefaultMinMemory, DefaultMaxMemory); v != 1 {
			t.Fatalf("memory %d: want the 1 MiB clamp", v)
		}
		if v := DrawMemory(r, &MemoryStats{P1: 20000, P5: 20000, P25: 20000, P50: 20000, P75: 20000, P95: 20000, P99: 20000, P100: 30000}, DefaultMinMemory, DefaultMaxMemory); v != 10240 {
			t.Fatalf("memory %d: want the 10240 MiB clamp", v)
		}
	}
}

func TestRealTraceDrawsWithinBrackets(t *testing.T) {
	tr, err := LoadTrace(traceDir(t, "azure_500"), TraceOptions{Columns: 30})
	if err != nil {
		t.Fatal(err)
	}
	s, err := BuildSchedule(tr, ScheduleConfig{Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	clamp := func(v, lo, hi float64) float64 { return math.Min(math.Max(v, lo), hi) }
	for _, inv := range s.Invocations {
		f := &tr.Functions[inv.Func]
		d := f.Duration
		ds := []float64{d.P0, d.P1, d.P25, d.P50, d.P75, d.P99, d.P100}
		lo, hi := math.Round(slices.Min(ds)), math.Round(slices.Max(ds))
		if rt := float64(inv.RuntimeMs); rt < clamp(lo, 1, 60000) || rt > clamp(hi, 1, 60000) {
			t.Fatalf("%s: runtime %v ms outside its percentiles [%v, %v]", f.Name(), rt, lo, hi)
		}
		m := f.Memory
		ms := []float64{m.P1, m.P5, m.P25, m.P50, m.P75, m.P95, m.P99, m.P100}
		lo, hi = math.Round(slices.Min(ms)), math.Round(slices.Max(ms))
		if mb := float64(inv.MemoryMB); mb < clamp(lo, 1, 10240) || mb > clamp(hi, 1, 10240) {
			t.Fatalf("%s: memory %v MiB outside its percentiles [%v, %v]", f.Name(), mb, lo, hi)
		}
	}
}

const (
	invCSV = "HashOwner,HashApp,HashFunction,Trigger,480,481,482\n" +
		"o1,a1,f1,http,1,0,3\n" +
		"o2,a2,f2,timer,0,2.0,0\n" +
		"o3,a3,f3,queue,5,5,5\n"
	durCSV = "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum,percentile_Average_0,percentile_Average_1,percentile_Average_25,percentile_Average_50,percentile_Average_75,percentile_Average_99,percentile_Average_100\n" +
		"o1,a1,f1,0,10,0.0,1.0,0,0,0,0,1,1,1\n" +
		"o2,a2,f2,100,10,50.0,150.0,50,60,90,100,110,140,150\n" +
		"o3,a3,f3,10,10,5.0,15.0,5,6,9,10,11,14,15\n"
	// The full-day file's order: HashOwner,HashApp,HashFunction first.
	memCSVOwnerFirst = "HashOwner,HashApp,HashFunction,SampleCount,AverageAllocatedMb,AverageAllocatedMb_pct1,AverageAllocatedMb_pct5,AverageAllocatedMb_pct25,AverageAllocatedMb_pct50,AverageAllocatedMb_pct75,AverageAllocatedMb_pct95,AverageAllocatedMb_pct99,AverageAllocatedMb_pct100\n" +
		"o1,a1,f1,10,9.41,7.8,8.2,8.7,9.7,9.9,10.4,10.5,10.6\n" +
		"o2,a2,f2,10,100,90,91,92,93,94,95,96,97\n" +
		"o3,a3,f3,10,20,20,20,20,20,20,20,20,20\n"
	// The sampler's order: HashFunction first.
	memCSVFunctionFirst = "HashFunction,HashOwner,HashApp,SampleCount,AverageAllocatedMb,AverageAllocatedMb_pct1,AverageAllocatedMb_pct5,AverageAllocatedMb_pct25,AverageAllocatedMb_pct50,AverageAllocatedMb_pct75,AverageAllocatedMb_pct95,AverageAllocatedMb_pct99,AverageAllocatedMb_pct100\n" +
		"f3,o3,a3,10,20,20,20,20,20,20,20,20,20\n" +
		"f1,o1,a1,10,9.41,7.8,8.2,8.7,9.7,9.9,10.4,10.5,10.6\n" +
		"f2,o2,a2,10,100,90,91,92,93,94,95,96,97\n"
)

func TestParseTraceToleratesBothMemoryOrders(t *testing.T) {
	for _, mem := range []string{memCSVOwnerFirst, memCSVFunctionFirst} {
		tr, err := ParseTrace(strings.NewReader(invCSV), strings.NewReader(durCSV), strings.NewReader(mem), TraceOptions{Columns: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Functions) != 3 || tr.Invocations() != 1+3+2+15 {
			t.Fatalf("parsed %d functions, %d invocations", len(tr.Functions), tr.Invocations())
		}
		f := tr.Functions[0]
		if f.Name() != "trace-func-0" || f.Trigger != "http" || f.Memory.P100 != 10.6 || f.Duration.Average != 0 {
			t.Fatalf("row 0 parsed as %+v", f)
		}
		if got := tr.Functions[1].Invocations; !slices.Equal(got, []int{0, 2, 0}) {
			t.Fatalf("row 1 counts %v (the float 2.0 is a count)", got)
		}
		if cpu, mb := ResourceRequest(&tr.Functions[1]); cpu != 100 || mb != 10 {
			t.Fatalf("resource request %d milli-CPU, %d MiB; want 100 and ceil(97/10)=10", cpu, mb)
		}
	}
	// The window is read by position, from StartColumn.
	tr, err := ParseTrace(strings.NewReader(invCSV), strings.NewReader(durCSV), strings.NewReader(memCSVOwnerFirst), TraceOptions{StartColumn: 1, Columns: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.Functions[0].Invocations; !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("window [1,3) of row 0: %v", got)
	}
	if b := tr.Busiest(2); len(b.Functions) != 2 || b.Functions[0].Row != 0 || b.Functions[1].Row != 2 {
		t.Fatalf("busiest 2: rows %d, %d; want 0 and 2", b.Functions[0].Row, b.Functions[1].Row)
	}
}

func TestParseTraceErrorsNameTheProblem(t *testing.T) {
	tests := []struct {
		name, inv, dur, mem string
		cols                int
		want                string
	}{
		{"window", invCSV, durCSV, memCSVOwnerFirst, 4, "has 3 minute columns"},
		{"no trigger", strings.Replace(invCSV, "Trigger", "Kind", 1), durCSV, memCSVOwnerFirst, 1, "no Trigger column"},
		{"missing duration", invCSV, strings.Replace(durCSV, ",f2,", ",fx,", 1), memCSVOwnerFirst, 1, "f2 has no row in durations.csv"},
		{"bad count", strings.Replace(invCSV, "0,2.0,0", "0,2.5,0", 1), durCSV, memCSVOwnerFirst, 3, `"2.5" is not a non-negative integer count`},
		{"bad memory", invCSV, durCSV, strings.Replace(memCSVOwnerFirst, "9.41", "x", 1), 1, "AverageAllocatedMb: \"x\" is not a number"},
		{"missing column", invCSV, strings.Replace(durCSV, "percentile_Average_99,", "p99,", 1), memCSVOwnerFirst, 1, "no percentile_Average_99 column"},
	}
	for _, tc := range tests {
		_, err := ParseTrace(strings.NewReader(tc.inv), strings.NewReader(tc.dur), strings.NewReader(tc.mem), TraceOptions{Columns: tc.cols})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestScheduleWarmupSecondsAndDryRun(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader(invCSV), strings.NewReader(durCSV), strings.NewReader(memCSVOwnerFirst), TraceOptions{Columns: 3})
	if err != nil {
		t.Fatal(err)
	}
	s, err := BuildSchedule(tr, ScheduleConfig{Seed: 1, IAT: Equidistant, Granularity: Second, WarmupColumns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.ColumnCounts(); !slices.Equal(got, []int{6, 7, 8}) {
		t.Fatalf("column counts %v", got)
	}
	phase1 := 0
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		if inv.Offset >= time.Duration(inv.Column+1)*time.Second {
			t.Fatalf("second granularity: %s at %s", s.InvocationID(inv), inv.Offset)
		}
		if s.Phase(inv) == 1 {
			phase1++
			if !strings.HasPrefix(s.InvocationID(inv), "sec0.inv") {
				t.Fatalf("phase-1 invocation %s", s.InvocationID(inv))
			}
		}
	}
	if phase1 != 6 {
		t.Fatalf("%d warm-up invocations, want 6", phase1)
	}
	if _, err := BuildSchedule(tr, ScheduleConfig{WarmupColumns: 3}); err == nil {
		t.Fatal("a schedule that is all warm-up was accepted")
	}
	var buf bytes.Buffer
	if err := s.WriteCSV(&buf, 0.5); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if lines[0] != "function,offset_us,runtime_ms,memory_mb" || len(lines) != 22 {
		t.Fatalf("dry run: header %q, %d lines", lines[0], len(lines))
	}
	// Row 2 (f3) fires 5 times per second, equidistant, at half time scale:
	// its second invocation is at 0.2 s × 0.5.
	if !slices.Contains(lines, "trace-func-2,100000,14,20") && !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "trace-func-2,100000,") }) {
		t.Fatalf("dry run has no trace-func-2 row at 100000 µs:\n%s", buf.String())
	}
}

func TestParseIAT(t *testing.T) {
	for _, tc := range []struct {
		in    string
		d     IAT
		shift bool
	}{{"exponential", Exponential, false}, {"uniform_shift", Uniform, true}, {"equidistant", Equidistant, false}, {"equidistant_shift", Equidistant, true}} {
		d, shift, err := ParseIAT(tc.in)
		if err != nil || d != tc.d || shift != tc.shift {
			t.Errorf("ParseIAT(%q) = %v, %v, %v", tc.in, d, shift, err)
		}
	}
	if _, _, err := ParseIAT("poisson"); err == nil {
		t.Error("ParseIAT(poisson) succeeded")
	}
}

// Replicate makes k times the calls under k times the names, each copy with
// its own arrival draws.
func TestReplicate(t *testing.T) {
	tr, err := LoadTrace(traceDir(t, "azure_100"), TraceOptions{Columns: 3})
	if err != nil {
		t.Fatal(err)
	}
	tr = tr.Busiest(20)
	big := tr.Replicate(3)
	if len(big.Functions) != 60 || big.Invocations() != 3*tr.Invocations() {
		t.Fatalf("%d functions, %d calls; want 60 and %d", len(big.Functions), big.Invocations(), 3*tr.Invocations())
	}
	names := map[string]bool{}
	for i := range big.Functions {
		names[big.Functions[i].Name()] = true
	}
	if len(names) != 60 {
		t.Fatalf("%d distinct names of 60", len(names))
	}
	s, err := BuildSchedule(big, ScheduleConfig{Seed: 1, IAT: Exponential})
	if err != nil {
		t.Fatal(err)
	}
	sum := map[int32]time.Duration{} // each function's arrival offsets, summed
	for _, inv := range s.Invocations {
		sum[inv.Func] += inv.Offset
	}
	same := 0
	for i := range 20 {
		if sum[int32(i)] == sum[int32(i+20)] {
			same++
		}
	}
	// A function called once a minute arrives at each minute's start in
	// every copy; the others draw their own times.
	if same > 10 {
		t.Fatalf("%d of 20 copies drew the same arrival times as the original", same)
	}
}

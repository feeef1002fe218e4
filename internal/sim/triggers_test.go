package sim

import (
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// timerTrace is a timer function firing once every 20 minutes for three
// hours, measured after the first hour: a tick farther apart than any
// keep-alive but gd's.
func timerTrace() *workload.Schedule {
	const cols = 180
	f := workload.Function{Row: 0, Trigger: "timer", Invocations: make([]int, cols)}
	s := &workload.Schedule{Columns: cols, WarmupColumns: 60, Granularity: workload.Minute}
	for c := 5; c < cols; c += 20 {
		f.Invocations[c] = 2
		for k := range 2 {
			// Somewhere in the column, as the loader spreads them.
			s.Invocations = append(s.Invocations, workload.Invocation{Offset: time.Duration(c)*time.Minute + time.Duration(17+k*13)*time.Second,
				Column: int32(c), Index: int32(k), RuntimeMs: 200, MemoryMB: 128})
		}
	}
	s.Functions = []workload.Function{f}
	return s
}

// The column's calls become firings spread over it, and its ticks are
// exactly those firings.
func TestTimerSchedules(t *testing.T) {
	s := timerTrace()
	out, ticks := timerSchedules(s)
	if s.Invocations[0].Offset != 5*time.Minute+17*time.Second {
		t.Fatal("the input schedule was changed")
	}
	if a, b := out.Invocations[0].Offset, out.Invocations[1].Offset; a != 5*time.Minute || b != 5*time.Minute+30*time.Second {
		t.Fatalf("firings at %s and %s, want the column's start and its middle", a, b)
	}
	tk := ticks[s.Functions[0].Name()]
	if next := tk.Schedule.Next(tk.From); !next.Equal(simEpoch.Add(5 * time.Minute)) {
		t.Fatalf("first tick %s", next.Sub(simEpoch))
	}
	if next := tk.Schedule.Next(simEpoch.Add(5 * time.Minute)); !next.Equal(simEpoch.Add(5*time.Minute + 30*time.Second)) {
		t.Fatalf("second tick %s", next.Sub(simEpoch))
	}
	if next := tk.Schedule.Next(simEpoch.Add(3 * time.Hour)); !next.IsZero() {
		t.Fatalf("a tick after the last: %s", next.Sub(simEpoch))
	}
}

// Under ttl every tick 20 minutes apart is a cold start; pre-warmed from
// the ticks none is, and the sandboxes do not stay between ticks.
func TestTimerPrewarm(t *testing.T) {
	run := func(prewarm bool) *Result {
		res, err := Run(timerTrace(), Config{Nodes: 2, Seed: 1, KeepAlivePolicy: spec.KeepAliveTTL, Triggers: true, NoPrewarm: !prewarm})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	cold, warm := run(false), run(true)
	if cold.TimerCalls != 12 || cold.TimerColdStarts < 6 {
		t.Fatalf("not pre-warmed: %d measured calls, %d cold; want 12, every tick cold", cold.TimerCalls, cold.TimerColdStarts)
	}
	if warm.TimerColdStarts != 0 {
		t.Fatalf("pre-warmed: %d cold starts of %d calls, want none", warm.TimerColdStarts, warm.TimerCalls)
	}
	if cold.PeakSandboxes != 1 || warm.PeakSandboxes != 1 {
		t.Fatalf("peak sandboxes %d / %d, want 1", cold.PeakSandboxes, warm.PeakSandboxes)
	}
	mem := func(r *Result) float64 {
		var s float64
		for _, m := range r.Memory {
			s += m.ReservedMB
		}
		return s
	}
	// Sandboxes live about a tick's worth more than without pre-warming,
	// not from one tick to the next.
	if mem(warm) > 2*mem(cold) {
		t.Fatalf("pre-warmed memory %.0f MiB·samples against %.0f: kept between ticks", mem(warm), mem(cold))
	}
}

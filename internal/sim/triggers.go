package sim

import (
	"slices"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/policy/prewarm"
)

// Triggers (Config.Triggers): the trace's timer-triggered functions are
// cron triggers. A column's count of such a function is that many firings
// spread evenly over the column (6 in a minute: every 10 s), as a timer
// that fires N times a minute would make them; its ticks are those
// firings. With Prewarm, the reconciler gets the control plane's
// forecaster (internal/policy/prewarm) with those ticks, as the control
// plane gives it its cron triggers' schedules.

// timerKind is the Trigger column's value of timer-triggered functions.
const timerKind = "timer"

// timerSchedules spreads the timer functions' calls of s over their
// columns (in a copy) and returns it with each timer function's ticks.
func timerSchedules(s *loadgen.Schedule) (*loadgen.Schedule, map[string]prewarm.Ticks) {
	period := s.Granularity.Period()
	count := map[[2]int32]int32{} // (function, column) -> calls
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		if s.Functions[inv.Func].Trigger == timerKind {
			count[[2]int32{inv.Func, inv.Column}]++
		}
	}
	out := *s
	out.Invocations = make([]loadgen.Invocation, len(s.Invocations))
	copy(out.Invocations, s.Invocations)
	fires := map[int32][]time.Duration{}
	for i := range out.Invocations {
		inv := &out.Invocations[i]
		if s.Functions[inv.Func].Trigger != timerKind {
			continue
		}
		n := count[[2]int32{inv.Func, inv.Column}]
		inv.Offset = time.Duration(inv.Column)*period + time.Duration(inv.Index)*period/time.Duration(n)
		fires[inv.Func] = append(fires[inv.Func], inv.Offset)
	}
	ticks := make(map[string]prewarm.Ticks, len(fires))
	for fi, offs := range fires {
		slices.Sort(offs)
		ticks[s.Functions[fi].Name()] = prewarm.Ticks{Schedule: listSchedule(offs), From: simEpoch.Add(-time.Nanosecond)}
	}
	return &out, ticks
}

// listSchedule ticks at its offsets from simEpoch (sorted).
type listSchedule []time.Duration

func (l listSchedule) Next(t time.Time) time.Time {
	d := t.Sub(simEpoch)
	i, _ := slices.BinarySearch(l, d+1)
	if i == len(l) {
		return time.Time{}
	}
	return simEpoch.Add(l[i])
}

// simEpoch is the virtual time of a schedule's offset 0.
var simEpoch = time.Unix(1_700_000_000, 0).UTC()

// timerStats counts the measured calls of timer functions and their cold
// starts.
func timerStats(s *loadgen.Schedule, recs []loadgen.Record) (fns int, calls, cold int64) {
	timer := map[string]bool{}
	for i := range s.Functions {
		if s.Functions[i].Trigger == timerKind {
			timer[s.Functions[i].Name()] = true
		}
	}
	for i := range recs {
		r := &recs[i]
		if r.Phase == 2 && timer[r.Function] {
			calls++
			if r.Cold {
				cold++
			}
		}
	}
	return len(timer), calls, cold
}

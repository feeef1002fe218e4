package sim

import (
	"slices"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/prewarm"
	"github.com/brisk-faas/brisk/internal/workload"
)

// Triggers (Config.Triggers): the trace's timer-triggered functions are
// cron triggers. A column's count of such a function is that many firings
// spread evenly over the column (6 in a minute: every 10 s), as a timer
// that fires N times a minute would make them; its ticks are those
// firings. With Prewarm, the reconciler gets the control plane's
// forecaster (internal/policy/prewarm) with those ticks, as the control
// plane gives it its cron triggers' schedules.

// timerSchedules spreads the timer functions' calls of s over their
// columns (workload.Schedule.SpreadTimers) and returns it with each timer
// function's ticks.
func timerSchedules(s *workload.Schedule) (*workload.Schedule, map[string]prewarm.Ticks) {
	out, fires := s.SpreadTimers()
	ticks := make(map[string]prewarm.Ticks, len(fires))
	for fi, offs := range fires {
		ticks[s.Functions[fi].Name()] = prewarm.Ticks{Schedule: listSchedule(offs), From: simEpoch.Add(-time.Nanosecond)}
	}
	return out, ticks
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

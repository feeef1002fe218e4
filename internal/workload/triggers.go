package workload

import (
	"slices"
	"time"
)

// Values of the trace's Trigger column that `brisk replay --triggers` and
// `brisk sim --triggers` make brisk triggers of: timer functions become
// cron triggers, queue functions NATS triggers.
const (
	TriggerTimer = "timer"
	TriggerQueue = "queue"
)

// SpreadTimers returns a copy of s in which the calls of each
// timer-triggered function in a column are spread evenly over it (6 in a
// minute: every 10 s, from the column's start), as a timer firing that
// often makes them, and each such function's firing offsets, sorted.
func (s *Schedule) SpreadTimers() (*Schedule, map[int32][]time.Duration) {
	period := s.Granularity.Period()
	count := map[[2]int32]int32{} // (function, column) -> calls
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		if s.Functions[inv.Func].Trigger == TriggerTimer {
			count[[2]int32{inv.Func, inv.Column}]++
		}
	}
	out := *s
	out.Invocations = slices.Clone(s.Invocations)
	fires := map[int32][]time.Duration{}
	for i := range out.Invocations {
		inv := &out.Invocations[i]
		if s.Functions[inv.Func].Trigger != TriggerTimer {
			continue
		}
		n := count[[2]int32{inv.Func, inv.Column}]
		inv.Offset = time.Duration(inv.Column)*period + time.Duration(inv.Index)*period/time.Duration(n)
		fires[inv.Func] = append(fires[inv.Func], inv.Offset)
	}
	for _, offs := range fires {
		slices.Sort(offs)
	}
	return &out, fires
}

// TimerStats counts the timer-triggered functions of s, and in recs their
// measured calls and those that were cold starts.
func (s *Schedule) TimerStats(recs []Record) (fns int, calls, cold int64) {
	timer := map[string]bool{}
	for i := range s.Functions {
		if s.Functions[i].Trigger == TriggerTimer {
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

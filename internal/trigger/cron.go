// Package trigger runs brisk's triggers (spec.Trigger) on the control-plane
// leader: cron schedules and NATS subscriptions, each firing queued as an
// asynchronous call (internal/async) under an id derived from the trigger
// and the tick or message, so that a firing repeated by a restart or a
// leader change is stored once. docs/triggers.md has the design.
package trigger

import (
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Schedule is a parsed cron schedule (spec.ParseSchedule): the first tick
// after t, zero when none.
type Schedule interface {
	Next(t time.Time) time.Time
}

// Plan is what a cron trigger does at a moment, given the last tick it
// fired.
type Plan struct {
	// Fire is the tick to fire now; zero: none.
	Fire time.Time
	// Missed counts ticks due that will not be fired: superseded by Fire
	// (several were missed: only the latest fires), or skipped.
	Missed int
	// Cursor is the last tick accounted for (fired or skipped): the next
	// plan starts after it.
	Cursor time.Time
	// Next is the first tick after Cursor (zero: none ever).
	Next time.Time
}

// lookBack bounds how far back a plan looks for missed ticks (a control
// plane down for a week catches up once either way), and maxSteps the
// ticks it walks (@every 1s over lookBack is 86,400).
const (
	lookBack = 24 * time.Hour
	maxSteps = 200_000
)

// PlanCron decides a cron trigger's firing at now, given the last tick it
// fired (or the time its ticks count from). It is pure: the runner and the
// tests step it with their clocks. Several ticks due at once (an outage)
// fire as one, the latest, unless catchUp is spec.CatchUpSkip and that
// tick is more than spec.CronGrace late.
func PlanCron(s Schedule, last, now time.Time, catchUp string) Plan {
	from := last
	if now.Sub(from) > lookBack {
		from = now.Add(-lookBack)
	}
	t := s.Next(from)
	if t.IsZero() || t.After(now) {
		return Plan{Cursor: last, Next: t}
	}
	latest, n := t, 1
	for range maxSteps {
		nx := s.Next(latest)
		if nx.IsZero() || nx.After(now) {
			break
		}
		latest, n = nx, n+1
	}
	p := Plan{Cursor: latest, Next: s.Next(latest), Missed: n - 1}
	if catchUp == spec.CatchUpSkip && now.Sub(latest) > spec.CronGrace {
		p.Missed = n
		return p
	}
	p.Fire = latest
	return p
}

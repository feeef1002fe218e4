// Package prewarm forecasts load the platform knows before it comes, for
// the autoscaler's Predictor hook (autoscale.Predictor): a cron trigger's
// next tick is known, so its function can have a sandbox ready one cold
// start before the tick and none between ticks, instead of paying a cold
// start at each tick or keeping an idle sandbox all along.
//
// Like every policy it is a pure value: time comes in as now, and it is
// not safe for concurrent use (the control plane updates and queries it
// under the lock it steps the reconciler with).
package prewarm

import "time"

// Schedule is a cron schedule: the first tick after t (zero: none).
type Schedule interface {
	Next(t time.Time) time.Time
}

// Ticks are a trigger's ticks: Schedule's, after From (its last tick, or
// when it was made or resumed). "@every" schedules count from a time,
// not from the clock's whole minutes, so the anchor matters.
type Ticks struct {
	Schedule Schedule
	From     time.Time
}

// Cron forecasts one busy sandbox for a function from Lead + Margin before
// each tick of its cron triggers until Hold after it. Lead is the
// function's cold start, measured (ObserveColdStart, a moving average) or
// DefaultLead before any is.
type Cron struct {
	// Margin covers what comes before a sandbox starts: the autoscaler's
	// period (it decides at its ticks, not at the cron's) and placement.
	Margin time.Duration
	// Hold keeps the forecast after a tick, until the call has reached
	// the sandbox (the queue's dispatch, retries of a failed start).
	Hold time.Duration
	// DefaultLead is the cold start assumed before one is measured.
	DefaultLead time.Duration
	fns         map[string]*cronFn
}

type cronFn struct {
	ticks []Ticks       // From moves forward as ticks pass
	lead  time.Duration // moving average of measured cold starts; 0: none yet
}

// NewCron returns a forecaster with the given margin and hold, assuming a
// 1 s cold start until one is measured.
func NewCron(margin, hold time.Duration) *Cron {
	return &Cron{Margin: margin, Hold: hold, DefaultLead: time.Second, fns: map[string]*cronFn{}}
}

// SetSchedules replaces fn's cron ticks (its active cron triggers');
// none forgets fn but its measured cold start.
func (c *Cron) SetSchedules(fn string, ticks []Ticks) {
	f := c.fns[fn]
	if f == nil {
		if len(ticks) == 0 {
			return
		}
		f = &cronFn{}
		c.fns[fn] = f
	}
	f.ticks = ticks
	if len(ticks) == 0 && f.lead == 0 {
		delete(c.fns, fn)
	}
}

// maxSteps bounds the ticks one Predict walks past (an @every 1s trigger
// after a long pause of the forecaster); the walk goes on at the next.
const maxSteps = 10_000

// ObserveColdStart records a cold start of fn (placement to ready); only
// functions with schedules keep it.
func (c *Cron) ObserveColdStart(fn string, d time.Duration) {
	f := c.fns[fn]
	if f == nil || d <= 0 {
		return
	}
	if f.lead == 0 {
		f.lead = d
		return
	}
	f.lead = (3*f.lead + d) / 4
}

// Lead is how long before a tick fn's forecast starts.
func (c *Cron) Lead(fn string) time.Duration {
	lead := c.DefaultLead
	if f := c.fns[fn]; f != nil && f.lead > 0 {
		lead = f.lead
	}
	return lead + c.Margin
}

// Predict forecasts one in-flight call for fn while a tick of its cron
// triggers is near: from Lead before it to Hold after it.
func (c *Cron) Predict(now time.Time, fn string) (float64, bool) {
	f := c.fns[fn]
	if f == nil || len(f.ticks) == 0 {
		return 0, false
	}
	lead := c.Lead(fn)
	for i := range f.ticks {
		tk := &f.ticks[i]
		// The first tick whose hold has not passed.
		t := tk.Schedule.Next(tk.From)
		for n := 0; !t.IsZero() && !now.Before(t.Add(c.Hold)) && n < maxSteps; n++ {
			tk.From, t = t, tk.Schedule.Next(t)
		}
		if !t.IsZero() && !now.Before(t.Add(-lead)) && now.Before(t.Add(c.Hold)) {
			return 1, true
		}
	}
	return 0, false
}

package autoscale

import "time"

// DefaultKeepAlive is the idle time after which a Lambda-like instance is destroyed,
// the commonly quoted 10 minutes.
const DefaultKeepAlive = 10 * time.Minute

// Sync is the AWS-Lambda-like synchronous policy ("Kn-Sync"; docs/policies.md,
// Autoscaling: Sync) for instance concurrency 1: a request takes an idle warm instance
// or creates one and waits for it (a cold start); an instance idle for KeepAlive is
// destroyed. There is no autoscaler loop, panic mode or grace period, so
// scale == busy + idle.
type Sync struct {
	KeepAlive time.Duration // >= 0; 0 destroys an instance as soon as it is idle
}

// DefaultSync returns a Sync with DefaultKeepAlive.
func DefaultSync() Sync { return Sync{KeepAlive: DefaultKeepAlive} }

// Validate reports a negative KeepAlive.
func (s Sync) Validate() error {
	if s.KeepAlive < 0 {
		return &fieldError{"keep alive", s.KeepAlive, "out of range [0, +Inf)"}
	}
	return nil
}

// OnRequest reports whether a request arriving at now, with idle warm instances
// available, must create a new instance synchronously.
func (s Sync) OnRequest(now time.Time, idle int) (createNew bool) {
	_ = now // the decision depends only on idle capacity; now keeps the step signature uniform
	return idle <= 0
}

// PickIdle chooses which idle instance serves a request: the most recently used one
// (LIFO), so the least recently used instances age out. Ties go to the lowest index.
// It returns -1 when lastUsed is empty.
func (s Sync) PickIdle(lastUsed []time.Time) int {
	best := -1
	for i, t := range lastUsed {
		if best < 0 || t.After(lastUsed[best]) {
			best = i
		}
	}
	return best
}

// Expired reports whether an instance idle since lastUsed should be destroyed at now.
func (s Sync) Expired(now, lastUsed time.Time) bool {
	return now.Sub(lastUsed) >= s.KeepAlive
}

// ExpiresAt is when an instance idle since lastUsed expires, for arming a timer.
func (s Sync) ExpiresAt(lastUsed time.Time) time.Time {
	return lastUsed.Add(s.KeepAlive)
}

// SyncConfig turns a function's KPA config into brisk's Lambda-like
// synchronous mode (spec scaling.mode "sync"): the function keeps, for
// keepAlive, the most sandboxes its demand needed in any one second (one
// per in-flight request at concurrency 1), and goes to zero keepAlive after
// its last call. There is no averaging window (1 s), no panic mode, no
// scale-down rate limit and no extra grace; keepAlive is rounded to whole
// seconds within [1s, 1h]. Requests waiting with no sandbox get theirs at
// once, as in every mode (the control plane's urgent path).
func SyncConfig(c Config, keepAlive time.Duration) Config {
	c.StableWindow = time.Second
	c.PanicDisabled = true
	c.ScaleToZeroGrace = 0
	c.MaxScaleDownRate = 1e6
	c.ScaleDownDelay = min(max(keepAlive.Round(time.Second), time.Second), maxDelay)
	c.HoldPeaks = true
	return c
}

// Package clock injects time so that policies and controllers can be driven by
// a fake clock in tests and by virtual time in the simulator.
package clock

import (
	"sync"
	"time"
)

// Clock is the time source every component takes instead of calling time.Now.
type Clock interface {
	Now() time.Time
	// NewTicker returns a ticker whose channel fires every d.
	NewTicker(d time.Duration) Ticker
	// After returns a channel that receives once after d.
	After(d time.Duration) <-chan time.Time
}

// Ticker is the part of time.Ticker a Clock hands out.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the wall clock.
type Real struct{}

func (Real) Now() time.Time                         { return time.Now() }
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (Real) NewTicker(d time.Duration) Ticker       { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Or returns c, or the real clock when c is nil, so a zero-valued config works.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Fake is a manually advanced clock for tests. Timers and tickers fire
// synchronously inside Advance.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeWaiter
}

type fakeWaiter struct {
	at     time.Time
	period time.Duration // 0 for one-shot
	ch     chan time.Time
	done   bool
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{at: f.now.Add(d), ch: make(chan time.Time, 1)}
	f.waiters = append(f.waiters, w)
	return w.ch
}

func (f *Fake) NewTicker(d time.Duration) Ticker {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{at: f.now.Add(d), period: d, ch: make(chan time.Time, 1)}
	f.waiters = append(f.waiters, w)
	return &fakeTicker{f: f, w: w}
}

// Advance moves time forward by d and fires every timer that became due.
// A ticker whose receiver is slow drops ticks, as time.Ticker does.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if w.done {
			continue
		}
		for !w.done && !w.at.After(f.now) {
			select {
			case w.ch <- w.at:
			default:
			}
			if w.period == 0 {
				w.done = true
			} else {
				w.at = w.at.Add(w.period)
			}
		}
		if !w.done {
			kept = append(kept, w)
		}
	}
	f.waiters = kept
}

type fakeTicker struct {
	f *Fake
	w *fakeWaiter
}

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }
func (t *fakeTicker) Stop() {
	t.f.mu.Lock()
	t.w.done = true
	t.f.mu.Unlock()
}

package async

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Accepting a call is the interactive part of the queue: a client waits
// for its 202. Running one is background work. When a data plane is busy
// accepting, its consumer yields: it keeps running at least yieldFloor
// attempts, so that the backlog keeps draining, but starts no more until
// the submits calm down. On a machine with few cores the two otherwise
// share the CPU evenly, and a burst of submits waits behind the attempts
// its own earlier calls started (the accept rate halves under a backlog).
// Calls waiting here hold their consumer slot and keep their message in
// progress, so JetStream does not deliver them again. Yielding is for
// bursts: after yieldBurst of submits without a quiet moment the load is
// sustained, and the consumer runs at full speed again, so that the
// backlog cannot grow to the queue's limit behind the floor.

// yieldQuiet is how long after its last submit a data plane stops being
// busy. Under load submits arrive every few hundred microseconds but are
// in flight only part of that time; a gate that opened whenever none was
// in flight would let every waiting attempt through between two of them.
const yieldQuiet = 2 * time.Millisecond

// yieldBurst is how long a burst of submits may hold the consumer back.
const yieldBurst = 10 * time.Second

// yielder counts the submits and the attempts of one Queue and gates the
// attempts' start.
type yielder struct {
	floor   int32        // attempts that run whatever the submits
	submits atomic.Int32 // in flight
	lastEnd atomic.Int64 // when the last submit ended, Unix ns
	since   atomic.Int64 // when the data plane became busy, Unix ns
	burst   time.Duration
	running atomic.Int32 // attempts past the gate, not yet ended
	waiters atomic.Int32
	mu      sync.Mutex
	wakeup  chan struct{} // closed and replaced to wake every waiter
	yielded atomic.Int64  // attempts that waited
}

func newYielder(floor int) *yielder {
	if floor <= 0 {
		floor = max(runtime.GOMAXPROCS(0)/2, 1)
	}
	return &yielder{floor: int32(floor), wakeup: make(chan struct{}), burst: yieldBurst}
}

// accepting marks a submit in flight until the returned func is called.
func (y *yielder) accepting() (done func()) {
	if y.submits.Add(1) == 1 {
		if now := time.Now().UnixNano(); now-y.lastEnd.Load() >= int64(yieldQuiet) {
			y.since.Store(now) // a burst begins
		}
	}
	return y.submitEnd
}

func (y *yielder) submitEnd() {
	y.lastEnd.Store(time.Now().UnixNano())
	y.submits.Add(-1)
}

// busy says whether the data plane is accepting a burst: a submit is in
// flight or ended less than yieldQuiet ago, and the burst is younger than
// the burst limit. recheck is when to look again.
func (y *yielder) busy() (busy bool, recheck time.Duration) {
	now := time.Now().UnixNano()
	if time.Duration(now-y.since.Load()) >= y.burst {
		return false, 0
	}
	if y.submits.Load() > 0 {
		return true, yieldQuiet
	}
	quiet := time.Duration(now - y.lastEnd.Load())
	return quiet < yieldQuiet, yieldQuiet - quiet
}

// enter waits until an attempt may start: the data plane is not busy
// accepting, or fewer than floor attempts run. It returns false if ctx
// ended first. Every true is matched by a leave.
func (y *yielder) enter(ctx context.Context) bool {
	waited := false
	for {
		// Counted as a waiter before the check, so that a wake between
		// the check and the wait is not skipped.
		y.waiters.Add(1)
		ch := y.current()
		n := y.running.Load()
		busy, recheck := y.busy()
		if n < y.floor || !busy {
			y.waiters.Add(-1)
			if !y.running.CompareAndSwap(n, n+1) {
				continue
			}
			if waited {
				y.yielded.Add(1)
			}
			return true
		}
		waited = true
		// An attempt's end wakes the waiters; the submits' calm is
		// waited for by the clock.
		t := time.NewTimer(recheck)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		y.waiters.Add(-1)
		if ctx.Err() != nil {
			return false
		}
	}
}

// leave ends an attempt that entered.
func (y *yielder) leave() {
	y.running.Add(-1)
	y.wake()
}

func (y *yielder) current() chan struct{} {
	y.mu.Lock()
	defer y.mu.Unlock()
	return y.wakeup
}

// wake wakes every waiter, if there is one.
func (y *yielder) wake() {
	if y.waiters.Load() == 0 {
		return
	}
	y.mu.Lock()
	close(y.wakeup)
	y.wakeup = make(chan struct{})
	y.mu.Unlock()
}

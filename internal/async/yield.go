package async

import (
	"context"
	"runtime"
	"slices"
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
// attempts' start. Attempts past the gate's limit wait in a FIFO and are
// let in one per free slot: a wake-up per start, not one per waiter, so
// that a thousand waiting attempts cost nothing while the submits run
// (waking them all at every change took the CPU the submits needed).
type yielder struct {
	floor   int32        // attempts that run whatever the submits
	submits atomic.Int32 // in flight
	lastEnd atomic.Int64 // when the last submit ended, Unix ns
	since   atomic.Int64 // when the data plane became busy, Unix ns
	burst   time.Duration
	running atomic.Int32 // attempts past the gate, not yet ended
	waiting atomic.Int32 // attempts in (or about to join) queue
	yielded atomic.Int64 // attempts that waited

	mu    sync.Mutex
	queue []chan struct{} // waiting attempts, oldest first
	timer *time.Timer     // looks at the queue again when the submits may have calmed
	armed bool            // timer is set
}

func newYielder(floor int) *yielder {
	if floor <= 0 {
		floor = max(runtime.GOMAXPROCS(0)/2, 1)
	}
	return &yielder{floor: int32(floor), burst: yieldBurst}
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

// tryStart counts an attempt in if one may start now: fewer than floor
// run, or the data plane is not busy accepting.
func (y *yielder) tryStart() bool {
	for {
		n := y.running.Load()
		if n >= y.floor {
			if busy, _ := y.busy(); busy {
				return false
			}
		}
		if y.running.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// enter waits until an attempt may start: the data plane is not busy
// accepting, or fewer than floor attempts run. It returns false if ctx
// ended first. Every true is matched by a leave.
func (y *yielder) enter(ctx context.Context) bool {
	if y.waiting.Load() == 0 && y.tryStart() {
		return true // nobody waits ahead: no lock
	}
	y.mu.Lock()
	// Counted as waiting before the check: a leave that the check missed
	// sees the count and releases the queue after this joins it.
	y.waiting.Add(1)
	if len(y.queue) == 0 && y.tryStart() {
		y.waiting.Add(-1)
		y.mu.Unlock()
		return true
	}
	ch := make(chan struct{}, 1)
	y.queue = append(y.queue, ch)
	y.armLocked()
	y.mu.Unlock()
	select {
	case <-ch:
		y.yielded.Add(1)
		return true
	case <-ctx.Done():
	}
	y.mu.Lock()
	i := slices.Index(y.queue, ch)
	if i >= 0 {
		y.queue = slices.Delete(y.queue, i, i+1)
		y.waiting.Add(-1)
	}
	y.mu.Unlock()
	if i < 0 { // let in as ctx ended: pass the slot on
		y.leave()
	}
	return false
}

// leave ends an attempt that entered.
func (y *yielder) leave() {
	y.running.Add(-1)
	if y.waiting.Load() > 0 {
		y.release()
	}
}

// release lets waiting attempts in, oldest first, while they may start.
func (y *yielder) release() {
	y.mu.Lock()
	defer y.mu.Unlock()
	for len(y.queue) > 0 && y.tryStart() {
		ch := y.queue[0]
		y.queue[0] = nil
		y.queue = y.queue[1:]
		y.waiting.Add(-1)
		ch <- struct{}{}
	}
	y.armLocked()
}

// armLocked sets the timer that looks at a non-empty queue again when the
// submits may have calmed: their end wakes nobody.
func (y *yielder) armLocked() {
	if len(y.queue) == 0 || y.armed {
		return
	}
	_, recheck := y.busy()
	recheck = max(recheck, 50*time.Microsecond)
	y.armed = true
	if y.timer == nil {
		y.timer = time.AfterFunc(recheck, y.recheck)
	} else {
		y.timer.Reset(recheck)
	}
}

func (y *yielder) recheck() {
	y.mu.Lock()
	y.armed = false
	y.mu.Unlock()
	y.release()
}

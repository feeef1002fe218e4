// Package queue is a function's wait line at a data plane: the calls that
// found no free sandbox slot wait here, first come first served, up to a
// depth and for at most a timeout. A freed slot passes straight from the
// releaser to the oldest waiter, so no arriving call can take it in
// between (the caller's fast path tries a slot only while Len is 0).
//
// Asynchronous calls wait too, behind every synchronous one, and do not
// count against the depth synchronous calls see: a burst of queued async
// work never makes an interactive call fail with "queue full".
//
// The queue knows nothing of endpoints or policies: the function supplies
// its slots through Slots.
package queue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Why a call got no slot from the queue itself.
var (
	ErrFull    = errors.New("queue full")
	ErrTimeout = errors.New("timed out waiting for a sandbox")
)

// Slots is the function's side of its queue.
type Slots[E any] interface {
	// Pick reserves a free slot on the function's current sandboxes;
	// false when none is free.
	Pick() (E, bool)
	// Release frees a slot Pick reserved. The queue calls it for a slot
	// handed to a waiter whose caller had gone meanwhile.
	Release(E)
	// Refuse is the error a call that finds no free slot gets at once
	// instead of waiting (nil: it waits). Called with the queue's lock
	// held, so that FailIfRefused cannot miss a call queueing meanwhile.
	Refuse() error
}

// Queue is one function's wait line. Its zero value is not usable: call
// Init before the first use.
type Queue[E any] struct {
	slots Slots[E]
	// n mirrors the number of waiters so that the fast path and releasers
	// skip the mutex while nobody waits.
	n  atomic.Int32
	mu sync.Mutex
	// The line: synchronous waiters, then (from firstLow on) asynchronous
	// ones. Guarded by mu, as the rest.
	head, tail, firstLow *waiter
	nlow                 int32
	closed               error
}

// waiter is one queued call. Whoever dequeues it (a releaser, a dispatch
// after new sandboxes arrived, a close) fills slot or err and signals ready
// exactly once; the owner then reads them. A reserved slot therefore
// passes hand to hand.
type waiter struct {
	prev, next *waiter
	queued     bool // guarded by the queue's mu
	low        bool
	ready      chan struct{}
	slot       any // an E
	err        error
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ready: make(chan struct{}, 1)} }}

func putWaiter(w *waiter) {
	w.slot, w.err, w.prev, w.next, w.low = nil, nil, nil, nil, false
	waiterPool.Put(w)
}

// Init makes q the queue of the function whose slots s are.
func (q *Queue[E]) Init(s Slots[E]) { q.slots = s }

// Len is the number of waiting calls, synchronous and asynchronous.
func (q *Queue[E]) Len() int32 { return q.n.Load() }

// Wait queues a call until a slot is free, and returns it. depth bounds
// the synchronous calls waiting (ErrFull beyond it), timeout the wait
// (ErrTimeout); a low call is asynchronous. onQueued runs once if the call
// had to wait with no slot free, or was refused (Slots.Refuse): the demand
// reaches whoever makes sandboxes either way. A call whose ctx ends first
// gets the context's cause.
func (q *Queue[E]) Wait(ctx context.Context, depth int, timeout time.Duration, low bool, onQueued func()) (E, error) {
	var none E
	q.mu.Lock()
	if q.closed != nil {
		err := q.closed
		q.mu.Unlock()
		return none, err
	}
	if err := q.slots.Refuse(); err != nil {
		q.mu.Unlock()
		onQueued()
		return none, err
	}
	if !low && int(q.n.Load()-q.nlow) >= depth {
		q.mu.Unlock()
		return none, ErrFull
	}
	w := waiterPool.Get().(*waiter)
	w.low = low
	q.pushLocked(w)
	// n was raised before this dispatch's Pick, so a concurrent release
	// either shows up here or sees n > 0 and dispatches: no lost wake-up.
	q.dispatchLocked()
	stillQueued := w.queued
	q.mu.Unlock()

	if stillQueued {
		onQueued()
		timer := time.NewTimer(timeout)
		var err error
		select {
		case <-w.ready:
			timer.Stop()
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-timer.C:
			err = ErrTimeout
		}
		if err != nil {
			q.mu.Lock()
			if w.queued {
				q.removeLocked(w)
				q.mu.Unlock()
				putWaiter(w)
				return none, err
			}
			q.mu.Unlock()
			<-w.ready // dequeued concurrently: the handoff is on its way
			if w.err == nil && !errors.Is(err, ErrTimeout) {
				// The caller is gone: pass the slot on.
				q.slots.Release(w.slot.(E))
				q.Dispatch()
				putWaiter(w)
				return none, err
			}
			// A slot that arrived together with the timeout is used.
		}
	} else {
		<-w.ready
	}
	err := w.err
	var slot E
	if err == nil {
		slot = w.slot.(E)
	}
	putWaiter(w)
	return slot, err
}

// Dispatch hands free slots to waiters, oldest first. Call it when slots
// may have become free: after a release, or when sandboxes were added.
func (q *Queue[E]) Dispatch() {
	if q.n.Load() > 0 {
		q.mu.Lock()
		q.dispatchLocked()
		q.mu.Unlock()
	}
}

func (q *Queue[E]) dispatchLocked() {
	for q.head != nil {
		slot, ok := q.slots.Pick()
		if !ok {
			return
		}
		w := q.head
		q.removeLocked(w)
		w.slot = slot
		w.ready <- struct{}{}
	}
}

// Close answers every waiter with err and every later Wait too: the
// function is gone.
func (q *Queue[E]) Close(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = err
	q.failLocked(err)
}

// FailIfRefused answers every waiter with Slots.Refuse's error, if it has
// one now: waiting calls learn at once that no slot will come.
func (q *Queue[E]) FailIfRefused() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.slots.Refuse(); err != nil {
		q.failLocked(err)
	}
}

func (q *Queue[E]) failLocked(err error) {
	for q.head != nil {
		w := q.head
		q.removeLocked(w)
		w.err = err
		w.ready <- struct{}{}
	}
}

// pushLocked queues w: a synchronous call before the first asynchronous
// one (the asynchronous waiters form the tail), an asynchronous one last.
func (q *Queue[E]) pushLocked(w *waiter) {
	w.queued = true
	q.n.Add(1)
	if w.low {
		q.nlow++
		if q.firstLow == nil {
			q.firstLow = w
		}
	} else if at := q.firstLow; at != nil {
		w.prev, w.next = at.prev, at
		if at.prev != nil {
			at.prev.next = w
		} else {
			q.head = w
		}
		at.prev = w
		return
	}
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
}

func (q *Queue[E]) removeLocked(w *waiter) {
	if w == q.firstLow {
		q.firstLow = w.next // the rest of the tail is low too
	}
	if w.low {
		q.nlow--
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	q.n.Add(-1)
}

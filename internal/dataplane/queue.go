package dataplane

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Reasons a request gets no sandbox; mapped to HTTP status codes in one place
// (errorStatus).
var (
	errQueueFull       = errors.New("queue full")
	errQueueTimeout    = errors.New("timed out waiting for a sandbox")
	errFunctionDeleted = errors.New("function deleted")
	errFunctionFailing = errors.New("the function's sandboxes fail to start")
	errNoRoom          = errors.New("no node has room for a sandbox")
)

// waiter is one queued request. Whoever dequeues it (a releaser, an Apply
// that adds endpoints, a delete) fills ep or err and signals ready exactly
// once; the owner then reads them. Ownership of a reserved slot therefore
// passes hand to hand, so a freed slot goes to the oldest waiter and no
// request can steal it in between.
type waiter struct {
	prev, next *waiter
	queued     bool // guarded by function.mu
	low        bool // an asynchronous call: it waits behind every synchronous one
	ready      chan struct{}
	ep         *endpoint
	err        error
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ready: make(chan struct{}, 1)} }}

func putWaiter(w *waiter) {
	w.ep, w.err, w.prev, w.next, w.low = nil, nil, nil, nil, false
	waiterPool.Put(w)
}

// acquire reserves a slot on one of fn's endpoints, queueing while none is
// free. The fast path is one atomic load of the set plus the policy's Pick;
// it is skipped while others wait so that arrivals cannot overtake the queue.
// waited reports whether the request went through the queue; onQueued runs
// once if it had to wait with no free slot anywhere. A low-priority
// (asynchronous) call waits behind every synchronous one, and does not
// count against the queue depth synchronous calls see.
func (fn *function) acquire(ctx context.Context, set *epSet, onQueued func(*function), low bool) (ep *endpoint, waited bool, err error) {
	if ep, ok := fn.tryAcquire(set); ok {
		return ep, false, nil
	}
	ep, err = fn.wait(ctx, set.Conf, onQueued, low)
	return ep, true, err
}

// tryAcquire reserves a free slot without queueing, unless others wait.
func (fn *function) tryAcquire(set *epSet) (*endpoint, bool) {
	if fn.nwait.Load() == 0 {
		if i, ok := set.Conf.policy.Pick(set.Trackers); ok {
			return set.Endpoints[i], true
		}
	}
	return nil, false
}

func (fn *function) wait(ctx context.Context, conf *fnConf, onQueued func(*function), low bool) (*endpoint, error) {
	fn.mu.Lock()
	if fn.deleted {
		fn.mu.Unlock()
		return nil, errFunctionDeleted
	}
	if err := fn.failingFast(); err != nil {
		fn.mu.Unlock()
		onQueued(fn) // the demand still reaches the control plane, which retries
		return nil, err
	}
	if !low && int(fn.nwait.Load()-fn.nlow) >= conf.queueDepth {
		fn.mu.Unlock()
		return nil, errQueueFull
	}
	w := waiterPool.Get().(*waiter)
	w.low = low
	fn.pushLocked(w)
	// nwait was raised before this Pick, so a concurrent release either
	// shows up here or sees nwait > 0 and dispatches: no lost wake-up.
	fn.dispatchLocked()
	stillQueued := w.queued
	fn.mu.Unlock()

	if stillQueued {
		onQueued(fn)
		timer := time.NewTimer(conf.queueTimeout)
		var err error
		select {
		case <-w.ready:
			timer.Stop()
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-timer.C:
			err = errQueueTimeout
		}
		if err != nil {
			fn.mu.Lock()
			if w.queued {
				fn.removeLocked(w)
				fn.mu.Unlock()
				putWaiter(w)
				return nil, err
			}
			fn.mu.Unlock()
			<-w.ready // dequeued concurrently: the handoff is on its way
			if w.err == nil && !errors.Is(err, errQueueTimeout) {
				// The client is gone: pass the slot on.
				fn.release(w.ep)
				putWaiter(w)
				return nil, err
			}
			// A slot that arrived together with the timeout is used.
		}
	} else {
		<-w.ready
	}
	ep, err := w.ep, w.err
	putWaiter(w)
	return ep, err
}

// release returns ep's slot and hands it to the oldest waiter, if any. An
// endpoint already removed from the set simply drops its tracker.
func (fn *function) release(ep *endpoint) {
	ep.tracker.Release()
	fn.maybeDispatch()
}

func (fn *function) maybeDispatch() {
	if fn.nwait.Load() > 0 {
		fn.mu.Lock()
		fn.dispatchLocked()
		fn.mu.Unlock()
	}
}

// dispatchLocked gives free slots to waiters in FIFO order.
func (fn *function) dispatchLocked() {
	for fn.head != nil {
		set := fn.set.Load()
		i, ok := set.Conf.policy.Pick(set.Trackers)
		if !ok {
			return
		}
		w := fn.head
		fn.removeLocked(w)
		w.ep = set.Endpoints[i]
		w.ready <- struct{}{}
	}
}

// fail dequeues every waiter with err and refuses new ones: the function was
// deleted.
func (fn *function) fail(err error) {
	fn.mu.Lock()
	defer fn.mu.Unlock()
	fn.deleted = true
	fn.failWaitersLocked(err)
}

// failingFast says whether a call that finds no free slot is answered at
// once, and with what: the function's starts keep failing, or no node has
// room for its first sandbox, and it has no sandbox that could free a slot.
func (fn *function) failingFast() error {
	c := fn.cond.Load()
	if c == nil || !c.failFast {
		return nil
	}
	if set := fn.set.Load(); set != nil && len(set.Endpoints) > 0 {
		return nil
	}
	if c.why == reasonNoCapacity {
		return errNoRoom
	}
	return errFunctionFailing
}

// failWaiters answers every queued call at once, if the function fails
// fast.
func (fn *function) failWaiters() {
	fn.mu.Lock()
	defer fn.mu.Unlock()
	if err := fn.failingFast(); err != nil {
		fn.failWaitersLocked(err)
	}
}

func (fn *function) failWaitersLocked(err error) {
	for fn.head != nil {
		w := fn.head
		fn.removeLocked(w)
		w.err = err
		w.ready <- struct{}{}
	}
}

// pushLocked queues w: a synchronous call before the first asynchronous
// one (the low-priority waiters form the tail), an asynchronous one last.
func (fn *function) pushLocked(w *waiter) {
	w.queued = true
	fn.nwait.Add(1)
	if w.low {
		fn.nlow++
		if fn.firstLow == nil {
			fn.firstLow = w
		}
	} else if at := fn.firstLow; at != nil {
		w.prev, w.next = at.prev, at
		if at.prev != nil {
			at.prev.next = w
		} else {
			fn.head = w
		}
		at.prev = w
		return
	}
	w.prev, w.next = fn.tail, nil
	if fn.tail != nil {
		fn.tail.next = w
	} else {
		fn.head = w
	}
	fn.tail = w
}

func (fn *function) removeLocked(w *waiter) {
	if w == fn.firstLow {
		fn.firstLow = w.next // the rest of the tail is low too
	}
	if w.low {
		fn.nlow--
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		fn.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		fn.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	fn.nwait.Add(-1)
}

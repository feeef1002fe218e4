package dataplane

import (
	"context"
	"errors"

	"github.com/brisk-faas/brisk/internal/dataplane/queue"
)

// Reasons a request gets no sandbox; mapped to HTTP status codes in one place
// (errorStatus).
var (
	errQueueFull       = queue.ErrFull
	errQueueTimeout    = queue.ErrTimeout
	errFunctionDeleted = errors.New("function deleted")
	errFunctionFailing = errors.New("the function's sandboxes fail to start")
	errNoRoom          = errors.New("no node has room for a sandbox")
)

// acquire reserves a slot on one of fn's endpoints, queueing while none is
// free (internal/dataplane/queue). The fast path is one atomic load of the
// set plus the policy's Pick; it is skipped while others wait so that
// arrivals cannot overtake the queue. waited reports whether the request
// went through the queue; onQueued runs once if it had to wait with no free
// slot anywhere. A low-priority (asynchronous) call waits behind every
// synchronous one, and does not count against the queue depth synchronous
// calls see.
func (fn *function) acquire(ctx context.Context, set *epSet, onQueued func(*function), low bool) (ep *endpoint, waited bool, err error) {
	if ep, ok := fn.tryAcquire(set); ok {
		return ep, false, nil
	}
	ep, err = fn.q.Wait(ctx, set.Conf.queueDepth, set.Conf.queueTimeout, low, func() { onQueued(fn) })
	return ep, true, err
}

// tryAcquire reserves a free slot without queueing, unless others wait.
func (fn *function) tryAcquire(set *epSet) (*endpoint, bool) {
	if fn.q.Len() == 0 {
		return set.Pick(set.Conf.policy)
	}
	return nil, false
}

// release returns ep's slot and hands it to the oldest waiter, if any. An
// endpoint already removed from the set simply drops its tracker.
func (fn *function) release(ep *endpoint) {
	ep.tracker.Release()
	fn.q.Dispatch()
}

// Pick, Release and Refuse are fn's side of its queue (queue.Slots).

// Pick reserves a free slot on fn's current set.
func (fn *function) Pick() (*endpoint, bool) {
	set := fn.set.Load()
	return set.Pick(set.Conf.policy)
}

// Release frees a slot of ep without a dispatch (the queue dispatches).
func (fn *function) Release(ep *endpoint) { ep.tracker.Release() }

// Refuse says whether a call that finds no free slot is answered at once,
// and with what: the function's starts keep failing, or no node has room
// for its first sandbox, and it has no sandbox that could free a slot.
func (fn *function) Refuse() error {
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

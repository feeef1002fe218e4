package loadbalance

import (
	"fmt"
	"math"
	"sync/atomic"
)

// Tracker is one sandbox endpoint's in-flight counter and concurrency limit.
// It plays the role of Knative's per-pod breaker for the activator, without a
// queue: requests that find no slot wait in the caller's per-function queue.
//
// All methods are safe for concurrent use and never block. The caller keeps
// one Tracker per endpoint for the endpoint's lifetime, so in-flight counts
// survive copy-on-write updates of the endpoint set.
type Tracker struct {
	inFlight atomic.Int32
	capacity int32 // 0 = unlimited; immutable after NewTracker
	// Every Pick writes inFlight; the padding keeps that cache line away from
	// ID and Addr, which the proxy reads after every pick.
	_ [56]byte

	// ID and Addr identify the endpoint for the caller. Policies never read
	// them; set them before the Tracker is shared.
	ID   string
	Addr string
}

// NewTracker returns an idle tracker admitting capacity concurrent requests
// (the sandbox's container concurrency); 0 means unlimited. A negative
// capacity, or one beyond int32, is a configuration bug and panics.
func NewTracker(capacity int) *Tracker {
	if capacity < 0 || capacity > math.MaxInt32 {
		panic(fmt.Sprintf("loadbalance: tracker capacity %d out of range [0, %d]", capacity, math.MaxInt32))
	}
	return &Tracker{capacity: int32(capacity)}
}

// InFlight returns the number of reserved slots. Under concurrency it is a
// snapshot that may be stale by the time the caller uses it.
func (t *Tracker) InFlight() int { return int(t.inFlight.Load()) }

// Capacity returns the concurrency limit, 0 for unlimited.
func (t *Tracker) Capacity() int { return int(t.capacity) }

// free reports whether a slot looked free at load l (a hint; TryReserve
// decides).
func (t *Tracker) free(l int32) bool { return t.capacity == 0 || l < t.capacity }

// TryReserve takes a slot if one is free and reports whether it did. It never
// blocks; a successful call must be paired with exactly one Release.
func (t *Tracker) TryReserve() bool {
	if t.capacity == 0 {
		t.inFlight.Add(1)
		return true
	}
	for {
		cur := t.inFlight.Load()
		if cur >= t.capacity {
			return false
		}
		// A failed CAS means another goroutine changed the count (some
		// reservation or release completed), so retrying is lock-free.
		if t.inFlight.CompareAndSwap(cur, cur+1) {
			return true
		}
	}
}

// Release returns a slot taken by TryReserve or a Policy's Pick. Releasing
// more than was reserved is a bug in the caller and panics, because a
// negative count would silently raise the endpoint's capacity.
func (t *Tracker) Release() {
	if t.inFlight.Add(-1) < 0 {
		panic("loadbalance: Tracker.Release without a matching reservation")
	}
}

package auth

import (
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Throttle slows token guessing: each client address may fail
// authentication with one token id (ID; "" for tokens of no known form)
// Burst times at once, then once per Every; out of failures, its requests
// with that id are refused before the token is checked, until it has one
// again. Keyed by the id too, a guesser does not lock out the other
// tokens used from its address (a shared proxy, a follower replica). Tokens carry 128 random bits, so guessing cannot succeed anyway;
// the throttle keeps a guesser from costing the server a hash per try and
// makes the attempt visible (429 in its client's log). Addresses are
// forgotten once their bucket is full again; at most MaxAddrs are kept
// (the oldest forgotten first), so a flood of addresses costs bounded
// memory.
type Throttle struct {
	Burst    int
	Every    time.Duration
	MaxAddrs int

	mu    sync.Mutex
	addrs map[throttleKey]*rate.Limiter
	order []throttleKey // insertion order, for the cap
}

type throttleKey struct {
	addr netip.Addr
	id   string
}

// NewThrottle returns a throttle of burst failures refilled one per every.
func NewThrottle(burst int, every time.Duration) *Throttle {
	return &Throttle{Burst: burst, Every: every, MaxAddrs: 10000, addrs: map[throttleKey]*rate.Limiter{}}
}

// Allowed reports whether addr may try token tok now, and if not, after
// how long it may.
func (t *Throttle) Allowed(addr netip.Addr, tok string, now time.Time) (bool, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.addrs[throttleKey{addr, ID(tok)}]
	if l == nil {
		return true, 0
	}
	tokens := l.TokensAt(now)
	if tokens >= 1 {
		return true, 0
	}
	return false, time.Duration((1 - tokens) * float64(t.Every))
}

// Failed records a failed authentication of token tok from addr.
func (t *Throttle) Failed(addr netip.Addr, tok string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := throttleKey{addr, ID(tok)}
	l := t.addrs[k]
	if l == nil {
		if len(t.addrs) >= t.MaxAddrs {
			t.forget(now)
		}
		l = rate.NewLimiter(rate.Every(t.Every), t.Burst)
		t.addrs[k] = l
		t.order = append(t.order, k)
	}
	l.AllowN(now, 1)
}

// forget drops the addresses whose buckets are full again, or the oldest
// half when none is.
func (t *Throttle) forget(now time.Time) {
	kept := t.order[:0]
	for _, a := range t.order {
		if l := t.addrs[a]; l.TokensAt(now) >= float64(t.Burst) {
			delete(t.addrs, a)
		} else {
			kept = append(kept, a)
		}
	}
	t.order = kept
	if len(t.addrs) >= t.MaxAddrs {
		half := len(t.order) / 2
		for _, a := range t.order[:half] {
			delete(t.addrs, a)
		}
		t.order = append(t.order[:0], t.order[half:]...)
	}
}

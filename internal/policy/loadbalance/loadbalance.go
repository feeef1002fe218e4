package loadbalance

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
)

// Policy picks the endpoint for one request and reserves a slot on it.
//
// Pick returns the index in eps of the reserved endpoint, or ok=false (and
// idx -1) when no endpoint had a free slot; the caller then queues the
// request and retries when a slot is released or the set changes. After a
// successful Pick the caller must call eps[idx].Release() exactly once when
// the request completes.
//
// Pick is safe for concurrent use, never blocks and does not allocate. eps
// must not be modified while Pick runs (endpoint sets are copy-on-write) and
// should keep a stable order across calls: first-available and round-robin
// are defined by it (Knative sorts pods by IP).
type Policy interface {
	Pick(eps []*Tracker) (idx int, ok bool)
}

// Policy names accepted by New.
const (
	NameLeastLoaded    = "least-loaded"
	NameKnative        = "knative"
	NameRoundRobin     = "round-robin"
	NameFirstAvailable = "first-available"
	NamePowerOfTwo     = "power-of-two"
	NameRandom         = "random"
)

// Names lists the policy names New accepts, default first.
func Names() []string {
	return []string{NameLeastLoaded, NameKnative, NameRoundRobin, NameFirstAvailable, NamePowerOfTwo, NameRandom}
}

// ErrUnknownPolicy is wrapped by New for a name it does not know.
var ErrUnknownPolicy = errors.New("loadbalance: unknown policy")

// New returns the policy called name; "" selects the default, "least-loaded".
// cc is the function's container concurrency (0 = unlimited) and only
// selects the "knative" variant; it must not be negative. rnd may be nil only
// for policies that draw no random numbers.
func New(name string, cc int, rnd func() uint64) (Policy, error) {
	if cc < 0 {
		return nil, fmt.Errorf("loadbalance: container concurrency %d, want >= 0 (0 = unlimited)", cc)
	}
	needsRand := true
	switch name {
	case "", NameLeastLoaded, NamePowerOfTwo, NameRandom:
	case NameKnative:
		needsRand = cc == 0
	case NameRoundRobin, NameFirstAvailable:
		needsRand = false
	default:
		return nil, fmt.Errorf("%w %q (allowed: %s)", ErrUnknownPolicy, name, strings.Join(Names(), ", "))
	}
	if needsRand && rnd == nil {
		return nil, fmt.Errorf("loadbalance: policy %q needs a non-nil random source", name)
	}
	switch name {
	case NamePowerOfTwo:
		return NewPowerOfTwo(rnd), nil
	case NameRandom:
		return NewRandom(rnd), nil
	case NameKnative:
		return NewKnative(cc, rnd), nil
	case NameRoundRobin:
		return NewRoundRobin(), nil
	case NameFirstAvailable:
		return NewFirstAvailable(), nil
	default:
		return NewLeastLoaded(rnd), nil
	}
}

// NewKnative returns the policy Knative's activator uses for a revision with
// container concurrency cc (pkg/activator/net/throttler.go): power-of-two
// choices when cc is 0 (unlimited), first-available for 1..3, where a pod
// holds so few requests that packing the first pods keeps the rest idle for
// scale-down, and round-robin above 3. rnd is used only when cc is 0. A
// negative cc is a configuration bug and panics (New reports it as an error).
func NewKnative(cc int, rnd func() uint64) Policy {
	switch {
	case cc < 0:
		panic(fmt.Sprintf("loadbalance: NewKnative with container concurrency %d", cc))
	case cc == 0:
		return NewPowerOfTwo(rnd)
	case cc <= 3:
		return NewFirstAvailable()
	default:
		return NewRoundRobin()
	}
}

// NewRand returns a random source for the policies: splitmix64 over an atomic
// counter. It is safe for concurrent use and costs one atomic add, and for a
// given seed a single goroutine sees the same sequence on every run (under
// concurrency the interleaving, not the set of values, varies).
func NewRand(seed uint64) func() uint64 {
	state := new(atomic.Uint64)
	state.Store(seed)
	return func() uint64 {
		z := state.Add(0x9e3779b97f4a7c15)
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return z ^ (z >> 31)
	}
}

func mustRand(rnd func() uint64, constructor string) {
	if rnd == nil {
		// A nil source is a wiring bug; fail at construction, not on the
		// first request.
		panic("loadbalance: " + constructor + " needs a non-nil random source")
	}
}

// index maps 32 random bits to [0, n) by multiply-shift (Lemire), avoiding a
// division on the hot path. The bias, below n/2^32, is irrelevant here.
func index(bits uint32, n int) int {
	return int(uint64(bits) * uint64(n) >> 32)
}

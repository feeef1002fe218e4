package keepalive

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Candidate is one idle sandbox that may be removed.
type Candidate struct {
	Key       string    // the function ("namespace/name")
	MemoryMB  int64     // memory its removal frees (the configured limit, as FaasCache uses)
	LastUsed  time.Time // when it last finished serving a request
	Uses      int64     // requests it has served; GD's frequency for a function Touch has not seen
	ColdStart time.Duration
	Warm      time.Duration // the function's warm run time; ColdStart - Warm is what a miss costs
}

// Policy is one keep-alive policy.
type Policy interface {
	// Expired reports whether a sandbox idle since lastUsed should be
	// removed at now even without memory pressure.
	Expired(now, lastUsed time.Time) bool
	// Evict returns the candidates to remove, as indices into cands in
	// eviction order, to free needMB: the shortest prefix of the policy's
	// order whose MemoryMB adds up to at least needMB. If all of them
	// together free less, it returns all of them (the caller decides
	// whether evicting is still worth it); needMB <= 0 returns none.
	// Policies that age (GD) assume the caller removes what is returned.
	Evict(now time.Time, cands []Candidate, needMB int64) []int
	// Touch records n invocations of key at now.
	Touch(now time.Time, key string, n int64)
	// Forget drops what the policy remembers of key: call it when the
	// worker no longer holds any sandbox of key (or the function is
	// deleted), which keeps memory bounded by the functions present.
	Forget(key string)
}

// Policy names accepted by New.
const (
	NameTTL = "ttl"
	NameGD  = "gd"
)

// DefaultTTL is the idle time after which the ttl policy removes a sandbox:
// 10 minutes, FaasCache's TTL baseline (OpenWhisk's default idle-container
// timeout).
const DefaultTTL = 10 * time.Minute

// ErrUnknownPolicy is wrapped by New for a name it does not know.
var ErrUnknownPolicy = errors.New("keepalive: unknown policy")

// Names lists the policy names New accepts, default first.
func Names() []string { return []string{NameTTL, NameGD} }

// New returns the policy called name ("" is "ttl"). ttl is the idle limit:
// for "ttl", 0 or less selects DefaultTTL; for "gd", 0 or less means
// sandboxes never expire and leave only by eviction, as in FaasCache.
func New(name string, ttl time.Duration) (Policy, error) {
	switch name {
	case "", NameTTL:
		return NewTTL(ttl), nil
	case NameGD:
		return NewGD(ttl), nil
	}
	return nil, fmt.Errorf("%w %q (allowed: %s)", ErrUnknownPolicy, name, strings.Join(Names(), ", "))
}

// idleFor reports whether a sandbox idle since lastUsed has been idle for
// ttl at now; ttl <= 0 never expires.
func idleFor(now, lastUsed time.Time, ttl time.Duration) bool {
	return ttl > 0 && now.Sub(lastUsed) >= ttl
}

// prefixFreeing returns the shortest prefix of order whose candidates free
// needMB, or all of order.
func prefixFreeing(order []int, cands []Candidate, needMB int64) []int {
	if needMB <= 0 {
		return order[:0]
	}
	var freed int64
	for k, i := range order {
		freed += max(cands[i].MemoryMB, 0)
		if freed >= needMB {
			return order[:k+1]
		}
	}
	return order
}

package keepalive

import (
	"slices"
	"time"
)

// TTL is the fixed time-to-live policy: a sandbox idle for TTL expires, and
// under memory pressure the least recently used idle sandboxes go first
// (ties: lower index). It is FaasCache's TTL baseline and OpenWhisk's
// default behaviour; it keeps no state, so Touch and Forget do nothing.
type TTL struct {
	TTL time.Duration // > 0
}

// NewTTL returns a TTL policy; ttl <= 0 selects DefaultTTL.
func NewTTL(ttl time.Duration) *TTL {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return &TTL{TTL: ttl}
}

// Expired reports whether the sandbox has been idle for TTL.
func (p *TTL) Expired(now, lastUsed time.Time) bool { return idleFor(now, lastUsed, p.TTL) }

// Evict returns candidates least recently used first.
func (p *TTL) Evict(now time.Time, cands []Candidate, needMB int64) []int {
	_ = now // LRU order needs no clock
	if needMB <= 0 || len(cands) == 0 {
		return nil
	}
	order := make([]int, len(cands))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cands[a].LastUsed.Compare(cands[b].LastUsed) })
	return prefixFreeing(order, cands, needMB)
}

// Touch does nothing: the TTL counts from the candidate's LastUsed.
func (p *TTL) Touch(time.Time, string, int64) {}

// Forget does nothing: TTL keeps no per-function state.
func (p *TTL) Forget(string) {}

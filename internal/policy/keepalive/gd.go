package keepalive

import (
	"cmp"
	"slices"
	"time"
)

// gdKey is what GD remembers of one function.
type gdKey struct {
	clock float64 // the Clock when it was last invoked
	freq  int64   // invocations since it was last forgotten
}

// GD is FaasCache's Greedy-Dual-Size-Frequency keep-alive (Fuerst and
// Sharma, ASPLOS'21). Each idle sandbox of function f has the priority
//
//	Clock(f) + Freq(f) × (ColdStart − Warm) / MemoryMB
//
// where Freq(f) counts f's invocations (Touch) and Clock(f) is the policy's
// Clock at f's last invocation. Eviction takes the lowest priorities first:
// cheap to restart, large, rarely used, or not used for a long time. The
// Clock then rises to the priority of the last victim, so functions that
// stop being invoked keep an old, low Clock(f) and age out even if they were
// once frequent. Cost is in seconds; a negative cost counts as 0 and a
// MemoryMB below 1 as 1. A function Touch has not seen (for example a
// sandbox adopted after a restart) has Clock(f) = 0 and its candidate's Uses
// as its frequency. Ties go to the least recently used, then the lower
// index.
//
// The frequency follows FaasCache's OpenWhisk implementation (cumulative
// invocations per function) until the caller calls Forget(f); calling it
// when f's last sandbox is gone gives the FaasCache simulator's frequency,
// which restarts with the next sandbox.
type GD struct {
	// TTL, when > 0, also expires sandboxes idle that long; FaasCache's GD
	// has none (0): sandboxes leave only when memory is needed.
	TTL time.Duration

	clock float64
	keys  map[string]gdKey
}

// NewGD returns a GD policy with Clock 0; ttl <= 0 means no expiry.
func NewGD(ttl time.Duration) *GD {
	return &GD{TTL: max(ttl, 0), keys: make(map[string]gdKey)}
}

// Clock is the current Clock: the highest priority evicted so far.
func (p *GD) Clock() float64 { return p.clock }

// Priority is c's priority now (higher is kept longer).
func (p *GD) Priority(c Candidate) float64 {
	k, seen := p.keys[c.Key]
	if !seen {
		k.freq = c.Uses
	}
	cost := max(c.ColdStart-c.Warm, 0).Seconds()
	return k.clock + float64(k.freq)*cost/float64(max(c.MemoryMB, 1))
}

// Expired reports whether the sandbox has been idle for TTL, if one is set.
func (p *GD) Expired(now, lastUsed time.Time) bool { return idleFor(now, lastUsed, p.TTL) }

// Evict returns candidates by ascending priority and advances the Clock to
// the priority of the last one returned.
func (p *GD) Evict(now time.Time, cands []Candidate, needMB int64) []int {
	_ = now // priorities move with the Clock, not with time
	if needMB <= 0 || len(cands) == 0 {
		return nil
	}
	order, prio := p.order(cands)
	victims := prefixFreeing(order, cands, needMB)
	if len(victims) > 0 {
		p.clock = max(p.clock, prio[victims[len(victims)-1]])
	}
	return victims
}

// EvictN is Evict for a cache bounded by count, not memory (a worker's
// function templates): the n candidates of lowest priority, in eviction
// order, the Clock advanced to the last one's.
func (p *GD) EvictN(cands []Candidate, n int) []int {
	if n <= 0 || len(cands) == 0 {
		return nil
	}
	order, prio := p.order(cands)
	victims := order[:min(n, len(order))]
	p.clock = max(p.clock, prio[victims[len(victims)-1]])
	return victims
}

// order is cands' indices by ascending priority (the least recently used
// first among equals), and each one's priority.
func (p *GD) order(cands []Candidate) (order []int, prio []float64) {
	prio = make([]float64, len(cands))
	order = make([]int, len(cands))
	for i := range cands {
		prio[i], order[i] = p.Priority(cands[i]), i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := cmp.Compare(prio[a], prio[b]); c != 0 {
			return c
		}
		return cands[a].LastUsed.Compare(cands[b].LastUsed)
	})
	return order, prio
}

// Touch records n invocations of key: its frequency grows by n and its
// Clock(f) becomes the current Clock. n < 1 does nothing.
func (p *GD) Touch(now time.Time, key string, n int64) {
	_ = now // GD ages by the Clock, not by time
	if n < 1 {
		return
	}
	k := p.keys[key]
	k.clock = p.clock
	k.freq += n
	p.keys[key] = k
}

// Forget drops key's frequency and Clock(f).
func (p *GD) Forget(key string) { delete(p.keys, key) }

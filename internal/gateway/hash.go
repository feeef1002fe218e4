package gateway

import "github.com/brisk-faas/brisk/internal/hashx"

// Rendezvous (highest-random-weight) hashing: a function goes to the healthy
// data plane with the highest score(function, data plane). Taking a data
// plane away moves only the functions whose top score was on it, each to its
// runner-up, and every gateway computes the same scores because they depend
// only on the two strings (no seed, no configuration order).

// hashString is 64-bit FNV-1a, inlined so hashing a name never allocates.
func hashString(s string) uint64 { return hashx.FNV1a(hashx.Offset64, s) }

// mix is MurmurHash3's 64-bit finaliser, a bijection with full avalanche.
// Scoring mix(fn ^ dp) costs one hash of the name per request rather than
// one per data plane, and still orders the data planes independently for
// every name.
func mix(x uint64) uint64 { return hashx.Mix(x) }

// pick returns the healthy data plane with the highest score for function,
// skipping those marked in skip (nil: none). Ties, which need a 64-bit
// collision, go to the smaller address so that they too are independent of
// the configuration order.
func (g *Gateway) pick(function string, skip []bool) *backend {
	fh := hashString(function)
	var best *backend
	var bestScore uint64
	for i, b := range g.dps {
		if !b.up.Load() || (skip != nil && skip[i]) {
			continue
		}
		s := mix(fh ^ b.hash)
		if best == nil || s > bestScore || (s == bestScore && b.addr < best.addr) {
			best, bestScore = b, s
		}
	}
	return best
}

// Pick returns the address of the data plane that calls of function go to
// now, among the healthy ones; false when none is healthy.
func (g *Gateway) Pick(function string) (string, bool) {
	if b := g.pick(function, nil); b != nil {
		return b.addr, true
	}
	return "", false
}

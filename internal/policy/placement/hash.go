package placement

// Helpers shared by the hashing policies (sharding, ch-bl, ch-rlu). Hashes
// must be stable across processes, runs and Go versions, because the
// simulator and the control plane must send a function to the same home:
// never Go's map hash, which is seeded per process (internal/hashx).

import "github.com/brisk-faas/brisk/internal/hashx"

// hashKey is the stable 64-bit hash of a function key: FNV-1a 64, then
// MurmurHash3's finaliser. The same value picks the home and the step (OpenWhisk also derives
// both from one hash).
func hashKey(key string) uint64 { return hashx.Mix(hashx.FNV1a(hashx.Offset64, key)) }

// coprimeSteps is OpenWhisk's pairwiseCoprimeNumbersUntil(n): the k in
// 1..n, in increasing order, that are coprime with n and with every k
// already taken ([1] when none, e.g. n = 0). Walking home, home+s,
// home+2s, ... (mod n) with such a step visits every index exactly once in
// n steps, and different functions that share a home still take different
// paths. OpenWhisk tests gcd against every taken number; that set is always
// 1 followed by the primes up to n that do not divide n (a composite's
// smallest prime factor either divides n or was taken before it), so a
// sieve computes the same list in O(n log log n).
func coprimeSteps(n int) []int {
	steps := []int{1}
	if n < 2 {
		return steps
	}
	composite := make([]bool, n+1)
	for p := 2; p <= n; p++ {
		if composite[p] {
			continue
		}
		for m := p * p; m <= n; m += p {
			composite[m] = true
		}
		if n%p != 0 {
			steps = append(steps, p)
		}
	}
	return steps
}

// stepCache keeps coprimeSteps for the last cluster size, so a stable
// cluster computes it once.
type stepCache struct {
	n     int
	steps []int
}

func (c *stepCache) get(n int) []int {
	if c.steps == nil || c.n != n {
		c.n, c.steps = n, coprimeSteps(n)
	}
	return c.steps
}

// homeAndStep returns OpenWhisk's home index (hash mod n) and step
// (steps[hash mod len(steps)]) for hash h over n > 0 nodes.
func (c *stepCache) homeAndStep(h uint64, n int) (home, step int) {
	steps := c.get(n)
	return int(h % uint64(n)), steps[h%uint64(len(steps))]
}

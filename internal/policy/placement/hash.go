package placement

// Helpers shared by the hashing policies (sharding, ch-bl, ch-rlu). Hashes
// must be stable across processes, runs and Go versions, because the
// simulator and the control plane must send a function to the same home:
// never Go's map hash, which is seeded per process.

const (
	fnvOffset64 uint64 = 14695981039346656037
	fnvPrime64  uint64 = 1099511628211
)

// fnv1a64 continues an FNV-1a 64 hash h over s. Hand-written so that it
// allocates nothing (hash/fnv needs a []byte and an interface value).
func fnv1a64(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// fnv1a64Uint continues h over the 8 little-endian bytes of v.
func fnv1a64Uint(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= fnvPrime64
		v >>= 8
	}
	return h
}

// fmix64 is MurmurHash3's 64-bit finaliser. FNV-1a's low bits depend only on
// the low bits of the input bytes, so keys that differ in one character
// ("fn-1", "fn-2") would land close together under a modulus or on a ring;
// the finaliser spreads every input bit over the whole word.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// hashKey is the stable 64-bit hash of a function key: FNV-1a 64, then
// fmix64. The same value picks the home and the step (OpenWhisk also derives
// both from one hash).
func hashKey(key string) uint64 { return fmix64(fnv1a64(fnvOffset64, key)) }

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

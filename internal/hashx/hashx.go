// Package hashx holds the stable, allocation-free 64-bit hashing that
// brisk's hashing choices share (the gateway's rendezvous hashing, the
// placement policies' homes and rings). Values must be the same in every
// process, run and Go version: never Go's per-process map hash.
package hashx

// FNV-1a 64 parameters.
const (
	Offset64 uint64 = 14695981039346656037
	Prime64  uint64 = 1099511628211
)

// FNV1a continues an FNV-1a 64 hash h (Offset64 to start) over s,
// inlined so that hashing a name never allocates (hash/fnv needs a []byte
// and an interface value).
func FNV1a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= Prime64
	}
	return h
}

// FNV1aUint continues h over the 8 little-endian bytes of v.
func FNV1aUint(h, v uint64) uint64 {
	for range 8 {
		h ^= v & 0xff
		h *= Prime64
		v >>= 8
	}
	return h
}

// Mix is MurmurHash3's 64-bit finaliser, a bijection with full avalanche.
// FNV-1a's low bits depend only on the low bits of the input bytes, so keys
// that differ in one character would land close together under a modulus
// or on a ring; Mix spreads every input bit over the whole word.
func Mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

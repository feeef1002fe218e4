package loadbalance

import (
	"math"
	"sync/atomic"
)

// Compile-time checks that each policy implements Policy.
var (
	_ Policy = (*leastLoaded)(nil)
	_ Policy = firstAvailable{}
	_ Policy = (*roundRobin)(nil)
	_ Policy = (*powerOfTwo)(nil)
	_ Policy = (*random)(nil)
)

type leastLoaded struct{ rnd func() uint64 }

// NewLeastLoaded returns brisk's default: the endpoint with the fewest
// in-flight requests among those with a free slot, ties broken uniformly at
// random. Spreading ties matters: at low load most endpoints are idle, and a
// fixed order would send every request to the same one.
func NewLeastLoaded(rnd func() uint64) Policy {
	mustRand(rnd, "NewLeastLoaded")
	return &leastLoaded{rnd: rnd}
}

func (p *leastLoaded) Pick(eps []*Tracker) (int, bool) {
	n := len(eps)
	if n == 0 {
		return -1, false
	}
	// One draw from the shared source seeds a local generator for the tie
	// draws, so a scan costs one atomic add however many ties it meets.
	x := p.rnd()
	for {
		best, bestLoad, ties := -1, int32(math.MaxInt32), 0
		for i, t := range eps {
			l := t.inFlight.Load()
			if l > bestLoad || !t.free(l) {
				continue
			}
			if l < bestLoad {
				best, bestLoad, ties = i, l, 1
				continue
			}
			// Reservoir sampling: the k-th tie replaces the choice with
			// probability 1/k, leaving each tie equally likely. (Taking the
			// first minimum after a random start is not uniform: an endpoint
			// that follows a busy one would win twice as often.)
			ties++
			x = x*6364136223846793005 + 1442695040888963407 // PCG's LCG step
			if index(uint32(x>>32), ties) == 0 {
				best = i
			}
		}
		if best < 0 {
			return -1, false
		}
		if eps[best].TryReserve() {
			return best, true
		}
		// Another goroutine took best's last slot between the scan and the
		// reservation. Its success is our progress guarantee: rescan with
		// fresh counts rather than settle for a stale choice.
	}
}

type firstAvailable struct{}

// NewFirstAvailable returns Knative's policy for container concurrency 1..3:
// the first endpoint, in the caller's stable order, with a free slot. Load
// concentrates on the first endpoints, which keeps the others idle so the
// autoscaler can remove them.
func NewFirstAvailable() Policy { return firstAvailable{} }

func (firstAvailable) Pick(eps []*Tracker) (int, bool) {
	for i, t := range eps {
		if t.TryReserve() {
			return i, true
		}
	}
	return -1, false
}

type roundRobin struct {
	// next is a raw cursor; the start index is next mod len(eps), so it stays
	// meaningful when the endpoint set grows or shrinks.
	next atomic.Uint64
}

// NewRoundRobin returns Knative's policy for container concurrency above 3:
// starting at a shared cursor, the first endpoint with a free slot; the
// cursor then moves past the chosen endpoint. Knative guards the cursor with
// a mutex; here each Pick claims its start with one atomic add, so concurrent
// pickers start at different endpoints, and a Pick that skipped full
// endpoints moves the cursor past its choice, as Knative's idx = p+1 does.
func NewRoundRobin() Policy { return &roundRobin{} }

func (p *roundRobin) Pick(eps []*Tracker) (int, bool) {
	n := len(eps)
	if n == 0 {
		return -1, false
	}
	c := p.next.Add(1) - 1
	start := int(c % uint64(n))
	for k, i := 0, start; k < n; k++ {
		if eps[i].TryReserve() {
			if i != start {
				// Only if nobody moved the cursor since; otherwise their
				// newer position wins.
				p.next.CompareAndSwap(c+1, uint64(i)+1)
			}
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
	// Nothing was free: give the start back so a failed Pick does not skew
	// the rotation (Knative leaves idx alone in this case).
	p.next.CompareAndSwap(c+1, c)
	return -1, false
}

type powerOfTwo struct{ rnd func() uint64 }

// NewPowerOfTwo returns Knative's policy for unlimited container concurrency
// (randomChoice2): draw two distinct endpoints uniformly and take the one
// with fewer in-flight requests, a coin flip on ties. Two random choices get
// most of least-loaded's balance without a scan, and spread concurrent
// pickers that would all see the same global minimum.
//
// Knative's trackers are unlimited there; if eps have capacities, the loser
// is tried when the winner is full, and then the first endpoint with a free
// slot after the winner, so ok=false still means that nothing was free.
func NewPowerOfTwo(rnd func() uint64) Policy {
	mustRand(rnd, "NewPowerOfTwo")
	return &powerOfTwo{rnd: rnd}
}

func (p *powerOfTwo) Pick(eps []*Tracker) (int, bool) {
	n := len(eps)
	switch n {
	case 0:
		return -1, false
	case 1:
		if eps[0].TryReserve() {
			return 0, true
		}
		return -1, false
	}
	// One draw gives both indices and the coin: i from the low 32 bits, j
	// from the high 32 with their lowest bit spent on the coin.
	r := p.rnd()
	hi := uint32(r >> 32)
	i := index(uint32(r), n)
	j := index(hi&^1, n-1)
	if j >= i {
		j++ // distinct from i, still uniform over the other n-1
	}
	li, lj := eps[i].inFlight.Load(), eps[j].inFlight.Load()
	if lj < li || (lj == li && hi&1 == 1) {
		i, j = j, i
	}
	if eps[i].TryReserve() {
		return i, true
	}
	if eps[j].TryReserve() {
		return j, true
	}
	return reserveFrom(eps, i+1)
}

type random struct{ rnd func() uint64 }

// NewRandom returns a uniformly random endpoint. Knative ships it but never
// selects it; it is here as a baseline. If the drawn endpoint is full, the
// next one with a free slot is taken instead.
func NewRandom(rnd func() uint64) Policy {
	mustRand(rnd, "NewRandom")
	return &random{rnd: rnd}
}

func (p *random) Pick(eps []*Tracker) (int, bool) {
	if len(eps) == 0 {
		return -1, false
	}
	return reserveFrom(eps, index(uint32(p.rnd()), len(eps)))
}

// reserveFrom reserves the first endpoint with a free slot, scanning
// circularly from start (which may equal len(eps)).
func reserveFrom(eps []*Tracker, start int) (int, bool) {
	n := len(eps)
	i := start % n
	for range n {
		if eps[i].TryReserve() {
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
	return -1, false
}

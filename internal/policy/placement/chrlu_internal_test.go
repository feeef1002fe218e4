package placement

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x5eed)) }

func newTestCHRLU(seed uint64, cfg CHRLUConfig) *chrlu { return NewCHRLU(rng(seed), cfg).(*chrlu) }

// chain returns the first k indices of key's OpenWhisk chain over n nodes.
func chain(key string, n, k int) []int {
	var sc stepCache
	i, step := sc.homeAndStep(hashKey(key), n)
	out := make([]int, k)
	for j := range out {
		out[j] = i
		i = (i + step) % n
	}
	return out
}

// An unpopular function stays home up to min(cold/warm ratio, cap).
func TestCHRLUUnpopularBound(t *testing.T) {
	const key = "ns/unpopular"
	req := Request{Resources: Resources{MilliCPU: 100, MemoryMB: 100}, Key: key, Now: t0}
	home := chain(key, 10, 1)[0]
	for _, tt := range []struct {
		ratio, homeLoad float64
		stays           bool
	}{
		{0, 2.2, true}, // unknown: DefaultCHRLUColdWarmRatio
		{0, 2.3, false},
		{4, 3.9, true},
		{4, 4.1, false},
		{10, 5.9, true}, // capped at DefaultCHRLUBoundCap = 6
		{10, 6.1, false},
		{0.5, 1.0, true}, // a ratio below 1 counts as 1
		{0.5, 1.1, false},
	} {
		nodes := emptyNodes(10)
		for i := range nodes {
			nodes[i].Load = 0.1
		}
		nodes[home].Load = tt.homeLoad
		req.ColdWarmRatio = tt.ratio
		got, err := newTestCHRLU(1, CHRLUConfig{}).Place(nodes, req)
		if err != nil || (got == home) != tt.stays {
			t.Errorf("ratio %.1f, home load %.1f: Place = %d, %v; home %d, want stays=%v", tt.ratio, tt.homeLoad, got, err, home, tt.stays)
		}
	}
}

// The walk tries the home and MaxChainLen more nodes on the chain, then
// falls back to the least-loaded feasible node; unschedulable nodes do not
// count as tries.
func TestCHRLUChainLength(t *testing.T) {
	const key = "ns/chained"
	req := Request{Resources: Resources{MilliCPU: 100, MemoryMB: 100}, Key: key, Now: t0}
	const n = 17
	c := chain(key, n, 5)
	setup := func() []Node {
		nodes := emptyNodes(n)
		for i := range nodes {
			nodes[i].Load = 5 // above the unpopular bound 2.2
		}
		nodes[c[3]].Load = 1.0 // fourth on the chain: within the bound
		for i := range nodes {
			if i != c[0] && i != c[1] && i != c[2] && i != c[3] && i != c[4] {
				nodes[i].Load = 0.1 // the least-loaded nodes are off the chain
				break
			}
		}
		return nodes
	}
	leastLoaded := func(nodes []Node) int {
		for i := range nodes {
			if nodes[i].Load == 0.1 {
				return i
			}
		}
		panic("no least-loaded node")
	}

	nodes := setup()
	if got, _ := newTestCHRLU(1, CHRLUConfig{}).Place(nodes, req); got != leastLoaded(nodes) {
		t.Errorf("default chain (3 nodes): Place = %d, want the least-loaded node %d", got, leastLoaded(nodes))
	}
	if got, _ := newTestCHRLU(1, CHRLUConfig{MaxChainLen: 3}).Place(nodes, req); got != c[3] {
		t.Errorf("MaxChainLen 3: Place = %d, want the fourth chain node %d", got, c[3])
	}
	nodes[c[1]].Schedulable = false // skipped without counting: c[3] is the third try
	if got, _ := newTestCHRLU(1, CHRLUConfig{}).Place(nodes, req); got != c[3] {
		t.Errorf("second chain node drained: Place = %d, want %d", got, c[3])
	}
	nodes = setup()
	nodes[c[1]].Requested = nodes[c[1]].Allocatable // full but schedulable: counts
	if got, _ := newTestCHRLU(1, CHRLUConfig{}).Place(nodes, req); got != leastLoaded(nodes) {
		t.Errorf("second chain node full: Place = %d, want the least-loaded node %d", got, leastLoaded(nodes))
	}
	if got, _ := newTestCHRLU(1, CHRLUConfig{MaxChainLen: -1}).Place(nodes, req); got != leastLoaded(nodes) {
		t.Errorf("home only: Place = %d, want the least-loaded node %d", got, leastLoaded(nodes))
	}
	for i := range nodes {
		nodes[i].Schedulable = false
	}
	if got, err := newTestCHRLU(1, CHRLUConfig{}).Place(nodes, req); !errors.Is(err, ErrNoCapacity) || got != -1 {
		t.Errorf("nothing schedulable: Place = %d, %v; want ErrNoCapacity", got, err)
	}
}

// Popularity: the 20 % of functions with the shortest average IATs, from
// Request.Rate or from the time between placements, recomputed every 5 s.
func TestCHRLUPopularity(t *testing.T) {
	p := newTestCHRLU(1, CHRLUConfig{})
	nodes := emptyNodes(4)
	place := func(key string, now time.Time, rate float64) {
		t.Helper()
		if _, err := p.Place(nodes, Request{Resources: Resources{MilliCPU: 1}, Key: key, Now: now, Rate: rate}); err != nil {
			t.Fatal(err)
		}
	}
	for k := 1; k <= 10; k++ {
		place(fmt.Sprintf("rate-%d", k), t0, float64(k))
	}
	if p.popular("rate-10") {
		t.Fatal("popular before the first update that saw it")
	}
	place("trigger", t0.Add(5*time.Second), 0) // first sighting: no IAT yet
	for k := 1; k <= 10; k++ {
		key := fmt.Sprintf("rate-%d", k)
		if want := k >= 9; p.popular(key) != want {
			t.Errorf("%s: popular = %v, want %v (top 2 of 10 by rate)", key, p.popular(key), want)
		}
	}
	if p.popular("trigger") {
		t.Error("a function with no IAT sample is popular")
	}
	// Median IAT of 1/5 and 1/6 s over 4 nodes: µ = min(10 × r / 4 cores, 0.2).
	wantRate := 1 / ((1.0/5 + 1.0/6) / 2) / 4
	if math.Abs(p.perServerRate-wantRate) > 1e-9 {
		t.Errorf("perServerRate = %v, want %v", p.perServerRate, wantRate)
	}

	// Without a rate, placements 10 ms apart make "burst" the most
	// frequent; the update at 10 s ranks 11 functions, the top 3 popular.
	for ms := 9960; ms <= 10000; ms += 10 {
		place("burst", t0.Add(time.Duration(ms)*time.Millisecond), 0)
	}
	for key, want := range map[string]bool{"burst": true, "rate-10": true, "rate-9": true, "rate-8": false} {
		if p.popular(key) != want {
			t.Errorf("after the update at 10 s: %s popular = %v, want %v", key, p.popular(key), want)
		}
	}

	// Nothing placed for 10 minutes: forgotten at the next update.
	place("late", t0.Add(10*time.Second+DefaultCHRLUForgetAfter+time.Second), 0)
	if len(p.keys) != 1 {
		t.Errorf("after 10 idle minutes %d functions are tracked, want only the new one", len(p.keys))
	}
}

func TestCHRLUTracksBoundedKeys(t *testing.T) {
	p := newTestCHRLU(1, CHRLUConfig{})
	nodes := emptyNodes(2)
	for k := range CHRLUMaxTrackedKeys + 100 {
		if _, err := p.Place(nodes, Request{Key: fmt.Sprintf("k%d", k), Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	if len(p.keys) != CHRLUMaxTrackedKeys {
		t.Errorf("tracking %d keys, want the cap %d", len(p.keys), CHRLUMaxTrackedKeys)
	}
}

// A popular function compares load plus noise with BoundedCeil × C, so near
// the bound it is sometimes pushed along; an unpopular one is not.
func TestCHRLUNoiseSpreadsPopularFunctions(t *testing.T) {
	const key = "ns/hot"
	home := chain(key, 10, 1)[0]
	nodes := emptyNodes(10)
	nodes[home].Load = 1.15 // below 1.2 without noise
	moved := 0
	const trials = 300
	for seed := range uint64(trials) {
		p := newTestCHRLU(seed, CHRLUConfig{})
		// The only tracked function, at 100 calls/s: popular from the first
		// update that saw its rate, with a median rate of 100/s over 10
		// nodes of 4 cores, µ = min(10 × 10 / 4, 0.2) = 0.2.
		req := Request{Resources: Resources{MilliCPU: 1}, Key: key, Now: t0, Rate: 100}
		_, _ = p.Place(nodes, req)
		req.Now = t0.Add(5 * time.Second) // update: now popular
		got, err := p.Place(nodes, req)
		if err != nil {
			t.Fatal(err)
		}
		if !p.popular(key) {
			t.Fatal("the only function with an IAT is not popular")
		}
		if got != home {
			moved++
		}
	}
	// P(noise > 0.05) with µ = 0.2, σ = 0.1 is about 93 %.
	if moved < trials*3/4 || moved == trials {
		t.Errorf("popular function moved off a home at load 1.15 in %d of %d trials, want most but not all", moved, trials)
	}
	for seed := range uint64(50) {
		if got, _ := newTestCHRLU(seed, CHRLUConfig{}).Place(nodes, Request{Resources: Resources{MilliCPU: 1}, Key: key, Now: t0}); got != home {
			t.Fatalf("unpopular function left a home at load 1.15 (< 2.2)")
		}
	}
}

// A fallback remembers noise on the node it chose until the next update, so
// successive fallbacks spread instead of piling onto one node.
func TestCHRLUFallbackRemembersNoise(t *testing.T) {
	p := newTestCHRLU(3, CHRLUConfig{})
	nodes := emptyNodes(6)
	for i := range nodes {
		nodes[i].Load = 10 // every node above every bound: always the fallback
	}
	used := make(map[int]bool)
	for k := range 30 {
		got, err := p.Place(nodes, Request{Resources: Resources{MilliCPU: 1}, Key: fmt.Sprintf("f%d", k), Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		used[got] = true
	}
	if len(used) < 3 {
		t.Errorf("30 fallbacks used nodes %v; remembered noise should spread them", used)
	}
	if len(p.offsets) == 0 {
		t.Fatal("no load offset remembered")
	}
	_, _ = p.Place(nodes, Request{Key: "f0", Now: t0.Add(DefaultCHRLUUpdateInterval)})
	if len(p.offsets) != 1 { // cleared by the update, then this placement's own fallback
		t.Errorf("after an update %d offsets remain, want 1", len(p.offsets))
	}
}

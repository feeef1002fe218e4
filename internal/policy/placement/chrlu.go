package placement

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Defaults of NewCHRLU. "The paper" is "Locality-Aware Load-Balancing For
// Serverless Clusters" (Fuerst and Sharma, HPDC'22), which introduced
// CH-RLU; "the code" is its OpenWhisk controller (RLULFSharding).
const (
	// DefaultCHRLUC multiplies BoundedCeil for popular functions: the
	// paper's default load bound b is 1.2, and its experiment scripts set
	// c = 1.2.
	DefaultCHRLUC = 1.2
	// DefaultCHRLUBoundedCeil is the code's boundedCeil. The code's
	// deployment default is 1; the paper's runs used 6 against the load
	// average over a configured 16 cores. With 1, a popular function's
	// bound is 1.2 per core: the paper's b.
	DefaultCHRLUBoundedCeil = 1.0
	// DefaultCHRLUBoundCap is b_max, the paper's cap on the cold/warm-aware
	// bound of unpopular functions (6 in the paper).
	DefaultCHRLUBoundCap = 6.0
	// DefaultCHRLUColdWarmRatio is the cold/warm ratio assumed when the
	// request does not know it (the code's default when the invokers have
	// reported no times yet).
	DefaultCHRLUColdWarmRatio = 2.2
	// DefaultCHRLUMaxChainLen is how many nodes after the home are tried
	// before the least-loaded fallback (the code's maxChainLen: 3 nodes in
	// all).
	DefaultCHRLUMaxChainLen = 2
	// DefaultCHRLUPopularFraction: the 20 % of functions with the shortest
	// inter-arrival times are popular (the paper's popularity threshold).
	DefaultCHRLUPopularFraction = 0.2
	// DefaultCHRLUUpdateInterval is how often, in Request.Now, popularity
	// and the noise are recomputed and the remembered load offsets cleared:
	// the code pulls loads and recomputes popularity every 5 s.
	DefaultCHRLUUpdateInterval = 5 * time.Second
	// DefaultCHRLUForgetAfter: a function not placed for this long is
	// dropped from the popularity statistics, which keeps memory bounded by
	// the functions active recently (the paper's sampling lets "have-been
	// popular" functions fall out of its tracking list).
	DefaultCHRLUForgetAfter = 10 * time.Minute

	// CHRLUEMAAlpha weighs a new inter-arrival time in a function's moving
	// average: ema = 0.9 × iat + 0.1 × ema, as in the code.
	CHRLUEMAAlpha = 0.9
	// CHRLUNoiseSD is the standard deviation of the load noise (the paper's
	// N(µ, σ = 0.1)).
	CHRLUNoiseSD = 0.1
	// CHRLUNoiseMeanCap caps the noise mean µ (the code's min(..., 0.2)).
	CHRLUNoiseMeanCap = 0.2
	// CHRLUNoiseRateFactor scales the per-server arrival rate into the noise
	// mean: µ = min(10 × perServerRate / cores, 0.2), as in the code, where
	// 10 stands for the staleness of the loads.
	CHRLUNoiseRateFactor = 10.0
	// CHRLUMaxTrackedKeys bounds the popularity table between two forgets:
	// keys beyond it are not tracked (and are unpopular) until the next
	// update drops idle ones.
	CHRLUMaxTrackedKeys = 1 << 17
)

// CHRLUConfig parameterises NewCHRLU; zero fields take the defaults.
type CHRLUConfig struct {
	C           float64 // popular bound = BoundedCeil × C; >= 1
	BoundedCeil float64 // > 0
	BoundCap    float64 // cap on the unpopular bound, > 0
	// ColdWarmRatio replaces a Request.ColdWarmRatio of 0 (unknown).
	ColdWarmRatio float64
	// MaxChainLen is the number of nodes tried after the home before the
	// least-loaded fallback; 0 means the default, negative means none (only
	// the home is tried).
	MaxChainLen     int
	PopularFraction float64       // in (0, 1]
	UpdateInterval  time.Duration // > 0
	ForgetAfter     time.Duration // > 0
}

func (c CHRLUConfig) normalized() CHRLUConfig {
	if !(c.C >= 1) {
		c.C = DefaultCHRLUC
	}
	if !(c.BoundedCeil > 0) {
		c.BoundedCeil = DefaultCHRLUBoundedCeil
	}
	if !(c.BoundCap > 0) {
		c.BoundCap = DefaultCHRLUBoundCap
	}
	if !(c.ColdWarmRatio > 0) {
		c.ColdWarmRatio = DefaultCHRLUColdWarmRatio
	}
	switch {
	case c.MaxChainLen == 0:
		c.MaxChainLen = DefaultCHRLUMaxChainLen
	case c.MaxChainLen < 0:
		c.MaxChainLen = 0
	}
	if !(c.PopularFraction > 0 && c.PopularFraction <= 1) {
		c.PopularFraction = DefaultCHRLUPopularFraction
	}
	if c.UpdateInterval <= 0 {
		c.UpdateInterval = DefaultCHRLUUpdateInterval
	}
	if c.ForgetAfter <= 0 {
		c.ForgetAfter = DefaultCHRLUForgetAfter
	}
	return c
}

// keyStats is what CH-RLU remembers of one function.
type keyStats struct {
	last    time.Time // Request.Now of its last placement
	ema     float64   // moving average of its inter-arrival time, seconds
	hasEMA  bool      // ema holds at least one sample
	popular bool      // classified popular at the last update
}

// nodeRef names a node for the load offsets: by ID, or by index when it
// has none.
type nodeRef struct {
	id  string
	idx int
}

func refOf(nodes []Node, i int) nodeRef {
	if id := nodes[i].ID; id != "" {
		return nodeRef{id: id, idx: -1}
	}
	return nodeRef{idx: i}
}

type chrlu struct {
	cfg   CHRLUConfig
	rng   *rand.Rand
	steps stepCache

	keys       map[string]keyStats
	offsets    map[nodeRef]float64 // noise added to fallback choices since the last update
	scratch    []float64           // IATs sorted at each update
	updated    bool                // an update has run
	lastUpdate time.Time

	// perServerRate is the median function's arrival rate divided by the
	// schedulable nodes, at the last update (the noise mean).
	perServerRate float64
}

// NewCHRLU returns CH-RLU, consistent hashing with random load updates
// (Fuerst and Sharma, HPDC'22), as its OpenWhisk code runs it: OpenWhisk's
// home and co-prime step chain (see NewSharding), load bounds that depend on
// the function, random load noise for popular functions, and a least-loaded
// fallback.
//
// Popularity. Each Place observes the function's inter-arrival time: 1/Rate
// when the request carries a rate, else the time since the function's
// previous placement (brisk places sandboxes, not invocations, so this is a
// coarser signal). The moving average weighs a new sample 0.9. Every
// UpdateInterval of Request.Now the policy forgets functions not placed for
// ForgetAfter and reclassifies the rest: the PopularFraction of tracked
// functions with the shortest average IATs (nearest rank, so at least one)
// are popular until the next update; a function first seen since then is
// unpopular, as in the code. The first Place runs an update at once.
//
// Bounds (Load is per core). An unpopular function accepts a node whose
// load is at most min(ColdWarmRatio, BoundCap): the paper's cold/warm-aware
// bound, the more a cold start costs relative to a warm run the more load
// is worth keeping locality (ratios below 1 count as 1). A popular
// function accepts a node whose load plus noise is at most BoundedCeil × C;
// the noise is drawn per node from Normal(µ, 0.1), clamped at 0, with µ =
// min(10 × r / cores, 0.2), r the median function's rate divided by the
// schedulable nodes at the last update and cores the node's allocatable
// CPU (at least 1). The code uses one configured core count; brisk reads
// each node's.
//
// Chain. The walk tries the home and MaxChainLen nodes after it (nodes that
// are not schedulable are skipped without counting, like OpenWhisk's
// unusable invokers; a node that is schedulable but lacks room counts);
// then the least-loaded feasible node takes the sandbox (ties: the first at
// or after the home in slice order) and a noise sample is added to that
// node's remembered load, standing in for the load the placement will add
// before the next report. Remembered offsets count in every comparison and
// are cleared at each update, when fresh loads are assumed to have arrived.
// Unlike the code, nothing is forced onto a node: with no feasible node the
// result is ErrNoCapacity.
func NewCHRLU(rng *rand.Rand, cfg CHRLUConfig) Policy {
	mustRNG(rng, "NewCHRLU")
	return &chrlu{
		cfg:     cfg.normalized(),
		rng:     rng,
		keys:    make(map[string]keyStats),
		offsets: make(map[nodeRef]float64),
	}
}

func (p *chrlu) Place(nodes []Node, r Request) (int, error) {
	n := len(nodes)
	if n == 0 {
		return -1, ErrNoCapacity
	}
	p.observe(r)
	if d := r.Now.Sub(p.lastUpdate); !p.updated || d >= p.cfg.UpdateInterval || d < 0 {
		p.update(nodes, r.Now)
	}

	popular := p.popular(r.Key)
	var bound float64
	if popular {
		bound = p.cfg.BoundedCeil * p.cfg.C
	} else {
		ratio := r.ColdWarmRatio
		if !(ratio > 0) {
			ratio = p.cfg.ColdWarmRatio
		}
		bound = min(max(ratio, 1), p.cfg.BoundCap)
	}

	i, step := p.steps.homeAndStep(hashKey(r.Key), n)
	home := i
	for visited, tried := 0, 0; visited < n && tried <= p.cfg.MaxChainLen; visited++ {
		nd := &nodes[i]
		if nd.Schedulable {
			tried++
			if Feasible(nd, r.Resources) {
				l := p.load(nodes, i)
				if popular {
					l += p.noise(nd)
				}
				if l <= bound {
					return i, nil
				}
			}
		}
		if i += step; i >= n {
			i -= n
		}
	}

	best, bestLoad := -1, 0.0
	i = home
	for range n {
		if nd := &nodes[i]; Feasible(nd, r.Resources) {
			if l := p.load(nodes, i); best < 0 || l < bestLoad {
				best, bestLoad = i, l
			}
		}
		if i++; i == n {
			i = 0
		}
	}
	if best < 0 {
		return -1, ErrNoCapacity
	}
	p.offsets[refOf(nodes, best)] += p.noise(&nodes[best])
	return best, nil
}

// load is node i's reported load plus the noise remembered for it.
func (p *chrlu) load(nodes []Node, i int) float64 {
	l := nodeLoad(&nodes[i])
	if len(p.offsets) > 0 {
		l += p.offsets[refOf(nodes, i)]
	}
	return l
}

// noise draws the extra load anticipated on nd: Normal(µ, CHRLUNoiseSD)
// clamped at 0, with µ from the last update and nd's cores.
func (p *chrlu) noise(nd *Node) float64 {
	cores := max(float64(nd.Allocatable.MilliCPU)/1000, 1)
	mu := min(CHRLUNoiseRateFactor*p.perServerRate/cores, CHRLUNoiseMeanCap)
	return max(0, mu+CHRLUNoiseSD*p.rng.NormFloat64())
}

// observe records one placement of r.Key in its moving-average IAT.
func (p *chrlu) observe(r Request) {
	st, seen := p.keys[r.Key]
	if !seen && len(p.keys) >= CHRLUMaxTrackedKeys {
		return
	}
	iat, ok := 0.0, false
	switch {
	case r.Rate > 0 && !math.IsInf(r.Rate, 1):
		iat, ok = 1/r.Rate, true
	case seen && !r.Now.Before(st.last):
		iat, ok = r.Now.Sub(st.last).Seconds(), true
	}
	if ok {
		if st.hasEMA {
			st.ema = CHRLUEMAAlpha*iat + (1-CHRLUEMAAlpha)*st.ema
		} else {
			st.ema, st.hasEMA = iat, true
		}
	}
	st.last = r.Now
	p.keys[r.Key] = st
}

// popular reports whether the last update classified key as popular.
func (p *chrlu) popular(key string) bool { return p.keys[key].popular }

// update forgets idle functions, recomputes the popularity threshold and
// the noise mean, and clears the remembered load offsets.
func (p *chrlu) update(nodes []Node, now time.Time) {
	p.updated, p.lastUpdate = true, now
	clear(p.offsets)
	iats := p.scratch[:0]
	for k, st := range p.keys {
		if now.Sub(st.last) > p.cfg.ForgetAfter {
			delete(p.keys, k)
			continue
		}
		if st.hasEMA {
			iats = append(iats, st.ema)
		}
	}
	p.scratch = iats
	p.perServerRate = 0
	if len(iats) == 0 {
		return
	}
	slices.Sort(iats) // map order is random; sorted, the result is not
	rank := int(math.Ceil(p.cfg.PopularFraction * float64(len(iats))))
	threshold := iats[max(rank, 1)-1]
	for k, st := range p.keys {
		if pop := st.hasEMA && st.ema <= threshold; pop != st.popular {
			st.popular = pop
			p.keys[k] = st
		}
	}

	median := iats[len(iats)/2]
	if len(iats)%2 == 0 {
		median = (iats[len(iats)/2-1] + median) / 2
	}
	schedulable := 0
	for i := range nodes {
		if nodes[i].Schedulable {
			schedulable++
		}
	}
	switch {
	case schedulable == 0:
	case median <= 0: // simultaneous placements: an unbounded rate
		p.perServerRate = math.Inf(1)
	default:
		p.perServerRate = 1 / median / float64(schedulable)
	}
}

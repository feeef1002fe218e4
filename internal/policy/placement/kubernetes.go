package placement

import "math/rand/v2"

// Constants of kube-scheduler's numFeasibleNodesToFind (schedule_one.go) for
// an unset percentageOfNodesToScore.
const (
	minFeasibleNodesToFind           = 100
	minFeasibleNodesPercentageToFind = 5
	basePercentageOfNodesToScore     = 50
)

// NodesToScore is how many feasible nodes kube-scheduler looks for before it
// stops filtering and scores what it found: all of them below 100 nodes, else
// max(100, n*pct/100) with pct = max(5, 50 - n/125). Bounding the search keeps
// a placement's cost flat in large clusters at the price of optimality.
func NodesToScore(n int) int {
	if n < minFeasibleNodesToFind {
		return n
	}
	pct := max(minFeasibleNodesPercentageToFind, basePercentageOfNodesToScore-n/125)
	return max(minFeasibleNodesToFind, n*pct/100)
}

type kubernetes struct {
	rng *rand.Rand
	// next is where the next search starts (kube's nextStartNodeIndex), so
	// that with sampling successive placements look at different nodes.
	next int
}

// NewKubernetes returns kube-scheduler's default resource placement: the
// NodeResourcesFit filter, then LeastAllocated + BalancedAllocation (weights
// 1 and 1), highest total wins, ties broken uniformly by reservoir sampling
// with rng. With 100 or more nodes only the first NodesToScore(len(nodes))
// feasible nodes found from a rotating start index are scored, as kube does.
func NewKubernetes(rng *rand.Rand) Policy {
	mustRNG(rng, "NewKubernetes")
	return &kubernetes{rng: rng}
}

func (k *kubernetes) Place(nodes []Node, r Request) (int, error) {
	req := r.Resources
	n := len(nodes)
	if n == 0 {
		return -1, ErrNoCapacity
	}
	start := k.next % n // nodes may have shrunk since the last call
	best, processed := selectBest(nodes, req, start, NodesToScore(n), KubernetesScore, k.rng)
	// Like kube, advance by the nodes examined (feasible or not); when every
	// node was examined this leaves the start where it was.
	k.next = (start + processed) % n
	if best < 0 {
		return -1, ErrNoCapacity
	}
	return best, nil
}

// selectBest walks nodes circularly from start until it has found limit
// feasible nodes or seen them all, and returns the index of the highest
// score among the feasible ones (-1 if none) and how many nodes it examined.
// Ties are broken by reservoir sampling, as kube's selectHost: the k-th node
// with the current top score replaces the choice with probability 1/k, which
// makes every tied node equally likely in one pass without allocating.
func selectBest(nodes []Node, req Resources, start, limit int, score func(*Node, Resources) int64, rng *rand.Rand) (best, processed int) {
	n := len(nodes)
	best = -1
	var top int64
	found, ties := 0, 0
	i := start
	for processed < n && found < limit {
		nd := &nodes[i]
		processed++
		if Feasible(nd, req) {
			found++
			switch s := score(nd, req); {
			case best < 0 || s > top:
				best, top, ties = i, s, 1
			case s == top:
				ties++
				if rng.IntN(ties) == 0 {
					best = i
				}
			}
		}
		if i++; i == n {
			i = 0
		}
	}
	return best, processed
}

package placement

import "math/rand/v2"

// localityClassWeight separates the locality classes in one int64 score:
// kubernetes scores are 0..2·MaxNodeScore, so class × weight + score ranks
// by class first and by score within a class.
const localityClassWeight = 4 * MaxNodeScore

type locality struct {
	kube kubernetes // the Locality == nil path, and its rotating index
	rng  *rand.Rand
}

// NewLocality returns kube-scheduler's placement (see NewKubernetes) ranked
// by locality first: among feasible nodes, one where Request.Locality says
// LocalityWarm beats one with LocalityTemplate (the function's template is
// loaded: PulseNet caches snapshots on a subset of nodes and starts there),
// which beats one with LocalityImage, which beats one with nothing;
// within a class the kubernetes score (LeastAllocated + BalancedAllocation)
// decides, ties uniformly at random by reservoir sampling. Values above
// LocalityWarm count as LocalityWarm.
//
// With Locality set every node is considered (a warm node outside kube's
// sample must still win), so a placement costs O(n) calls of Locality. With
// Locality nil the policy is exactly the kubernetes policy, sampling and
// random draws included: same seed, same choices. This plays the role of
// kube's ImageLocality plugin, but as a strict ranking instead of a weight
// that a less loaded node can outscore: in brisk the only cold start is a
// new sandbox, so where its image and shells already are is the first thing
// to get right.
func NewLocality(rng *rand.Rand) Policy {
	mustRNG(rng, "NewLocality")
	return &locality{kube: kubernetes{rng: rng}, rng: rng}
}

func (p *locality) Place(nodes []Node, r Request) (int, error) {
	if r.Locality == nil {
		return p.kube.Place(nodes, r)
	}
	best, ties := -1, 0
	var top int64
	for i := range nodes {
		nd := &nodes[i]
		if !Feasible(nd, r.Resources) {
			continue
		}
		class := min(r.Locality(i), LocalityWarm)
		switch s := int64(class)*localityClassWeight + KubernetesScore(nd, r.Resources); {
		case best < 0 || s > top:
			best, top, ties = i, s, 1
		case s == top:
			ties++
			if p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return -1, ErrNoCapacity
	}
	return best, nil
}

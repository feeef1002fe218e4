package placement

import "math/rand/v2"

type random struct{ rng *rand.Rand }

// NewRandom returns a policy that picks uniformly among feasible nodes
// (Dirigent's default placement).
func NewRandom(rng *rand.Rand) Policy {
	mustRNG(rng, "NewRandom")
	return &random{rng: rng}
}

func (p *random) Place(nodes []Node, r Request) (int, error) {
	req := r.Resources
	// Count, draw, then find the k-th feasible node: two cheap passes and a
	// single draw, instead of one draw per node with reservoir sampling.
	feasible := 0
	for i := range nodes {
		if Feasible(&nodes[i], req) {
			feasible++
		}
	}
	if feasible == 0 {
		return -1, ErrNoCapacity
	}
	k := p.rng.IntN(feasible)
	for i := range nodes {
		if Feasible(&nodes[i], req) {
			if k == 0 {
				return i, nil
			}
			k--
		}
	}
	panic("placement: feasible node vanished between passes") // nodes is not ours to change
}

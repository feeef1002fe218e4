package placement

import "math/rand/v2"

type binPack struct{ rng *rand.Rand }

// NewBinPack returns a packing policy: among feasible nodes, the one that is
// fullest after placing the sandbox (kube's MostAllocated scoring strategy,
// weights cpu=1, memory=1, with the same non-zero defaults), ties broken
// uniformly with rng. Packing leaves whole nodes empty for large sandboxes
// or for scale-in. Every node is scored: it has no kube-scheduler sampling.
func NewBinPack(rng *rand.Rand) Policy {
	mustRNG(rng, "NewBinPack")
	return &binPack{rng: rng}
}

func (p *binPack) Place(nodes []Node, r Request) (int, error) {
	req := r.Resources
	best, _ := selectBest(nodes, req, 0, len(nodes), MostAllocatedScore, p.rng)
	if best < 0 {
		return -1, ErrNoCapacity
	}
	return best, nil
}

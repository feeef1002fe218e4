package placement

type roundRobin struct {
	// next is the index the next search starts from. Order is slice order,
	// so the caller must pass nodes in a stable order (for example sorted by
	// ID) for the rotation to mean anything; Dirigent's map order did not.
	next int
}

// NewRoundRobin returns a policy that rotates over the nodes: each placement
// takes the first feasible node at or after the one following the previous
// choice.
func NewRoundRobin() Policy { return &roundRobin{} }

func (p *roundRobin) Place(nodes []Node, r Request) (int, error) {
	req := r.Resources
	n := len(nodes)
	if n == 0 {
		return -1, ErrNoCapacity
	}
	i := p.next % n
	for range n {
		if Feasible(&nodes[i], req) {
			p.next = i + 1
			return i, nil
		}
		if i++; i == n {
			i = 0
		}
	}
	return -1, ErrNoCapacity
}

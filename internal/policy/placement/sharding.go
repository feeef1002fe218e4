package placement

type sharding struct{ steps stepCache }

// NewSharding returns OpenWhisk's ShardingContainerPoolBalancer adapted to
// brisk: a function's home is hash(Key) mod n, its step is taken from the
// pairwise co-prime step list for n (coprimeSteps), and the policy walks
// home, home+step, home+2·step, ... (mod n) to the first Feasible node.
// Feasible stands in for OpenWhisk's invoker health and memory-slot
// semaphore. Unlike OpenWhisk there is no forced overload: when no node is
// feasible after n steps the result is ErrNoCapacity, not a random invoker
// driven over its memory. It ignores Load and uses no randomness.
//
// Homes are indices, as OpenWhisk's are positions in its invoker list: the
// caller must pass nodes in a stable order (for example sorted by ID), and
// adding or removing a node moves most functions' homes (use ch-bl for a
// ring that does not).
func NewSharding() Policy { return &sharding{} }

func (p *sharding) Place(nodes []Node, r Request) (int, error) {
	n := len(nodes)
	if n == 0 {
		return -1, ErrNoCapacity
	}
	i, step := p.steps.homeAndStep(hashKey(r.Key), n)
	for range n {
		if Feasible(&nodes[i], r.Resources) {
			return i, nil
		}
		if i += step; i >= n {
			i -= n
		}
	}
	return -1, ErrNoCapacity
}

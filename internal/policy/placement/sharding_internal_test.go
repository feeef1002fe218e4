package placement

import (
	"errors"
	"fmt"
	"testing"
)

func emptyNodes(n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		nodes[i] = Node{ID: fmt.Sprintf("w-%d", i), Allocatable: Resources{4000, 4096}, Schedulable: true}
	}
	return nodes
}

// The walk is OpenWhisk's: home, home+step, home+2·step, ... to the first
// feasible node, whatever the loads.
func TestShardingWalksTheStepChain(t *testing.T) {
	req := Request{Resources: Resources{MilliCPU: 500, MemoryMB: 512}}
	var sc stepCache
	for k := range 200 {
		req.Key = fmt.Sprintf("ns/fn-%d", k)
		n := 7 + k%13
		home, step := sc.homeAndStep(hashKey(req.Key), n)
		nodes := emptyNodes(n)
		for i := range nodes {
			nodes[i].Load = 50 // sharding ignores load
		}
		p := NewSharding()
		if got, err := p.Place(nodes, req); err != nil || got != home {
			t.Fatalf("%s: Place = %d, %v; want home %d", req.Key, got, err, home)
		}
		// Fill the home and the next two on its chain: the fourth takes it.
		i := home
		for range 3 {
			nodes[i].Requested = nodes[i].Allocatable
			i = (i + step) % n
		}
		if off := (home + 1) % n; step != 1 && off != i {
			nodes[off].Schedulable = false // a neighbour off the chain does not matter
		}
		if got, err := p.Place(nodes, req); err != nil || got != i {
			t.Fatalf("%s (n=%d, home %d, step %d): Place = %d, %v; want %d", req.Key, n, home, step, got, err, i)
		}
		for j := range nodes {
			nodes[j].Schedulable = false
		}
		if got, err := p.Place(nodes, req); !errors.Is(err, ErrNoCapacity) || got != -1 {
			t.Fatalf("nothing schedulable: Place = %d, %v; want ErrNoCapacity (no forced overload)", got, err)
		}
	}
}

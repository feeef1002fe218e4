package placement_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

// homes places each key once on nodes and returns the chosen node's ID.
func homes(t *testing.T, p placement.Policy, nodes []placement.Node, keys []string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		i, err := p.Place(nodes, placement.Request{Resources: res{MilliCPU: 100, MemoryMB: 100}, Key: k})
		if err != nil {
			t.Fatal(err)
		}
		out[k] = nodes[i].ID
	}
	return out
}

func manyKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant/fn-%d", i)
	}
	return keys
}

// Consistent hashing: removing a node moves only the functions whose home
// it was, adding one moves functions only onto it, and the order in which
// the caller lists nodes does not matter.
func TestCHBLIsConsistent(t *testing.T) {
	keys := manyKeys(3000)
	nodes := unloaded(50)
	p := placement.NewCHBL(placement.CHBLConfig{})
	before := homes(t, p, nodes, keys)

	removed := nodes[17].ID
	after := homes(t, p, slices.Delete(slices.Clone(nodes), 17, 18), keys)
	moved := 0
	for _, k := range keys {
		switch {
		case before[k] == removed:
			moved++
		case after[k] != before[k]:
			t.Fatalf("%s moved from %s to %s though %s was removed", k, before[k], after[k], removed)
		}
	}
	if moved == 0 || moved > len(keys)/10 {
		t.Errorf("%d of %d keys were homed on the removed node; want a fair share (about 60)", moved, len(keys))
	}

	extra := node(0, 0)
	extra.ID = "worker-new"
	grown := append(slices.Clone(nodes), extra)
	after = homes(t, p, grown, keys)
	gained := 0
	for _, k := range keys {
		if after[k] != before[k] {
			if after[k] != extra.ID {
				t.Fatalf("%s moved from %s to %s; only moves to the new node are allowed", k, before[k], after[k])
			}
			gained++
		}
	}
	if gained == 0 || gained > len(keys)/10 {
		t.Errorf("the new node took %d of %d keys; want a fair share (about 60)", gained, len(keys))
	}

	reversed := slices.Clone(nodes)
	slices.Reverse(reversed)
	if got := homes(t, p, reversed, keys); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Error("listing the same nodes in another order changed homes")
	}
}

// With 100 virtual nodes each of 10 nodes is home to roughly a tenth of the
// keys.
func TestCHBLBalancesHomes(t *testing.T) {
	keys := manyKeys(20000)
	count := make(map[string]int)
	for _, id := range homes(t, placement.NewCHBL(placement.CHBLConfig{}), unloaded(10), keys) {
		count[id]++
	}
	for id, c := range count {
		if c < 1200 || c > 2800 {
			t.Errorf("%s is home to %d of 20000 keys, want about 2000", id, c)
		}
	}
	if len(count) != 10 {
		t.Errorf("%d nodes are homes, want 10", len(count))
	}
}

func TestCHBLBound(t *testing.T) {
	req := res{MilliCPU: 100, MemoryMB: 100}
	key := "ns/bounded"
	nodes := unloaded(4)
	p := placement.NewCHBL(placement.CHBLConfig{}) // c = 1.25
	home, _ := p.Place(nodes, placement.Request{Resources: req, Key: key})
	for _, tt := range []struct {
		homeLoad float64
		stays    bool
	}{
		// others at 1: average (3 + h) / 4, bound 1.25 × that.
		{1.0, true},  // bound 1.25
		{1.3, true},  // bound 1.34
		{1.5, false}, // bound 1.41
		{2.0, false}, // bound 1.56
	} {
		for i := range nodes {
			nodes[i].Load = 1
		}
		nodes[home].Load = tt.homeLoad
		got, err := p.Place(nodes, placement.Request{Resources: req, Key: key})
		if err != nil || (got == home) != tt.stays {
			t.Errorf("home load %.1f: Place = %d, %v; home is %d, want stays=%v", tt.homeLoad, got, err, home, tt.stays)
		}
	}

	// Every feasible node above the bound: schedulable but full nodes at
	// load 0 pull the average down to 0.75 (bound 0.94); the least-loaded
	// feasible node takes it.
	nodes = unloaded(4)
	nodes[0].Requested, nodes[1].Requested = nodes[0].Allocatable, nodes[1].Allocatable
	nodes[2].Load, nodes[3].Load = 2, 1
	for _, k := range manyKeys(50) {
		if got, err := p.Place(nodes, placement.Request{Resources: req, Key: k}); err != nil || got != 3 {
			t.Fatalf("%s: Place = %d, %v; want the least-loaded feasible node 3", k, got, err)
		}
	}
	// Equal loads above the bound: the tie goes to the node nearest after
	// the home, so not every function piles onto the same one.
	nodes = unloaded(8)
	for i := range 4 {
		nodes[i].Requested = nodes[i].Allocatable
	}
	for i := 4; i < 8; i++ {
		nodes[i].Load = 1
	}
	used := make(map[int]bool)
	for _, k := range manyKeys(200) {
		got, err := p.Place(nodes, placement.Request{Resources: req, Key: k})
		if err != nil || got < 4 {
			t.Fatalf("%s: Place = %d, %v; want a feasible node", k, got, err)
		}
		used[got] = true
	}
	if len(used) < 2 {
		t.Errorf("fallback ties always went to %v", used)
	}
}

package templateset

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/brisk-faas/brisk/internal/hashx"
)

func nodeIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sim-%05d", i)
	}
	return ids
}

func TestCount(t *testing.T) {
	for _, c := range []struct {
		f    float64
		n, k int
	}{{0, 50, 0}, {-0.5, 50, 0}, {math.NaN(), 50, 0}, {0.1, 50, 5}, {0.01, 50, 1}, {0.07, 100, 7}, {0.25, 1000, 250},
		{0.5, 3, 2}, {1, 50, 50}, {2, 50, 50}, {0.1, 0, 0}, {1e-9, 10, 1}} {
		if got := Count(c.f, c.n); got != c.k {
			t.Errorf("Count(%g, %d) = %d, want %d", c.f, c.n, got, c.k)
		}
	}
}

// selectRank finds the element of each rank, as sorting would, ties in the
// score included.
func TestSelectRank(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 3, 7, 50, 1000} {
		a := make([]Score, n)
		for i := range a {
			a[i] = Score{s: rng.Uint64N(uint64(n)/2 + 1), i: int32(i)} // many equal scores
		}
		sorted := slices.Clone(a)
		slices.SortFunc(sorted, func(x, y Score) int {
			if x.above(y) {
				return -1
			}
			return 1
		})
		for r := range n {
			if got := selectRank(slices.Clone(a), r); got != sorted[r] {
				t.Fatalf("n %d rank %d: %+v, want %+v", n, r, got, sorted[r])
			}
		}
	}
}

// A fraction of 0.1 on 50 nodes gives every function exactly 5 template
// nodes: its 5 highest rendezvous scores, the same on every call, spread
// over the nodes, and a node added to the cluster never takes a template
// away from the nodes that held it.
func TestTemplateNodesRendezvous(t *testing.T) {
	ids := nodeIDs(50)
	perNode := make([]int, len(ids))
	for f := range 200 {
		name := fmt.Sprintf("trace-fn-%d", f)
		got := Nodes(name, ids, 0.1)
		if len(got) != 5 || !slices.IsSorted(got) {
			t.Fatalf("%s: template nodes %v, want 5, ascending", name, got)
		}
		// By brute force: the 5 best scores.
		fh := hashx.FNV1a(hashx.Offset64, name)
		all := make([]Score, len(ids))
		for i, id := range ids {
			all[i] = score(fh, NodeHash(id), i)
		}
		slices.SortFunc(all, func(x, y Score) int {
			if x.above(y) {
				return -1
			}
			return 1
		})
		var want []int
		for _, s := range all[:5] {
			want = append(want, int(s.i))
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %v, want the top scores %v", name, got, want)
		}
		if again := Nodes(name, slices.Clone(ids), 0.1); !slices.Equal(again, got) {
			t.Fatalf("%s: %v, then %v", name, got, again)
		}
		grown := Nodes(name, nodeIDs(51), 0.1) // 6 nodes now
		for _, i := range got {
			if !slices.Contains(grown, i) {
				t.Fatalf("%s: node %d lost its template when a node joined: %v → %v", name, i, got, grown)
			}
		}
		for _, i := range got {
			perNode[i]++
		}
	}
	// 1,000 templates on 50 nodes: 20 each on average.
	if lo, hi := slices.Min(perNode), slices.Max(perNode); lo < 5 || hi > 40 {
		t.Fatalf("templates per node from %d to %d: not spread", lo, hi)
	}
	if got := Nodes("f", ids, 0); len(got) != 0 {
		t.Fatalf("fraction 0: %v", got)
	}
	if got := Nodes("f", ids, 1); len(got) != 50 {
		t.Fatalf("fraction 1: %d nodes", len(got))
	}
}

package placement_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

type res = placement.Resources

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x5eed)) }

// node is a schedulable node with 4 cores and 4096 MiB and the given requests.
func node(cpu, mem int64) placement.Node {
	return placement.Node{
		Allocatable: res{MilliCPU: 4000, MemoryMB: 4096},
		Requested:   res{MilliCPU: cpu, MemoryMB: mem},
		Schedulable: true,
	}
}

func unschedulable(n placement.Node) placement.Node { n.Schedulable = false; return n }

func withSandboxes(n placement.Node, have, limit int) placement.Node {
	n.Sandboxes, n.MaxSandboxes = have, limit
	return n
}

// allPolicies returns every policy New knows, with default parameters.
func allPolicies(seed uint64) map[string]placement.Policy {
	out := make(map[string]placement.Policy)
	for _, name := range placement.Names() {
		p, err := placement.New(name, seeded(seed))
		if err != nil {
			panic(err)
		}
		out[name] = p
	}
	return out
}

func TestFeasible(t *testing.T) {
	tests := []struct {
		label string
		node  placement.Node
		req   res
		want  bool
	}{
		{"empty node fits", node(0, 0), res{1000, 1024}, true},
		{"exact fit", node(3000, 3072), res{1000, 1024}, true},
		{"cpu over by one", node(3001, 0), res{1000, 1024}, false},
		{"memory over by one", node(0, 3073), res{1000, 1024}, false},
		{"zero cpu request fits a cpu-full node", node(4000, 0), res{0, 1024}, true},
		{"zero request fits an overcommitted node", node(5000, 5000), res{}, true},
		{"unschedulable", unschedulable(node(0, 0)), res{1, 1}, false},
		{"below sandbox limit", withSandboxes(node(0, 0), 9, 10), res{1, 1}, true},
		{"at sandbox limit", withSandboxes(node(0, 0), 10, 10), res{1, 1}, false},
		{"no sandbox limit", withSandboxes(node(0, 0), 1000, 0), res{1, 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			if got := placement.Feasible(&tt.node, tt.req); got != tt.want {
				t.Errorf("Feasible = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestScores(t *testing.T) {
	alloc := res{MilliCPU: 1000, MemoryMB: 1000}
	n := func(cpu, mem int64) placement.Node {
		return placement.Node{Allocatable: alloc, Requested: res{cpu, mem}, Schedulable: true}
	}
	tests := []struct {
		label                 string
		node                  placement.Node
		req                   res
		least, balanced, most int64
	}{
		// (1000-500)*100/1000 = 50 for both resources.
		{"half used", n(400, 400), res{100, 100}, 50, 100, 50},
		// cpu 10, memory 90 -> 50; fractions .9 and .1 -> std .4 -> 60.
		{"unbalanced", n(800, 0), res{100, 100}, 50, 60, 50},
		// Zero request: LeastAllocated adds 100m/200Mi: cpu 90, memory 80 -> 85.
		// Balanced skips request-less sandboxes.
		{"zero request uses non-zero defaults", n(0, 0), res{}, 85, 0, 15},
		// Integer truncation: (1000-333)*100/1000 = 66 (66.7), memory 100 -> 83.
		{"truncation", n(233, 0), res{100, 0}, (66 + 80) / 2, 83, (33 + 20) / 2},
		// Over capacity scores 0 free / 100 used; fractions cap at 1.
		{"overcommitted", n(1200, 1200), res{100, 100}, 0, 100, 100},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			if got := placement.LeastAllocatedScore(&tt.node, tt.req); got != tt.least {
				t.Errorf("LeastAllocatedScore = %d, want %d", got, tt.least)
			}
			if got := placement.BalancedAllocationScore(&tt.node, tt.req); got != tt.balanced {
				t.Errorf("BalancedAllocationScore = %d, want %d", got, tt.balanced)
			}
			if got := placement.MostAllocatedScore(&tt.node, tt.req); got != tt.most {
				t.Errorf("MostAllocatedScore = %d, want %d", got, tt.most)
			}
		})
	}
}

func TestNonZeroRequestedCountsRequestlessSandboxes(t *testing.T) {
	// Ten request-less sandboxes: Requested is 0 but kube counts 1000m/2000Mi.
	busy := node(0, 0)
	busy.NonZeroRequested = res{MilliCPU: 1000, MemoryMB: 2000}
	idle := node(0, 0)
	if b, i := placement.LeastAllocatedScore(&busy, res{}), placement.LeastAllocatedScore(&idle, res{}); b >= i {
		t.Fatalf("LeastAllocated busy=%d idle=%d, want busy < idle", b, i)
	}
	p := placement.NewKubernetes(seeded(1))
	for range 20 {
		if got, err := p.Place([]placement.Node{busy, idle}, placement.Request{}); err != nil || got != 1 {
			t.Fatalf("Place = %d, %v; want the idle node 1", got, err)
		}
	}
}

// TestPlace is the behaviour table shared by all policies; want lists the
// acceptable indices (any one of them), nil means ErrNoCapacity.
func TestPlace(t *testing.T) {
	req := res{MilliCPU: 500, MemoryMB: 512}
	tests := []struct {
		label  string
		policy string
		nodes  []placement.Node
		want   []int
	}{
		{"fit filter rejects full nodes", placement.NameKubernetes,
			[]placement.Node{node(3800, 0), node(3900, 4000), node(3000, 3000), node(0, 3700)}, []int{2}},
		{"least allocated prefers the emptier node", placement.NameKubernetes,
			[]placement.Node{node(2000, 2048), node(1000, 1024), node(3000, 3072)}, []int{1}},
		// LeastAllocated alone prefers node 0 (56 vs 50), but its cpu and
		// memory fractions (.75, .125) are far apart: BalancedAllocation
		// gives 68 vs 100, so node 1 wins 150 to 124.
		{"balanced allocation prefers balanced usage", placement.NameKubernetes,
			[]placement.Node{node(2500, 0), node(1500, 1536)}, []int{1}},
		{"unschedulable never chosen even if emptiest", placement.NameKubernetes,
			[]placement.Node{unschedulable(node(0, 0)), node(3000, 3000)}, []int{1}},
		{"sandbox limit", placement.NameKubernetes,
			[]placement.Node{withSandboxes(node(0, 0), 4, 4), node(3000, 3000)}, []int{1}},
		{"nothing fits", placement.NameKubernetes,
			[]placement.Node{node(3600, 0), unschedulable(node(0, 0)), withSandboxes(node(0, 0), 1, 1)}, nil},
		{"no nodes", placement.NameKubernetes, nil, nil},

		{"bin packing prefers the fullest feasible node", placement.NameBinPacking,
			[]placement.Node{node(1000, 1024), node(3600, 3584), node(3000, 3072), node(0, 0)}, []int{2}},
		{"bin packing skips unschedulable", placement.NameBinPacking,
			[]placement.Node{unschedulable(node(3000, 3000)), node(0, 0)}, []int{1}},
		{"bin packing nothing fits", placement.NameBinPacking,
			[]placement.Node{node(3600, 0)}, nil},

		{"random only feasible", placement.NameRandom,
			[]placement.Node{node(3600, 0), node(0, 0), unschedulable(node(0, 0)), node(1000, 1000)}, []int{1, 3}},
		{"random nothing fits", placement.NameRandom,
			[]placement.Node{unschedulable(node(0, 0))}, nil},

		{"round robin first feasible", placement.NameRoundRobin,
			[]placement.Node{unschedulable(node(0, 0)), node(3600, 0), node(0, 0)}, []int{2}},
		{"round robin nothing fits", placement.NameRoundRobin,
			[]placement.Node{node(3600, 0)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			for seed := range uint64(20) { // ties and draws must not matter
				p, err := placement.New(tt.policy, seeded(seed))
				if err != nil {
					t.Fatal(err)
				}
				got, err := p.Place(tt.nodes, placement.Request{Resources: req})
				if tt.want == nil {
					if !errors.Is(err, placement.ErrNoCapacity) || got != -1 {
						t.Fatalf("seed %d: Place = %d, %v; want -1, ErrNoCapacity", seed, got, err)
					}
					continue
				}
				if err != nil || !contains(tt.want, got) {
					t.Fatalf("seed %d: Place = %d, %v; want one of %v", seed, got, err, tt.want)
				}
			}
		})
	}
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// picks runs p calls of Place on the same (unmodified) nodes.
func picks(p placement.Policy, nodes []placement.Node, req res, calls int) []int {
	out := make([]int, calls)
	for i := range out {
		idx, err := p.Place(nodes, placement.Request{Resources: req})
		if err != nil {
			idx = -1
		}
		out[i] = idx
	}
	return out
}

func TestTiesBrokenByRNG(t *testing.T) {
	// Nodes 1, 2 and 4 are empty (best for kubernetes), 0 and 3 are half
	// full (best for bin packing); random may pick any.
	nodes := []placement.Node{node(2000, 2048), node(0, 0), node(0, 0), node(2000, 2048), node(0, 0)}
	req := res{MilliCPU: 100, MemoryMB: 100}
	for _, name := range []string{placement.NameKubernetes, placement.NameBinPacking, placement.NameRandom} {
		t.Run(name, func(t *testing.T) {
			mk := func(seed uint64) placement.Policy {
				p, err := placement.New(name, seeded(seed))
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			a, b := picks(mk(7), nodes, req, 300), picks(mk(7), nodes, req, 300)
			if fmt.Sprint(a) != fmt.Sprint(b) {
				t.Fatal("same seed gave different choices")
			}
			if c := picks(mk(8), nodes, req, 300); fmt.Sprint(a) == fmt.Sprint(c) {
				t.Fatal("different seeds gave identical choices: the rng is not used")
			}
			allowed := []int{1, 2, 4}
			switch name {
			case placement.NameBinPacking:
				allowed = []int{0, 3}
			case placement.NameRandom: // every node is feasible
				allowed = []int{0, 1, 2, 3, 4}
			}
			count := map[int]int{}
			for _, i := range a {
				count[i]++
			}
			for i, c := range count {
				if !contains(allowed, i) {
					t.Errorf("chose node %d (%d times), want only %v", i, c, allowed)
				}
			}
			// Uniform over the tie: each of k nodes expects 300/k; a fair
			// tie-break lands well inside ±50% (p of failing is negligible).
			for _, i := range allowed {
				exp := 300 / len(allowed)
				if c := count[i]; c < exp/2 || c > exp*3/2 {
					t.Errorf("node %d chosen %d times of 300, want about %d", i, c, exp)
				}
			}
		})
	}
}

func TestRoundRobinRotates(t *testing.T) {
	nodes := []placement.Node{node(0, 0), node(0, 0), node(0, 0)}
	req := res{MilliCPU: 100}
	p := placement.NewRoundRobin()
	if got, want := fmt.Sprint(picks(p, nodes, req, 7)), "[0 1 2 0 1 2 0]"; got != want {
		t.Errorf("picks = %s, want %s", got, want)
	}
	nodes[1].Schedulable = false
	// The cursor was at 1: it skips the now unschedulable node.
	if got, want := fmt.Sprint(picks(p, nodes, req, 4)), "[2 0 2 0]"; got != want {
		t.Errorf("after node 1 drained: picks = %s, want %s", got, want)
	}
	// The cluster shrinks below the cursor: it wraps instead of failing.
	if got, want := fmt.Sprint(picks(p, nodes[:1], req, 2)), "[0 0]"; got != want {
		t.Errorf("one node: picks = %s, want %s", got, want)
	}
}

func TestNodesToScore(t *testing.T) {
	for _, tt := range []struct{ n, want int }{
		{0, 0}, {1, 1}, {99, 99},
		{100, 100},   // 50% is 50 -> raised to 100
		{200, 100},   // 49% is 98 -> 100
		{1000, 420},  // 42%
		{5000, 500},  // 10%
		{5625, 281},  // 5% = 281 (50 - 45 = 5)
		{10000, 500}, // floor 5%
	} {
		if got := placement.NodesToScore(tt.n); got != tt.want {
			t.Errorf("NodesToScore(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}

func TestKubernetesSamplesFromRotatingIndex(t *testing.T) {
	// 1000 nodes score 420 at a time. Node 999 is the unique best; the first
	// two searches (nodes 0..419, 420..839) cannot see it, the third
	// (840..999, 0..259) must pick it.
	nodes := make([]placement.Node, 1000)
	for i := range nodes {
		nodes[i] = node(2000, 2048)
	}
	nodes[999] = node(0, 0)
	req := res{MilliCPU: 100, MemoryMB: 100}
	p := placement.NewKubernetes(seeded(3))
	for call, window := range [][2]int{{0, 420}, {420, 840}} {
		got, err := p.Place(nodes, placement.Request{Resources: req})
		if err != nil || got < window[0] || got >= window[1] {
			t.Fatalf("call %d: Place = %d, %v; want a node in [%d,%d)", call, got, err, window[0], window[1])
		}
	}
	if got, err := p.Place(nodes, placement.Request{Resources: req}); err != nil || got != 999 {
		t.Fatalf("call 2: Place = %d, %v; want 999", got, err)
	}

	// Infeasible nodes are examined but do not count towards the 420: with
	// the first 900 nodes full, the search runs on to find node 999.
	for i := range 900 {
		nodes[i] = unschedulable(nodes[i])
	}
	p = placement.NewKubernetes(seeded(3))
	if got, err := p.Place(nodes, placement.Request{Resources: req}); err != nil || got != 999 {
		t.Fatalf("mostly full cluster: Place = %d, %v; want 999", got, err)
	}
}

func TestNew(t *testing.T) {
	for _, name := range append(placement.Names(), "") {
		if p, err := placement.New(name, seeded(1)); err != nil || p == nil {
			t.Errorf("New(%q) = %v, %v", name, p, err)
		}
	}
	_, err := placement.New("best-fit", seeded(1))
	if !errors.Is(err, placement.ErrUnknownPolicy) {
		t.Fatalf("New(best-fit) err = %v, want ErrUnknownPolicy", err)
	}
	for _, name := range placement.Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name allowed value %q", err, name)
		}
	}
	if _, err := placement.New(placement.NameKubernetes, nil); err == nil {
		t.Error("New(kubernetes, nil rng) succeeded")
	}
	for _, name := range []string{placement.NameRoundRobin, placement.NameSharding, placement.NameCHBL} {
		if _, err := placement.New(name, nil); err != nil {
			t.Errorf("New(%s, nil rng) = %v; it needs no rng", name, err)
		}
	}
	for _, name := range []string{placement.NameCHRLU, placement.NameLocality} {
		if _, err := placement.New(name, nil); err == nil {
			t.Errorf("New(%s, nil rng) succeeded; it draws random numbers", name)
		}
	}
}

func TestDefaultIsKubernetes(t *testing.T) {
	// "" and "kubernetes" must make identical decisions for the same seed.
	nodes := []placement.Node{node(3000, 0), node(1500, 1536), node(0, 0), node(0, 0)}
	a, _ := placement.New("", seeded(9))
	b := placement.NewKubernetes(seeded(9))
	req := res{MilliCPU: 100, MemoryMB: 100}
	if x, y := fmt.Sprint(picks(a, nodes, req, 50)), fmt.Sprint(picks(b, nodes, req, 50)); x != y {
		t.Errorf(`New("") picks %s, NewKubernetes picks %s`, x, y)
	}
}

package placement_test

import (
	"errors"
	"math"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

// refKubernetesScore is a deliberately plain transcription of docs/policies.md,
// Placement: Kubernetes scoring (LeastAllocated + BalancedAllocation, weights 1
// and 1) that shares no code with the package.
func refKubernetesScore(n placement.Node, req res) int64 {
	alloc := []int64{n.Allocatable.MilliCPU, n.Allocatable.MemoryMB}
	reqs := []int64{req.MilliCPU, req.MemoryMB}
	requested := []int64{n.Requested.MilliCPU, n.Requested.MemoryMB}
	nonZeroNode := []int64{
		max(n.Requested.MilliCPU, n.NonZeroRequested.MilliCPU),
		max(n.Requested.MemoryMB, n.NonZeroRequested.MemoryMB),
	}
	defaults := []int64{100, 200}

	var least, weights int64
	for r := range alloc {
		if alloc[r] == 0 {
			continue
		}
		podReq := reqs[r]
		if podReq == 0 {
			podReq = defaults[r]
		}
		used := nonZeroNode[r] + podReq
		var s int64
		if used <= alloc[r] {
			s = (alloc[r] - used) * 100 / alloc[r]
		}
		least += s
		weights++
	}
	if weights > 0 {
		least /= weights
	}

	var balanced int64
	if req.MilliCPU != 0 || req.MemoryMB != 0 {
		var fractions []float64
		for r := range alloc {
			if alloc[r] == 0 {
				continue
			}
			fractions = append(fractions, math.Min(1, float64(requested[r]+reqs[r])/float64(alloc[r])))
		}
		std := 0.0
		if len(fractions) == 2 {
			std = math.Abs((fractions[0] - fractions[1]) / 2)
		}
		balanced = int64((1 - std) * 100)
	}
	return least + balanced
}

func refFeasible(n placement.Node, req res) bool {
	free := func(alloc, used, want int64) bool { return want == 0 || want <= alloc-used }
	return n.Schedulable &&
		(n.MaxSandboxes == 0 || n.Sandboxes < n.MaxSandboxes) &&
		free(n.Allocatable.MilliCPU, n.Requested.MilliCPU, req.MilliCPU) &&
		free(n.Allocatable.MemoryMB, n.Requested.MemoryMB, req.MemoryMB)
}

// refSampler tracks kube's rotating start so the reference scores exactly
// the nodes kube-scheduler would (all of them below 100 nodes).
type refSampler struct{ start int }

// window returns the candidate nodes (feasible ones in the sample) and the
// best score among them.
func (s *refSampler) window(nodes []placement.Node, req res) (cands []int, top int64) {
	n := len(nodes)
	want := n
	if n >= 100 {
		pct := 50 - n/125
		if pct < 5 {
			pct = 5
		}
		want = n * pct / 100
		if want < 100 {
			want = 100
		}
	}
	start := s.start % n
	examined := 0
	for examined < n && len(cands) < want {
		i := (start + examined) % n
		examined++
		if refFeasible(nodes[i], req) {
			cands = append(cands, i)
		}
	}
	s.start = (start + examined) % n
	top = -1
	for _, i := range cands {
		top = max(top, refKubernetesScore(nodes[i], req))
	}
	return cands, top
}

// randomCluster draws nodes on a coarse grid so that equal scores (ties),
// exact fits, zero allocatable and overcommitted nodes all occur often.
func randomCluster(rng interface {
	IntN(int) int
	Int64N(int64) int64
}, n int) []placement.Node {
	nodes := make([]placement.Node, n)
	for i := range nodes {
		cpu := 1000 * rng.Int64N(9) // 0 (no cpu at all) .. 8 cores
		mem := 512 * rng.Int64N(9)
		nd := placement.Node{
			Allocatable: res{MilliCPU: cpu, MemoryMB: mem},
			Requested:   res{MilliCPU: 250 * rng.Int64N(cpu/250+3), MemoryMB: 128 * rng.Int64N(mem/128+3)},
			Schedulable: rng.IntN(10) != 0,
			Sandboxes:   rng.IntN(8),
		}
		if rng.IntN(3) == 0 {
			nd.MaxSandboxes = 1 + rng.IntN(8)
		}
		if rng.IntN(2) == 0 { // some request-less sandboxes on the node
			nd.NonZeroRequested = res{
				MilliCPU: nd.Requested.MilliCPU + 100*rng.Int64N(4),
				MemoryMB: nd.Requested.MemoryMB + 200*rng.Int64N(4),
			}
		}
		nodes[i] = nd
	}
	return nodes
}

func randomRequest(rng interface{ Int64N(int64) int64 }) res {
	return res{MilliCPU: 250 * rng.Int64N(9), MemoryMB: 128 * rng.Int64N(9)} // zeros included
}

// TestKubernetesMatchesReference: for thousands of random clusters the node
// chosen is feasible, is in kube's sample, and has the maximum reference
// score; ErrNoCapacity exactly when the reference finds no feasible node.
func TestKubernetesMatchesReference(t *testing.T) {
	gen := seeded(42)
	for iter := range 5000 {
		n := 1 + gen.IntN(99)
		if iter%5 == 0 { // also cover sampling (>= 100 nodes)
			n = 100 + gen.IntN(600)
		}
		nodes := randomCluster(gen, n)
		p := placement.NewKubernetes(seeded(uint64(iter)))
		var ref refSampler
		for step := range 3 { // successive calls exercise the rotating start
			req := randomRequest(gen)
			cands, top := ref.window(nodes, req)
			got, err := p.Place(nodes, placement.Request{Resources: req})
			if len(cands) == 0 {
				if !errors.Is(err, placement.ErrNoCapacity) {
					t.Fatalf("iter %d step %d: Place = %d, %v; reference finds no feasible node", iter, step, got, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("iter %d step %d: Place error %v; reference has %d candidates", iter, step, err, len(cands))
			}
			if !contains(cands, got) {
				t.Fatalf("iter %d step %d: chose node %d outside the reference candidates %v", iter, step, got, cands)
			}
			if s := refKubernetesScore(nodes[got], req); s != top {
				t.Fatalf("iter %d step %d: chose node %d with score %d, max is %d\nnode %+v req %+v",
					iter, step, got, s, top, nodes[got], req)
			}
		}
	}
}

// TestNeverInfeasible drives every policy through sequences of placements,
// recording each one on the chosen node, and checks that no choice is ever
// infeasible and that ErrNoCapacity is returned only when nothing fits.
func TestNeverInfeasible(t *testing.T) {
	for name := range allPolicies(0) {
		t.Run(name, func(t *testing.T) {
			gen := seeded(7)
			placed := 0
			for iter := range 1500 {
				nodes := randomCluster(gen, 1+gen.IntN(300))
				p, err := placement.New(name, seeded(uint64(iter)))
				if err != nil {
					t.Fatal(err)
				}
				for step := range 20 {
					req := randomRequest(gen)
					anyFeasible := false
					for _, nd := range nodes {
						anyFeasible = anyFeasible || refFeasible(nd, req)
					}
					got, err := p.Place(nodes, placement.Request{Resources: req})
					if !anyFeasible {
						if !errors.Is(err, placement.ErrNoCapacity) || got != -1 {
							t.Fatalf("iter %d step %d: Place = %d, %v; want ErrNoCapacity", iter, step, got, err)
						}
						continue
					}
					if err != nil || got < 0 || got >= len(nodes) || !refFeasible(nodes[got], req) {
						t.Fatalf("iter %d step %d: Place = %d, %v; not a feasible node", iter, step, got, err)
					}
					placed++
					nd := &nodes[got]
					nd.Requested.MilliCPU += req.MilliCPU
					nd.Requested.MemoryMB += req.MemoryMB
					nd.Sandboxes++
				}
			}
			if placed < 10000 {
				t.Fatalf("only %d successful placements: the generator is too harsh to test anything", placed)
			}
		})
	}
}

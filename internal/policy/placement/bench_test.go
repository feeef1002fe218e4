package placement_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

// benchCluster is n mostly feasible nodes with IDs and loads in [0, 1.5).
func benchCluster(n int) []placement.Node {
	gen := seeded(uint64(n))
	nodes := make([]placement.Node, n)
	for i := range nodes {
		nodes[i] = node(250*gen.Int64N(16), 256*gen.Int64N(16))
		nodes[i].Schedulable = gen.IntN(20) != 0
		nodes[i].ID = fmt.Sprintf("worker-%05d", i)
		nodes[i].Load = 1.5 * gen.Float64()
	}
	return nodes
}

var benchKeys = func() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d/function-%d", i%17, i)
	}
	return keys
}()

// BenchmarkPlace measures one decision per policy on a fixed cluster. The
// cluster is not updated between calls; the requests cycle over 1,024
// function keys with the clock advancing 10 ms per call, so the hashing
// policies walk different homes and CH-RLU's popularity updates run every
// 500 calls. -benchmem must report 0 allocs/op: caches (step lists, the
// CH-BL ring, CH-RLU's tables) are built in the first calls and reused.
func BenchmarkPlace(b *testing.B) {
	for _, name := range placement.Names() {
		b.Run(name, func(b *testing.B) {
			for _, n := range []int{100, 1000, 10000} {
				b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
					nodes := benchCluster(n)
					p, err := placement.New(name, seeded(2))
					if err != nil {
						b.Fatal(err)
					}
					req := placement.Request{
						Resources: res{MilliCPU: 250, MemoryMB: 256},
						Now:       time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
						Rate:      3,
					}
					// Build caches outside the timed loop.
					if _, err := p.Place(nodes, req); err != nil {
						b.Fatal(err)
					}
					b.ReportAllocs()
					i := 0
					for b.Loop() {
						req.Key = benchKeys[i%len(benchKeys)]
						req.Now = req.Now.Add(10 * time.Millisecond)
						i++
						if _, err := p.Place(nodes, req); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// BenchmarkPlaceLocalityHints is the locality policy with hints: every
// node is scored, one in 50 holds the image and one in 200 a warm sandbox.
func BenchmarkPlaceLocalityHints(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			nodes := benchCluster(n)
			loc := make([]placement.Locality, n)
			for i := range loc {
				switch {
				case i%200 == 7:
					loc[i] = placement.LocalityWarm
				case i%50 == 3:
					loc[i] = placement.LocalityImage
				}
			}
			req := placement.Request{
				Resources: res{MilliCPU: 250, MemoryMB: 256},
				Locality:  func(i int) placement.Locality { return loc[i] },
			}
			p := placement.NewLocality(seeded(2))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Place(nodes, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestPlaceDoesNotAllocate(t *testing.T) {
	nodes := make([]placement.Node, 300)
	for i := range nodes {
		nodes[i] = node(int64(i%16)*250, int64(i%7)*512)
		nodes[i].ID = fmt.Sprintf("w-%d", i)
		nodes[i].Load = float64(i%9) / 4
	}
	loc := make([]placement.Locality, len(nodes))
	for i := range loc {
		loc[i] = placement.Locality(i % 3)
	}
	base := placement.Request{Resources: res{MilliCPU: 250, MemoryMB: 256}, Rate: 2}
	withHints := base
	withHints.Locality = func(i int) placement.Locality { return loc[i] }
	for name, p := range allPolicies(1) {
		for _, r := range []placement.Request{base, withHints} {
			// Warm up every key first: a function CH-RLU has not seen yet
			// costs one map insertion.
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for _, k := range benchKeys[:64] {
				r.Key, r.Now = k, now
				_, _ = p.Place(nodes, r)
			}
			i := 0
			a := testing.AllocsPerRun(500, func() {
				r.Key = benchKeys[i%64]
				now = now.Add(50 * time.Millisecond) // a CH-RLU update every 100 calls
				r.Now = now
				i++
				_, _ = p.Place(nodes, r)
			})
			if a != 0 {
				t.Errorf("%s (hints %v): Place allocates %.2f times per call, want 0", name, r.Locality != nil, a)
			}
		}
	}
}

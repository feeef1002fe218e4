package placement_test

import (
	"fmt"
	"sort"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

// BenchmarkPlace measures one decision on a fixed, mostly feasible cluster.
// The cluster is not updated between calls so every iteration does the same
// work; -benchmem must report 0 allocs/op.
func BenchmarkPlace(b *testing.B) {
	policies := allPolicies(1)
	names := make([]string, 0, len(policies))
	for name := range policies {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			for _, n := range []int{10, 100, 1000} {
				b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
					gen := seeded(uint64(n))
					nodes := make([]placement.Node, n)
					for i := range nodes {
						nodes[i] = node(250*gen.Int64N(16), 256*gen.Int64N(16))
						nodes[i].Schedulable = gen.IntN(20) != 0
					}
					p, err := placement.New(name, seeded(2))
					if err != nil {
						b.Fatal(err)
					}
					req := res{MilliCPU: 250, MemoryMB: 256}
					b.ReportAllocs()
					for b.Loop() {
						if _, err := p.Place(nodes, placement.Request{Resources: req}); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

func TestPlaceDoesNotAllocate(t *testing.T) {
	nodes := make([]placement.Node, 300)
	for i := range nodes {
		nodes[i] = node(int64(i%16)*250, int64(i%7)*512)
	}
	req := res{MilliCPU: 250, MemoryMB: 256}
	for name, p := range allPolicies(1) {
		if a := testing.AllocsPerRun(100, func() { _, _ = p.Place(nodes, placement.Request{Resources: req}) }); a != 0 {
			t.Errorf("%s: Place allocates %.1f times per call, want 0", name, a)
		}
	}
}

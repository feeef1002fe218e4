package loadbalance_test

import (
	"fmt"
	"sort"
	"testing"
)

// BenchmarkPick measures one Pick plus its Release, the per-request cost on
// the proxy, sequentially and from GOMAXPROCS goroutines sharing the policy
// and the endpoints. Endpoints start with uneven loads and capacity 1000, so
// picks succeed and least-loaded cannot stop at the first idle endpoint.
// -benchmem must report 0 allocs/op.
func BenchmarkPick(b *testing.B) {
	names := make([]string, 0)
	for name := range policies(0) {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.Run(name, func(b *testing.B) {
			for _, n := range []int{1, 10, 100} {
				caps, loads := make([]int, n), make([]int, n)
				for i := range caps {
					caps[i], loads[i] = 1000, 1+i*7%5
				}
				b.Run(fmt.Sprintf("endpoints=%d/sequential", n), func(b *testing.B) {
					p, eps := policies(1)[name], trackers(caps, loads)
					b.ReportAllocs()
					for b.Loop() {
						if idx, ok := p.Pick(eps); ok {
							eps[idx].Release()
						}
					}
				})
				b.Run(fmt.Sprintf("endpoints=%d/parallel", n), func(b *testing.B) {
					p, eps := policies(1)[name], trackers(caps, loads)
					b.ReportAllocs()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if idx, ok := p.Pick(eps); ok {
								eps[idx].Release()
							}
						}
					})
				})
			}
		})
	}
}

package netpool

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// benchPool starts a pool on prefix "bb<n>", bridge "bbbr<n>", subnet
// 10.212.<200+n>.0/24, closed when the benchmark ends.
func benchPool(b *testing.B, n, size int) *Pool {
	b.Helper()
	testutil.RequiresRoot(b)
	cfg := Config{
		Size:       size,
		Bridge:     fmt.Sprintf("bbbr%d", n),
		Subnet:     netip.MustParsePrefix(fmt.Sprintf("10.212.%d.0/24", 200+n)),
		NamePrefix: fmt.Sprintf("bb%d", n),
	}
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(b.Context()), time.Minute)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			b.Error(err)
		}
	})
	return p
}

// BenchmarkTakeFromPool measures one pooled attach cycle: Take a ready
// endpoint, Release it, and wait until the background reset has put it back
// (so every iteration finds the pool as full as the first). ns/op is the
// whole cycle; take-p50-ns and take-p99-ns are the Take alone, the part on a
// cold start's critical path.
func BenchmarkTakeFromPool(b *testing.B) {
	p := benchPool(b, 1, 8)
	ctx := b.Context()
	takes := make([]time.Duration, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		recycled := p.Stats().Recycled
		t0 := time.Now()
		ep, err := p.Take(ctx)
		takes = append(takes, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		p.Release(ep)
		for p.Stats().Recycled == recycled {
			runtime.Gosched()
		}
	}
	reportQuantiles(b, "take", takes)
	if s := p.Stats(); s.CreatedOnDemand != 0 {
		b.Errorf("%d takes fell back to on-demand creation", s.CreatedOnDemand)
	}
}

// BenchmarkCreateEndpoint measures building one endpoint through netlink:
// namespace, bind mount, veth into the bridge, address, routes. The teardown
// after each is untimed and reported as destroy-ns/op.
func BenchmarkCreateEndpoint(b *testing.B) {
	p := benchPool(b, 2, 0)
	var destroy time.Duration
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r, err := p.create()
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		t0 := time.Now()
		if !p.destroy(r) {
			b.Fatal("teardown failed")
		}
		destroy += time.Since(t0)
		b.StartTimer()
	}
	b.ReportMetric(float64(destroy.Nanoseconds())/float64(b.N), "destroy-ns/op")
}

func reportQuantiles(b *testing.B, name string, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	q := func(f float64) float64 { return float64(d[int(f*float64(len(d)-1))].Nanoseconds()) }
	b.ReportMetric(q(0.50), name+"-p50-ns")
	b.ReportMetric(q(0.99), name+"-p99-ns")
}

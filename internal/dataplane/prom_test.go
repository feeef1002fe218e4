package dataplane

import (
	"sync"
	"testing"
)

// Status codes are counted exactly, beyond the lock-free slots too, and
// under concurrent first use of a slot.
func TestCodeCountsCountEveryCode(t *testing.T) {
	var c codeCounts
	codes := []int{200, 201, 204, 400, 404, 413, 499, 502, 503, 504}
	var wg sync.WaitGroup
	for i, code := range codes {
		for g := 0; g < 4; g++ {
			wg.Go(func() {
				for k := 0; k <= i; k++ {
					c.inc(code)
				}
			})
		}
	}
	wg.Wait()
	got := map[int]uint64{}
	c.each(func(code int, n uint64) { got[code] += n })
	for i, code := range codes {
		if want := uint64(4 * (i + 1)); got[code] != want {
			t.Errorf("code %d: %d, want %d", code, got[code], want)
		}
	}
	if len(got) != len(codes) {
		t.Errorf("codes %v, want exactly %v", got, codes)
	}
}

// Latencies land in the first bucket whose bound they do not exceed
// (Prometheus' "le"), and the sum is kept.
func TestLatencyHistoBuckets(t *testing.T) {
	var h latencyHisto
	h.observe(500_000)     // exactly 0.5 ms: le 0.0005
	h.observe(500_001)     // le 0.001
	h.observe(2_000_000)   // le 0.0025
	h.observe(1_000 * 1e9) // beyond 300 s: +Inf
	want := map[int]uint64{0: 1, 1: 1, 2: 1, nBuckets: 1}
	for i := range h.counts {
		if got := h.counts[i].Load(); got != want[i] {
			t.Errorf("bucket %d: %d, want %d", i, got, want[i])
		}
	}
	if got, want := h.sumNs.Load(), int64(500_000+500_001+2_000_000+1_000*1e9); got != want {
		t.Errorf("sum %d ns, want %d", got, want)
	}
}

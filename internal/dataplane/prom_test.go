package dataplane

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
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

// Each function's histogram is its own: scraping several functions gives
// each its own bucket counts.
func TestEachFunctionHasItsOwnHistogram(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("one"), fnSpec("three"), fnSpec("two")},
		Added:     []*briskv1.Endpoint{ep("one", "sb-1", addr), ep("three", "sb-3", addr), ep("two", "sb-2", addr)}})
	for fn, n := range map[string]int{"one": 1, "two": 2, "three": 3} {
		for i := 0; i < n; i++ {
			if r := get(t, srv.URL+"/function/"+fn); r.code != 200 {
				t.Fatalf("%s: %d", fn, r.code)
			}
		}
	}
	m := get(t, srv.URL+"/metrics").body
	for fn, n := range map[string]int{"one": 1, "two": 2, "three": 3} {
		for _, want := range []string{
			fmt.Sprintf(`brisk_dataplane_request_duration_seconds_bucket{function="%s",le="300"} %d`, fn, n),
			fmt.Sprintf(`brisk_dataplane_request_duration_seconds_count{function="%s"} %d`, fn, n),
			fmt.Sprintf(`brisk_dataplane_requests_total{code="200",function="%s"} %d`, fn, n),
		} {
			if !strings.Contains(m, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	}
}

package dataplane

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// A metric report carries the latencies observed since the last one, by
// bucket, without trailing empty buckets; concurrent cuts share the counts
// out, none reported twice or lost.
func TestLatencyCut(t *testing.T) {
	var h latencyHisto
	if got := h.cut(); got != nil {
		t.Fatalf("nothing observed: %v", got)
	}
	h.observe(int64(300 * time.Microsecond)) // bucket 0 (<= 0.5 ms)
	h.observe(int64(time.Millisecond))       // bucket 1 (<= 1 ms: bounds are inclusive)
	h.observe(int64(4 * time.Millisecond))   // bucket 3 (<= 5 ms)
	h.observe(int64(4 * time.Millisecond))
	if got, want := h.cut(), []uint64{1, 1, 0, 2}; !slices.Equal(got, want) {
		t.Fatalf("cut %v, want %v", got, want)
	}
	if got := h.cut(); got != nil {
		t.Fatalf("second cut %v, want nothing new", got)
	}
	h.observe(int64(time.Hour)) // the last, unbounded bucket
	if got := h.cut(); len(got) != nBuckets+1 || got[nBuckets] != 1 {
		t.Fatalf("cut %v, want one call in bucket %d", got, nBuckets)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var reported uint64
	const observers, each = 4, 5000
	for range observers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				h.observe(int64(i) * int64(time.Microsecond))
			}
		}()
	}
	stop := make(chan struct{})
	var cutters sync.WaitGroup
	for range 2 {
		cutters.Add(1)
		go func() {
			defer cutters.Done()
			for {
				var n uint64
				for _, c := range h.cut() {
					n += c
				}
				mu.Lock()
				reported += n
				mu.Unlock()
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	cutters.Wait()
	for _, c := range h.cut() {
		reported += c
	}
	if reported != observers*each {
		t.Fatalf("cuts reported %d calls, %d were observed", reported, observers*each)
	}
}

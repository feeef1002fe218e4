package loadbalance_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
)

// TestPickMatchesReference checks every policy, sequentially, on thousands of
// random endpoint sets against a plain reference: ok exactly when some
// endpoint has a free slot, the chosen one had a free slot, exactly one slot
// was taken and only there, and least-loaded's choice had the minimum
// in-flight among the endpoints with a free slot.
func TestPickMatchesReference(t *testing.T) {
	for name := range policies(0) {
		t.Run(name, func(t *testing.T) {
			gen := rand.New(rand.NewPCG(1, 2))
			p := policies(uint64(len(name)))[name]
			for iter := range 5000 {
				n := gen.IntN(12)
				caps, loads := make([]int, n), make([]int, n)
				for i := range caps {
					caps[i] = gen.IntN(4) // 0 = unlimited
					if caps[i] == 0 {
						loads[i] = gen.IntN(5)
					} else {
						loads[i] = gen.IntN(caps[i] + 1) // full with some probability
					}
				}
				eps := trackers(caps, loads)

				anyFree, minFree := false, 1<<30
				for _, t := range eps {
					if reservable(t) {
						anyFree = true
						minFree = min(minFree, t.InFlight())
					}
				}
				before := loadsOf(eps)
				idx, ok := p.Pick(eps)
				after := loadsOf(eps)

				if ok != anyFree {
					t.Fatalf("iter %d caps %v loads %v: ok = %v, want %v", iter, caps, loads, ok, anyFree)
				}
				for i := range after {
					want := before[i]
					if ok && i == idx {
						want++
					}
					if after[i] != want {
						t.Fatalf("iter %d caps %v loads %v: pick %d left loads %v", iter, caps, loads, idx, after)
					}
				}
				if !ok {
					continue
				}
				if caps[idx] != 0 && before[idx] >= caps[idx] {
					t.Fatalf("iter %d caps %v loads %v: picked full endpoint %d", iter, caps, loads, idx)
				}
				if name == loadbalance.NameLeastLoaded && before[idx] != minFree {
					t.Fatalf("iter %d caps %v loads %v: least-loaded picked %d (load %d), min free load is %d",
						iter, caps, loads, idx, before[idx], minFree)
				}
			}
		})
	}
}

// TestConcurrentPickNeverExceedsCapacity hammers capacity-1 endpoints from
// many goroutines (run it with -race). Each winner marks its endpoint as
// owned with a CAS that must succeed, so two holders of one slot are caught
// even between observations; an observer checks every counter throughout,
// and all counters must return to 0.
func TestConcurrentPickNeverExceedsCapacity(t *testing.T) {
	const goroutines, iterations = 16, 3000
	for _, endpoints := range []int{1, 4} {
		for name, p := range policies(11) {
			eps := trackers(make([]int, endpoints), make([]int, endpoints))
			for i := range eps {
				eps[i] = loadbalance.NewTracker(1)
			}
			owned := make([]atomic.Bool, endpoints)
			var picks, misses atomic.Int64
			var violation atomic.Pointer[string] // the first one found
			report := func(format string, args ...any) {
				msg := fmt.Sprintf(format, args...)
				violation.CompareAndSwap(nil, &msg)
			}

			stop := make(chan struct{})
			observed := make(chan struct{})
			go func() {
				defer close(observed)
				for {
					for i, tr := range eps {
						if n := tr.InFlight(); n < 0 || n > 1 {
							report("observer saw in-flight %d on endpoint %d of capacity 1", n, i)
						}
					}
					select {
					case <-stop:
						return
					default:
						runtime.Gosched()
					}
				}
			}()

			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for range iterations {
						idx, ok := p.Pick(eps)
						if !ok {
							misses.Add(1)
							runtime.Gosched()
							continue
						}
						picks.Add(1)
						if !owned[idx].CompareAndSwap(false, true) {
							report("two goroutines hold the single slot of endpoint %d", idx)
						}
						if n := eps[idx].InFlight(); n != 1 {
							report("holder of endpoint %d saw in-flight %d", idx, n)
						}
						runtime.Gosched() // hold the slot across a scheduling point
						owned[idx].Store(false)
						eps[idx].Release()
					}
				})
			}
			wg.Wait()
			close(stop)
			<-observed

			if v := violation.Load(); v != nil {
				t.Errorf("%s, %d endpoints: %s", name, endpoints, *v)
			}
			for i, tr := range eps {
				if tr.InFlight() != 0 {
					t.Errorf("%s, %d endpoints: endpoint %d ends with in-flight %d", name, endpoints, i, tr.InFlight())
				}
			}
			if picks.Load()+misses.Load() != goroutines*iterations || picks.Load() == 0 {
				t.Errorf("%s, %d endpoints: %d picks + %d misses, want %d with some picks",
					name, endpoints, picks.Load(), misses.Load(), goroutines*iterations)
			}
		}
	}
}

// TestNewRandConcurrent: concurrent callers must together draw exactly the
// values a single caller draws from the same seed, none lost or repeated.
func TestNewRandConcurrent(t *testing.T) {
	const goroutines, each = 8, 5000
	want := map[uint64]bool{}
	seq := loadbalance.NewRand(77)
	for range goroutines * each {
		want[seq()] = true
	}
	rnd := loadbalance.NewRand(77)
	results := make([][]uint64, goroutines)
	var wg sync.WaitGroup
	for g := range results {
		wg.Go(func() {
			for range each {
				results[g] = append(results[g], rnd())
			}
		})
	}
	wg.Wait()
	got := map[uint64]bool{}
	for _, r := range results {
		for _, v := range r {
			if got[v] || !want[v] {
				t.Fatalf("value %#x repeated or not in the sequential stream", v)
			}
			got[v] = true
		}
	}
	if len(got) != len(want) {
		t.Fatalf("concurrent draws gave %d distinct values, want %d", len(got), len(want))
	}
}

package sim

import (
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// With a load-balancing policy the simulator picks sandboxes as the data
// plane does (policy/loadbalance): with 8 calls in flight at a time on
// sandboxes of concurrency 4, first-available packs them onto the first
// sandboxes while least-loaded spreads them over all; every call
// completes either way. The default ("") is the data plane's default,
// least-loaded.
func TestLoadBalancingPolicies(t *testing.T) {
	// 400 calls of 400 ms, 50 ms apart: 8 in flight.
	sched := func() *workload.Schedule { return schedule(400, 50*time.Millisecond, 400) }
	shares := map[string][]int{}
	for _, lb := range []string{"", "least-loaded", "first-available", "round-robin", "power-of-two", "random", "knative"} {
		res, err := Run(sched(), Config{Nodes: 4, Seed: 1, Concurrency: 4, LoadBalancing: lb, StableWindow: 6 * time.Second})
		if err != nil {
			t.Fatalf("%q: %v", lb, err)
		}
		if len(res.Records) != 400 {
			t.Fatalf("%q: %d calls completed, want 400", lb, len(res.Records))
		}
		per := map[string]int{}
		for _, r := range res.Records {
			per[r.Instance]++
		}
		var counts []int
		for _, n := range per {
			counts = append(counts, n)
		}
		slices.Sort(counts)
		shares[lb] = counts
	}
	maxShare := func(lb string) int { return slices.Max(shares[lb]) }
	if len(shares["least-loaded"]) < 2 {
		t.Fatalf("least-loaded used sandboxes %v; want the load spread", shares["least-loaded"])
	}
	if maxShare("first-available") <= maxShare("least-loaded") {
		t.Fatalf("first-available's busiest sandbox took %d calls, least-loaded's %d: first-available should pack (%v vs %v)",
			maxShare("first-available"), maxShare("least-loaded"), shares["first-available"], shares["least-loaded"])
	}
}

package sim

import (
	"testing"
	"time"
)

// --lb's names map to the run they describe: a locality balancer is the
// placement (the data plane balancing least-loaded), a data-plane policy
// keeps the placement, p2c is power-of-two; anything else is refused.
func TestSetBalancer(t *testing.T) {
	for _, tc := range []struct{ name, placement, lb string }{
		{"ch-rlu", "ch-rlu", "least-loaded"},
		{"sharding", "sharding", "least-loaded"},
		{"p2c", "kubernetes", "power-of-two"},
		{"first-available", "kubernetes", "first-available"},
	} {
		cfg := Config{Placement: "kubernetes"}
		if err := SetBalancer(&cfg, tc.name); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if cfg.Placement != tc.placement || cfg.LoadBalancing != tc.lb {
			t.Errorf("%s: placement %q, load balancing %q; want %q, %q", tc.name, cfg.Placement, cfg.LoadBalancing, tc.placement, tc.lb)
		}
	}
	if _, err := ParseBalancers("least-loaded,ch-bl,nope"); err == nil {
		t.Error("an unknown balancer was accepted")
	}
	if got, err := ParseBalancers("least-loaded,ch-bl,p2c"); err != nil || len(got) != 3 {
		t.Errorf("ParseBalancers: %v, %v", got, err)
	}
}

// A locality balancer given as --lb runs that placement: on a small
// cluster, CH-RLU (which keeps a function on its few hashed nodes) puts
// sandboxes on fewer nodes than least-loaded over Kubernetes-style spread.
func TestLocalityBalancerIsThePlacement(t *testing.T) {
	nodesUsed := func(name string) int {
		cfg := Config{Nodes: 8, Seed: 1, Concurrency: 4, Placement: "kubernetes", StableWindow: 6 * time.Second}
		if err := SetBalancer(&cfg, name); err != nil {
			t.Fatal(err)
		}
		res, err := Run(schedule(400, 50*time.Millisecond, 400), cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(res.Records) != 400 {
			t.Fatalf("%s: %d calls completed, want 400", name, len(res.Records))
		}
		used := 0
		for _, b := range res.NodeBusy {
			if b > 0 {
				used++
			}
		}
		return used
	}
	spread, hashed := nodesUsed("least-loaded"), nodesUsed("ch-rlu")
	if hashed >= spread {
		t.Errorf("ch-rlu used %d nodes, least-loaded over kubernetes %d: want fewer", hashed, spread)
	}
}

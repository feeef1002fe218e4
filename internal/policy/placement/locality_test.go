package placement_test

import (
	"fmt"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

func hints(ls ...placement.Locality) func(int) placement.Locality {
	return func(i int) placement.Locality { return ls[i] }
}

func TestLocalityRanksClassesFirst(t *testing.T) {
	const (
		none  = placement.LocalityNone
		image = placement.LocalityImage
		warm  = placement.LocalityWarm
	)
	req := res{MilliCPU: 500, MemoryMB: 512}
	// Node 0 is the kubernetes favourite (empty), 1 is half full, 2 nearly
	// full, 3 too full to take the sandbox.
	nodes := []placement.Node{node(0, 0), node(2000, 2048), node(3000, 3072), node(3800, 3800)}
	tests := []struct {
		label string
		loc   func(int) placement.Locality
		want  int
	}{
		{"warm beats image and an emptier node", hints(none, image, warm, none), 2},
		{"image beats none", hints(none, image, none, none), 1},
		{"out-of-range hints count as warm", hints(none, image, placement.LocalityWarm+5, none), 2},
		{"an infeasible warm node is never chosen", hints(none, image, none, warm), 1},
		{"within a class the kubernetes score decides", hints(warm, warm, warm, warm), 0},
		{"within the image class too", hints(none, image, image, none), 1},
		{"all none: kubernetes", hints(none, none, none, none), 0},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			for seed := range uint64(10) {
				got, err := placement.NewLocality(seeded(seed)).Place(nodes, placement.Request{Resources: req, Locality: tt.loc})
				if err != nil || got != tt.want {
					t.Fatalf("seed %d: Place = %d, %v; want %d", seed, got, err, tt.want)
				}
			}
		})
	}
}

// Ties within the best class are broken uniformly, like kube's.
func TestLocalityBreaksTiesAtRandom(t *testing.T) {
	nodes := []placement.Node{node(0, 0), node(0, 0), node(0, 0), node(0, 0)}
	loc := hints(placement.LocalityWarm, placement.LocalityNone, placement.LocalityWarm, placement.LocalityWarm)
	p := placement.NewLocality(seeded(4))
	count := make(map[int]int)
	for range 600 {
		got, err := p.Place(nodes, placement.Request{Resources: res{MilliCPU: 100, MemoryMB: 100}, Locality: loc})
		if err != nil {
			t.Fatal(err)
		}
		count[got]++
	}
	for _, i := range []int{0, 2, 3} {
		if c := count[i]; c < 100 || c > 300 {
			t.Errorf("warm node %d chosen %d times of 600, want about 200 (%v)", i, c, count)
		}
	}
	if count[1] != 0 {
		t.Errorf("the cold node was chosen %d times", count[1])
	}
}

// With Locality nil the policy is the kubernetes policy: same seed, same
// calls, same choices, sampling of large clusters included.
func TestLocalityWithoutHintsIsKubernetes(t *testing.T) {
	gen := seeded(11)
	for _, n := range []int{1, 30, 99, 100, 700} {
		nodes := randomCluster(gen, n)
		a, b := placement.NewLocality(seeded(5)), placement.NewKubernetes(seeded(5))
		for call := range 200 {
			req := placement.Request{Resources: randomRequest(gen), Key: fmt.Sprint(call)}
			x, errX := a.Place(nodes, req)
			y, errY := b.Place(nodes, req)
			if x != y || (errX == nil) != (errY == nil) {
				t.Fatalf("n=%d call %d: locality = %d, %v; kubernetes = %d, %v", n, call, x, errX, y, errY)
			}
			if x >= 0 {
				nodes[x].Requested.MilliCPU += req.MilliCPU
				nodes[x].Requested.MemoryMB += req.MemoryMB
				nodes[x].Sandboxes++
			}
		}
	}
}

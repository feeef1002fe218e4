package reconciler

import (
	"testing"
	"time"
)

// TestLoadIsSummedOverFreshDataPlanes: each data plane's latest report
// counts once, a data plane that stopped reporting drops out after
// loadStaleAfter, and a function nobody reports on is not sampled.
func TestLoadIsSummedOverFreshDataPlanes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	fs := &fnState{}
	if _, ok := fs.sumLoad(t0); ok {
		t.Fatal("a function without reports was sampled")
	}
	fs.setLoad("dp-a", 2, 0, t0)
	fs.setLoad("dp-b", 3, 0, t0)
	fs.setLoad("dp-a", 4, 0, t0.Add(time.Second)) // replaces dp-a's 2
	if sum, ok := fs.sumLoad(t0.Add(time.Second)); !ok || sum != 7 {
		t.Fatalf("sum %v %v, want 7", sum, ok)
	}
	fs.setLoad("dp-a", 1, 0, t0.Add(3*time.Second))
	if sum, ok := fs.sumLoad(t0.Add(3 * time.Second)); !ok || sum != 1 || len(fs.dpLoad) != 1 || fs.dpLoad[0].dataPlane != "dp-a" {
		t.Fatalf("after dp-b went stale: sum %v %v, reports %+v", sum, ok, fs.dpLoad)
	}
	// Once every report is stale the level drops to 0 once, then the
	// function is no longer sampled.
	if sum, ok := fs.sumLoad(t0.Add(10 * time.Second)); !ok || sum != 0 || fs.dpLoad != nil {
		t.Fatalf("all stale: sum %v %v, reports %+v", sum, ok, fs.dpLoad)
	}
	if _, ok := fs.sumLoad(t0.Add(11 * time.Second)); ok {
		t.Fatal("sampled again with no reports")
	}
}

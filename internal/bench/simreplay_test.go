//go:build !race

// The race detector multiplies the real system's per-call cost and would
// turn this comparison into a measure of it: `make test` runs this file
// without it (`make fidelity`).

package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/sim"
	"github.com/brisk-faas/brisk/internal/workload"
)

// TestSimAgreesWithReplay validates the simulator against the real system:
// the same trace window replayed on a local cluster of 20 emulated workers
// and simulated on 20 nodes of the same size and sandbox creation time must
// agree within 10% on cold starts, sandboxes created and the median
// per-function slowdown. Both run the reconciler's code; what differs is
// everything around it (gRPC, the data plane, the workers, the wall clock).
func TestSimAgreesWithReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster and replays a minute of trace")
	}
	const workers, createDelay = 20, 40 * time.Millisecond
	cfg := ReplayConfig{TraceDir: moduleRoot(t) + "/traces/azure_500", Minutes: 2, Warmup: 1, TimeScale: 0.25, Seed: 42,
		IAT: "exponential", Granularity: "minute", MaxRuntime: 2 * time.Second, SkipMinutes: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := Open(ctx, ClusterOptions{Local: true, Runtime: "emulated", Workers: workers, CreateDelay: createDelay})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := t.TempDir()
	real, _, err := Replay(ctx, c, Options{Out: out, Lateness: loadgen.Lateness{Late: time.Second, MaxFraction: 1}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The simulator's calibrated inputs are the real system's costs as this
	// run measured them (Calibrate): each call's time beyond its runtime
	// and its wait for a sandbox (loopback HTTP, the data plane, the
	// emulated function's timer slack), drawn from the calls sent at about
	// the same time, since a minute's first moment (hundreds of calls and
	// sandbox creations at once on two cores) costs every call then more;
	// and the measured cold calls' median wait for their sandbox as the
	// creation time. What the simulator decides itself is which calls are
	// cold and how many sandboxes live when.
	f, err := os.Open(filepath.Join(out, "invocations.csv"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadRecords(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	cal, err := Calibrate(cfg, recs)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(cal)
	if cal.ColdCalls == 0 {
		t.Fatal("no cold calls in the measured phase")
	}
	coldStart := max(createDelay, cal.ColdWait)
	// The emulated workers' nodes: 1,000 cores and 4 TiB, calls that sleep.
	simd, _, err := Sim(cfg, sim.Config{Nodes: workers, NodeCores: emulatedNodeMilliCPU / 1000, NodeMemMB: emulatedNodeMemoryMB,
		ColdStart: coldStart, CachedColdStart: coldStart, Overhead: cal.Overhead, Seed: cfg.Seed}, "")
	if err != nil {
		t.Fatal(err)
	}
	if real.Completed != real.Requested || simd.Completed != simd.Requested || real.Requested != simd.Requested {
		t.Fatalf("completed: replay %d, sim %d, of %d requested", real.Completed, simd.Completed, real.Requested)
	}
	median := func(s *ReplaySummary) float64 {
		if s.Slowdown.DirigentGmeanMedian == nil {
			t.Fatalf("%s: no median slowdown: %+v", s.Command, s.Slowdown)
		}
		return *s.Slowdown.DirigentGmeanMedian
	}
	for _, m := range []struct {
		what       string
		real, simd float64
	}{
		{"cold starts", float64(real.ColdStartsAll), float64(simd.ColdStartsAll)},
		{"sandboxes created", float64(real.SandboxesCreated), float64(simd.SandboxesCreated)},
		{"median per-function slowdown", median(real), median(&simd.ReplaySummary)},
	} {
		t.Logf("%s: replay %.3f, sim %.3f", m.what, m.real, m.simd)
		if m.real <= 0 || math.Abs(m.simd-m.real) > 0.1*m.real {
			t.Errorf("%s: sim %.3f is not within 10%% of replay's %.3f", m.what, m.simd, m.real)
		}
	}
}

package sim

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// schedule is n calls of one function every gap, each runtime long.
func schedule(n int, gap time.Duration, runtime int32) *workload.Schedule {
	s := &workload.Schedule{Functions: []workload.Function{{Row: 0, Invocations: []int{n}}}, Columns: 1,
		Granularity: workload.Granularity(0)}
	for i := range n {
		s.Invocations = append(s.Invocations, workload.Invocation{Offset: time.Duration(i) * gap, Index: int32(i), RuntimeMs: runtime, MemoryMB: 128})
	}
	return s
}

// Every call completes; the first is cold (it waited for a sandbox) and
// calls spaced wider than a runtime reuse the warm sandbox.
func TestRunCompletesAndReusesWarmSandboxes(t *testing.T) {
	res, err := Run(schedule(50, time.Second, 100), Config{Nodes: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 50 {
		t.Fatalf("%d records, want 50", len(res.Records))
	}
	cold := 0
	for _, r := range res.Records {
		if r.Cold {
			cold++
		}
		if r.ResponseUs < r.RequestedUs {
			t.Fatalf("a call answered in %d µs, faster than its %d µs runtime", r.ResponseUs, r.RequestedUs)
		}
	}
	if cold != 1 || res.SandboxesCreated != 1 {
		t.Fatalf("%d cold calls, %d sandboxes; want 1 and 1", cold, res.SandboxesCreated)
	}
}

// Processor sharing: 32 simultaneous 1 s calls on one 16-core node take
// about 2 s each, on two nodes about 1 s.
func TestProcessorSharingSlowsLoadedNodes(t *testing.T) {
	burst := func(nodes int) float64 {
		s := schedule(32, 0, 1000)
		res, err := Run(s, Config{Nodes: nodes, NodeCores: 16, Seed: 1, Placement: "bin-packing"})
		if err != nil {
			t.Fatal(err)
		}
		var exec float64
		for _, r := range res.Records {
			exec += float64(r.ActualUs)
		}
		return exec / float64(len(res.Records)) / 1e6
	}
	one := burst(1)
	if one < 1.9 || one > 2.1 {
		t.Fatalf("mean execution on one 16-core node %.3f s, want ~2 s", one)
	}
}

// The same schedule and seed give the same run.
func TestDeterministic(t *testing.T) {
	s := schedule(300, 37*time.Millisecond, 250)
	a, _ := Run(s, Config{Nodes: 10, Seed: 7, Placement: "ch-rlu"})
	b, _ := Run(s, Config{Nodes: 10, Seed: 7, Placement: "ch-rlu"})
	if len(a.Records) != len(b.Records) || a.SandboxesCreated != b.SandboxesCreated || a.Events != b.Events {
		t.Fatalf("runs differ: %d/%d records, %d/%d sandboxes, %d/%d events", len(a.Records), len(b.Records),
			a.SandboxesCreated, b.SandboxesCreated, a.Events, b.Events)
	}
	for i := range a.Records {
		if a.Records[i] != b.Records[i] {
			t.Fatalf("record %d differs: %+v vs %+v", i, a.Records[i], b.Records[i])
		}
	}
}

// A function no node has room for: its calls fail after the queue timeout
// with the data plane's 504, and the run ends.
func TestNoRoomTimesOut(t *testing.T) {
	res, err := Run(schedule(5, time.Second, 100), Config{Nodes: 2, NodeMilliCP: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 5 || res.SandboxesCreated != 0 {
		t.Fatalf("%d records, %d sandboxes; want 5 and 0", len(res.Records), res.SandboxesCreated)
	}
	for _, r := range res.Records {
		if r.Status != 504 || r.OK() || r.ResponseUs != 30_000_000 {
			t.Fatalf("record %+v, want a 504 after the 30 s queue timeout", r)
		}
	}
}

// The dual track: a sporadic function (calls farther apart than its
// keep-alive) is served by one-shot emergency sandboxes alone — fast, and
// the metric filter keeps them from the autoscaler — while a frequent one's emergency calls count, so it scales
// regular sandboxes and later calls are warm.
func TestDualTrack(t *testing.T) {
	cfg := Config{Nodes: 2, Seed: 1, ScalingMode: "dual", ColdStart: 500 * time.Millisecond, StableWindow: 6 * time.Second,
		KeepAlivePolicy: "ttl"}
	// Sporadic: 10 calls 2 minutes apart, keep-alive 6 s + 30 s grace.
	res, err := Run(schedule(10, 2*time.Minute, 100), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The first call, with no inter-arrival history, counts (the data
	// plane's rule) and makes one regular sandbox; no later one does.
	if res.EmergencyCalls != 10 || res.SandboxesCreated != 1 || len(res.Records) != 10 {
		t.Fatalf("sporadic: %d emergency calls, %d regular sandboxes, %d records; want 10, 1, 10", res.EmergencyCalls, res.SandboxesCreated, len(res.Records))
	}
	for _, r := range res.Records {
		// 100 ms of work, 10 ms emergency start: no 500 ms regular start.
		if r.Status != 200 || !r.Cold || r.ResponseUs < 110_000 || r.ResponseUs > 111_000 || r.Sandbox[:3] != "ei-" {
			t.Fatalf("sporadic call %+v: want an emergency sandbox's 110 ms", r)
		}
	}
	// Frequent: 200 calls 100 ms apart. The first find no sandbox and go
	// emergency; with no history they count, the autoscaler adds a regular
	// sandbox, and the calls after it are warm.
	res, err = Run(schedule(200, 100*time.Millisecond, 50), cfg)
	if err != nil {
		t.Fatal(err)
	}
	warm := 0
	for _, r := range res.Records {
		if !r.Cold {
			warm++
		}
	}
	if res.SandboxesCreated < 1 || res.EmergencyCalls < 1 || res.EmergencyCalls > 40 || warm < 150 {
		t.Fatalf("frequent: %d regular sandboxes, %d emergency calls, %d warm of 200", res.SandboxesCreated, res.EmergencyCalls, warm)
	}
	// No emergency slots: dual is async.
	cfg.EmergencySlots = -1
	if res, _ := Run(schedule(10, 2*time.Minute, 100), cfg); res.EmergencyCalls != 0 || res.SandboxesCreated == 0 {
		t.Fatalf("without slots: %d emergency calls, %d regular sandboxes", res.EmergencyCalls, res.SandboxesCreated)
	}
}

// TestOverheadProfileDraw: a call draws from its own window, and from the
// nearest non-empty one when its own is empty or past the profile's end.
func TestOverheadProfileDraw(t *testing.T) {
	p := &OverheadProfile{Window: 100 * time.Millisecond, Windows: [][]time.Duration{{time.Millisecond}, nil, nil, {7 * time.Millisecond}, nil}}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		at   time.Duration
		want time.Duration
	}{{50 * time.Millisecond, time.Millisecond}, {150 * time.Millisecond, time.Millisecond}, {250 * time.Millisecond, 7 * time.Millisecond},
		{350 * time.Millisecond, 7 * time.Millisecond}, {450 * time.Millisecond, 7 * time.Millisecond}, {time.Hour, 7 * time.Millisecond}} {
		if got := p.draw(int64(c.at), rng, p.nearest()); got != int64(c.want) {
			t.Errorf("at %s: drew %s, want %s", c.at, time.Duration(got), c.want)
		}
	}
	if got := (&OverheadProfile{Window: time.Second, Windows: make([][]time.Duration, 3)}).nearest(); got[0] != -1 || got[2] != -1 {
		t.Errorf("an empty profile's nearest windows: %v, want none", got)
	}
}

// A closed Stop ends a run (an interrupted `brisk sim` stops instead of
// running on in the background).
func TestStopEndsTheRun(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	res, err := Run(schedule(100_000, time.Millisecond, 1), Config{Nodes: 4, Seed: 1, Stop: stop})
	if !errors.Is(err, ErrStopped) || res != nil {
		t.Fatalf("Run: %v, %v; want ErrStopped", res, err)
	}
}

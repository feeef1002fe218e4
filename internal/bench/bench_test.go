package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
)

func TestMetricValues(t *testing.T) {
	body := []byte(`# HELP brisk_dataplane_inflight Requests holding a sandbox slot.
# TYPE brisk_dataplane_inflight gauge
brisk_dataplane_inflight{function="a"} 2
brisk_dataplane_inflight{function="b",zone="x"} 1
brisk_dataplane_inflight_other{function="a"} 9
brisk_controlplane_sandbox_creations_total 713
brisk_controlplane_sandbox_ready_seconds_sum 1.5
brisk_controlplane_sandbox_ready_seconds_count 3
`)
	in := metricValues(body, "brisk_dataplane_inflight", "function")
	if len(in) != 2 || in["a"] != 2 || in["b"] != 1 {
		t.Fatalf("inflight %v", in)
	}
	if v := metricValues(body, "brisk_controlplane_sandbox_creations_total", "")[""]; v != 713 {
		t.Fatalf("creations %v", v)
	}
	if v := metricValues(body, "brisk_controlplane_sandbox_ready_seconds_count", "")[""]; v != 3 {
		t.Fatalf("histogram count %v", v)
	}
}

func TestConstantRate(t *testing.T) {
	calls := constantRate([]string{"a", "b"}, 100, 100*time.Millisecond, time.Second, 5)
	if len(calls) != 110 {
		t.Fatalf("%d calls, want 10 warm-up + 100", len(calls))
	}
	for i, c := range calls {
		if want := time.Duration(i) * 10 * time.Millisecond; c.Offset != want || c.RuntimeMs != 5 || c.Function != []string{"a", "b"}[i%2] {
			t.Fatalf("call %d: %+v", i, c)
		}
		if (c.Phase == 1) != (i < 10) {
			t.Fatalf("call %d in phase %d", i, c.Phase)
		}
	}
}

// TestBenchmarksOnALocalCluster runs each benchmark at a tiny size against
// one emulated local cluster and checks what they count, not how fast.
func TestBenchmarksOnALocalCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Open(ctx, ClusterOptions{Local: true, Runtime: "emulated", Workers: 4, CreateDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The race detector on a shared 2-core host makes any generator late;
	// these tests check counts, so lateness may not refuse a run.
	opts := func(t *testing.T) Options {
		return Options{Out: t.TempDir(), Lateness: loadgen.Lateness{Late: time.Second, MaxFraction: 1}}
	}

	t.Run("cold", func(t *testing.T) {
		o := opts(t)
		s, _, err := Cold(ctx, c, o, ColdConfig{Rate: 20, Duration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if s.Issued != 18 || s.WarmupIssued != 2 || s.Completed != 18 || s.ColdStarts != 18 || s.SandboxesCreated != 20 {
			t.Fatalf("cold: %+v", s)
		}
		checkFiles(t, o.Out, "summary.json", "invocations.csv", "latency_cdf.png")
	})
	t.Run("register", func(t *testing.T) {
		o := opts(t)
		s, _, err := Register(ctx, c, o, RegisterConfig{Functions: 20, Invocable: 10})
		if err != nil {
			t.Fatal(err)
		}
		if s.Completed != 20 || s.Failed != 0 || s.ThroughputRPS <= 0 || s.Invocable == nil || s.Invocable.Failed != 0 || s.Invocable.AllInvocableS <= 0 {
			t.Fatalf("register: %+v %+v", s, s.Invocable)
		}
		checkFiles(t, o.Out, "summary.json", "registrations.csv", "latency_cdf.png")
	})
	t.Run("scale", func(t *testing.T) {
		o := opts(t)
		s, _, err := Scale(ctx, c, o, ScaleConfig{Functions: 3, Sandboxes: 10})
		if err != nil {
			t.Fatal(err)
		}
		if s.Ready != 10 || s.TimedOut || s.Workers != 4 || s.ReadyS.Max <= 0 || s.SandboxesCreated < 10 || s.Method != "endpoint stream" {
			t.Fatalf("scale: %+v", s)
		}
		checkFiles(t, o.Out, "summary.json", "ready.csv", "ready_cdf.png")
	})
	t.Run("scale by polling", func(t *testing.T) {
		o := opts(t)
		remote := *c
		remote.GRPC = "" // as for a cluster whose gRPC address is not given
		s, _, err := Scale(ctx, &remote, o, ScaleConfig{Functions: 2, Sandboxes: 6})
		if err != nil {
			t.Fatal(err)
		}
		if s.Ready != 6 || s.Method != "metrics polling" || s.PollIntervalMs <= 0 {
			t.Fatalf("scale by polling: %+v", s)
		}
	})
	t.Run("warm", func(t *testing.T) {
		o := opts(t)
		s, _, err := Warm(ctx, c, o, WarmConfig{Rate: 100, Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Functions: 2, CompareDirect: true})
		if err != nil {
			t.Fatal(err)
		}
		if s.Issued != 50 || s.Completed != 50 || s.Direct == nil || s.Direct.Completed != 50 || s.Compare == nil || s.ColdStarts != 0 {
			t.Fatalf("warm: %+v", s)
		}
		checkFiles(t, o.Out, "summary.json", "invocations.csv", "direct.csv", "latency_cdf.png")
	})
	t.Run("warm closed-loop in rounds", func(t *testing.T) {
		o := opts(t)
		s, _, err := Warm(ctx, c, o, WarmConfig{Closed: 3, Rounds: 2, Duration: 400 * time.Millisecond, Warmup: 50 * time.Millisecond, CompareDirect: true})
		if err != nil {
			t.Fatal(err)
		}
		d := s.Direct
		if s.Completed == 0 || s.Failed != 0 || d == nil || d.Completed == 0 || d.Failed != 0 || !s.Valid || !d.Valid {
			t.Fatalf("warm closed: %+v / %+v", s.Summary, d)
		}
		// Each side's throughput is over its own two slices, not the span
		// of the whole run (which includes the other side's turns).
		if s.Compare == nil || s.Compare.ThroughputRatio <= 0 || s.ThroughputRPS < float64(s.Completed)/0.4*0.9 {
			t.Fatalf("throughput %.0f/s for %d calls in 2 slices of 200ms; compare %+v", s.ThroughputRPS, s.Completed, s.Compare)
		}
		if s.Config.Closed != 3 || s.Config.Rounds != 2 || s.CPUPerCallUs <= 0 || d.CPUPerCallUs <= 0 {
			t.Fatalf("config %+v, cpu %.1f / %.1f", s.Config, s.CPUPerCallUs, d.CPUPerCallUs)
		}
	})
	t.Run("replay", func(t *testing.T) {
		dir := filepath.Join(moduleRoot(t), "traces", "azure_100")
		o := opts(t)
		cfg := ReplayConfig{TraceDir: dir, Minutes: 1, Warmup: 1, TimeScale: 0.02, Seed: 42, IAT: "exponential", Granularity: "minute",
			Functions: 5, MaxRuntime: 100 * time.Millisecond, SkipMinutes: -1}
		s, _, err := Replay(ctx, c, o, cfg)
		if err != nil {
			t.Fatal(err)
		}
		sched, err := cfg.Schedule()
		if err != nil {
			t.Fatal(err)
		}
		if s.Requested != sched.ColumnCounts()[1] || s.Issued != s.Requested || s.Completed != s.Issued || s.WarmupIssued != sched.ColumnCounts()[0] {
			t.Fatalf("replay counts: requested %d issued %d completed %d warm-up %d; schedule %v", s.Requested, s.Issued, s.Completed, s.WarmupIssued, sched.ColumnCounts())
		}
		if s.Slowdown.GeomeanP99 < 1 || s.Slowdown.DirigentGmeanMedian == nil || s.SandboxesCreated < 1 || s.ColdStartsAll < 1 || s.MemoryCost.Samples < 1 {
			t.Fatalf("replay metrics: %+v", s)
		}
		checkFiles(t, o.Out, "summary.json", "invocations.csv", "schedule.csv", "latency_cdf.png", "slowdown_cdf.png", "scheduling_latency_cdf.png")
		data, _ := os.ReadFile(filepath.Join(o.Out, "summary.json"))
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"issued", "completed", "failed", "throughput_rps", "latency_ms", "slowdown", "scheduling_latency_ms", "cold_starts", "sandboxes_created", "memory_cost"} {
			if _, ok := m[k]; !ok {
				t.Errorf("summary.json has no %q", k)
			}
		}
		recs, err := workload.ReadRecords(strings.NewReader(string(must(os.ReadFile(filepath.Join(o.Out, "invocations.csv"))))))
		if err != nil || len(recs) != len(sched.Invocations) {
			t.Fatalf("invocations.csv: %d rows (%v), want %d", len(recs), err, len(sched.Invocations))
		}
	})
	// With a sandbox memory floor (real runtimes) every call's memory is at
	// most a quarter of its function's request.
	t.Run("replay with a sandbox memory floor", func(t *testing.T) {
		dir := filepath.Join(moduleRoot(t), "traces", "azure_100")
		o := opts(t)
		cfg := ReplayConfig{TraceDir: dir, Minutes: 1, TimeScale: 0.02, Seed: 42, IAT: "exponential", Granularity: "minute",
			Functions: 5, MaxRuntime: 10 * time.Millisecond, SkipMinutes: -1, MinSandboxMemoryMB: 64}
		s, _, err := Replay(ctx, c, o, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if s.Config.MinSandboxMiB != 64 || s.Failed != 0 {
			t.Fatalf("summary: failed %d, config %+v", s.Failed, s.Config)
		}
		recs, err := workload.ReadRecords(strings.NewReader(string(must(os.ReadFile(filepath.Join(o.Out, "invocations.csv"))))))
		if err != nil || len(recs) == 0 {
			t.Fatalf("invocations.csv: %d rows (%v)", len(recs), err)
		}
		most := 0
		for _, r := range recs {
			most = max(most, r.MemoryMB)
		}
		if most == 0 || most > 16 {
			t.Errorf("largest call memory %d MiB, want within (0, 16] (a quarter of 64)", most)
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func checkFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		if st, err := os.Stat(filepath.Join(dir, n)); err != nil || st.Size() == 0 {
			t.Errorf("output %s: %v", n, err)
		}
	}
}

func moduleRoot(t *testing.T) string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = filepath.Dir(dir)
	}
}

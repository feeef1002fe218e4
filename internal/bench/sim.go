package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/sim"
	"github.com/brisk-faas/brisk/internal/workload"
)

// SimSummary is summary.json of brisk sim: replay's summary, with the
// simulated cluster and what the run cost.
type SimSummary struct {
	ReplaySummary
	Sim struct {
		Nodes       int     `json:"nodes"`
		NodeCores   float64 `json:"node_cores"`
		Placement   string  `json:"placement"`
		ColdStartMs float64 `json:"cold_start_ms"`
		CachedMs    float64 `json:"cached_cold_start_ms"`
		Events      int64   `json:"events"`
		WallSeconds float64 `json:"wall_seconds"`
		// LoadCV is the coefficient of variation of the nodes' busy
		// core-seconds: how evenly the policy spread the work.
		LoadCV float64 `json:"load_cv"`
		// HeapMiB is the Go heap in use at the end of the run.
		HeapMiB float64 `json:"heap_mib"`
	} `json:"sim"`
}

// Sim simulates cfg's schedule on the cluster sc describes and writes the
// same outputs as Replay to out.
func Sim(cfg ReplayConfig, sc sim.Config, out string) (*SimSummary, string, error) {
	o, _, text, err := simRun(cfg, sc, out)
	return o, text, err
}

// SimCompare simulates cfg once per placement policy: each run's outputs
// go to out/<policy>/, and out gets slowdown_cdf.png (each policy's
// per-function p99 slowdown) and compare.md (a table of the runs).
func SimCompare(cfg ReplayConfig, sc sim.Config, placements []string, out string) (string, error) {
	return SimCompareBy(cfg, sc, "placement", placements, out)
}

// SimCompareBy is SimCompare along axis: "placement" (sim.Config.Placement)
// "load-balancing" (sim.Config.LoadBalancing) or "lb" (sim.SetBalancer: a
// data-plane policy or a locality balancer), one run per value.
func SimCompareBy(cfg ReplayConfig, sc sim.Config, axis string, values []string, out string) (string, error) {
	var b strings.Builder
	b.WriteString("| " + axis + " | slowdown gmean p99 | Dirigent median | cold starts (measured) | sandboxes created | peak | load CV | memory GiB·s | wall s |\n|---|---|---|---|---|---|---|---|---|\n")
	var series []loadgen.Series
	base := sc
	for _, p := range values {
		sc := base
		switch axis {
		case "placement":
			sc.Placement = p
		case "load-balancing":
			sc.LoadBalancing = p
		case "lb":
			if err := sim.SetBalancer(&sc, p); err != nil {
				return "", err
			}
		default:
			return "", fmt.Errorf("compare along %q: want placement, load-balancing or lb", axis)
		}
		dir := ""
		if out != "" {
			dir = filepath.Join(out, p)
		}
		o, pf, _, err := simRun(cfg, sc, dir)
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", axis, p, err)
		}
		dm := "–" // no calls after the skipped minutes
		if o.Slowdown.DirigentGmeanMedian != nil {
			dm = fmt.Sprintf("%.3f", *o.Slowdown.DirigentGmeanMedian)
		}
		fmt.Fprintf(&b, "| %s | %.3f | %s | %d | %d | %d | %.2f | %.0f | %.1f |\n", p, o.Slowdown.GeomeanP99, dm,
			o.ColdStarts, o.SandboxesCreated, o.PeakSandboxes, o.Sim.LoadCV, o.MemoryCost.GBs, o.Sim.WallSeconds)
		series = append(series, loadgen.Series{Name: p, Values: pf.P99})
	}
	if out == "" {
		return b.String(), nil
	}
	if err := os.WriteFile(filepath.Join(out, "compare.md"), []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	title := fmt.Sprintf("per-function p99 slowdown, %d nodes", sc.Nodes)
	return b.String(), loadgen.PlotCDF(filepath.Join(out, "slowdown_cdf.png"), title, "slowdown (response / requested)", true, series...)
}

// KeepAlive is one keep-alive setting SimKeepAlives compares.
type KeepAlive struct {
	Name   string // as given: ttl, gd:15m, hybrid
	Policy string
	Value  time.Duration
}

// SimKeepAlives simulates cfg once per keep-alive setting: each run's
// outputs go to out/<setting>/, and out gets keepalive.md (a table of the
// runs) and keepalive.png (measured cold starts against memory, a point
// per setting).
func SimKeepAlives(cfg ReplayConfig, sc sim.Config, kas []KeepAlive, out string) (string, error) {
	var b strings.Builder
	b.WriteString("| keep-alive | cold starts (measured) | slowdown gmean p99 | Dirigent median | sandboxes created | peak | memory GiB·s | idle % |\n|---|---|---|---|---|---|---|---|\n")
	var series []loadgen.XYSeries
	for _, ka := range kas {
		sc.KeepAlivePolicy, sc.KeepAlive = ka.Policy, ka.Value
		dir := ""
		if out != "" {
			dir = filepath.Join(out, strings.ReplaceAll(ka.Name, ":", "-"))
		}
		o, _, _, err := simRun(cfg, sc, dir)
		if err != nil {
			return "", fmt.Errorf("keep-alive %s: %w", ka.Name, err)
		}
		dm := "–"
		if o.Slowdown.DirigentGmeanMedian != nil {
			dm = fmt.Sprintf("%.3f", *o.Slowdown.DirigentGmeanMedian)
		}
		fmt.Fprintf(&b, "| %s | %d | %.3f | %s | %d | %d | %.0f | %.0f |\n", ka.Name, o.ColdStarts, o.Slowdown.GeomeanP99, dm,
			o.SandboxesCreated, o.PeakSandboxes, o.MemoryCost.GBs, 100*o.MemoryCost.IdleShare)
		series = append(series, loadgen.XYSeries{Name: ka.Name, X: []float64{o.MemoryCost.GBs}, Y: []float64{float64(o.ColdStarts)}})
	}
	if out == "" {
		return b.String(), nil
	}
	if err := os.WriteFile(filepath.Join(out, "keepalive.md"), []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	title := fmt.Sprintf("keep-alive policies, %d nodes", sc.Nodes)
	return b.String(), loadgen.PlotTradeoff(filepath.Join(out, "keepalive.png"), title, "memory of sandboxes (GiB·s)", "cold starts (measured)", series...)
}

func simRun(cfg ReplayConfig, sc sim.Config, out string) (*SimSummary, workload.PerFunction, string, error) {
	var pf workload.PerFunction
	s, err := cfg.Schedule()
	if err != nil {
		return nil, pf, "", err
	}
	if sc.StableWindow == 0 {
		sc.StableWindow = cfg.StableWindow
	}
	if sc.ScalingMode == "" {
		sc.ScalingMode = cfg.ScalingMode
	}
	if cfg.TimeScale != 1 {
		for i := range s.Invocations {
			s.Invocations[i].Offset = workload.ScaleOffset(s.Invocations[i].Offset, cfg.TimeScale)
		}
	}
	host := hostInfo()
	t0 := time.Now()
	res, err := sim.Run(s, sc)
	if err != nil {
		return nil, pf, "", err
	}
	wall := time.Since(t0)
	cpm := 1
	if cfg.Granularity == "second" {
		cpm = 60
	}
	skip := cfg.SkipMinutes
	if skip == 0 {
		skip = 10
	} else if skip < 0 {
		skip = 0
	}
	requested := 0
	for i := range s.Invocations {
		if s.Phase(&s.Invocations[i]) == 2 {
			requested++
		}
	}
	o := &SimSummary{}
	o.Command = "sim"
	o.Valid = true
	o.Summary = workload.Summarize(res.Records)
	o.Requested = requested
	o.SandboxesCreated = res.SandboxesCreated
	o.PeakSandboxes = res.PeakSandboxes
	o.MemoryCost = workload.ComputeMemoryCost(res.Memory)
	o.MemoryCost.Method = "simulated: every second, Σ requested MiB of live sandboxes (busy: with a call in flight)"
	o.TotalGBs = o.MemoryCost.GBs
	o.Emergency.Sandboxes, o.Emergency.GBs = 0, 0
	o.Slowdown, pf = workload.Slowdowns(res.Records, workload.SlowdownOptions{WarmupColumns: cfg.Warmup * cpm, SkipMinutes: skip, ColumnsPerMinute: cpm})
	sched, schedPerFn := workload.SchedulingLatency(res.Records)
	o.SchedulingLatencyMs = workload.NewDist(sched)
	o.ColdStartsAll = 0
	for i := range res.Records {
		if res.Records[i].Cold {
			o.ColdStartsAll++
		}
	}
	o.Config = ReplayConfigJSON{Trace: cfg.TraceDir, Minutes: cfg.Minutes, Warmup: cfg.Warmup, StartMinute: cfg.StartMinute,
		TimeScale: cfg.TimeScale, Seed: cfg.Seed, IAT: cfg.IAT, Granularity: cfg.Granularity, Functions: len(s.Functions),
		ScalingMode: cfg.ScalingMode, StableWindowS: cfg.StableWindow.Seconds(), KeepAlivePolicy: sc.KeepAlivePolicy, KeepAliveS: sc.KeepAlive.Seconds(), Placement: sc.Placement}
	o.Sim.Nodes, o.Sim.NodeCores, o.Sim.Placement = sc.Nodes, sc.NodeCores, sc.Placement
	o.Sim.ColdStartMs, o.Sim.CachedMs = float64(sc.ColdStart)/1e6, float64(sc.CachedColdStart)/1e6
	o.Sim.Events, o.Sim.WallSeconds = res.Events, wall.Seconds()
	// Emergency sandboxes are in the simulator's memory samples already
	// (MemoryCost.GBs): their count alone is added.
	o.Emergency.Sandboxes = res.EmergencyCalls
	o.TotalGBs = o.MemoryCost.GBs
	o.Sim.LoadCV = cv(res.NodeBusy)
	o.Sim.HeapMiB = heapMiB()
	o.Host = host()

	var b strings.Builder
	fmt.Fprintf(&b, "sim: %d nodes, placement %s, %d events in %.1f s of wall time (heap %.0f MiB)\n",
		sc.Nodes, orDefault(sc.Placement, "kubernetes"), res.Events, wall.Seconds(), o.Sim.HeapMiB)
	fmt.Fprintf(&b, "  %d measured invocations of %d requested; response ms p50 %.1f p99 %.1f\n",
		o.Completed, requested, o.LatencyMs.P50, o.LatencyMs.P99)
	fmt.Fprintf(&b, "  slowdown: geomean of per-function p99 %.3f over %d functions", o.Slowdown.GeomeanP99, o.Slowdown.Functions)
	if o.Slowdown.DirigentGmeanMedian != nil {
		fmt.Fprintf(&b, "; Dirigent median gmean %.3f, KubeDirect median mean %.3f", *o.Slowdown.DirigentGmeanMedian, *o.Slowdown.KubeDirectMeanMedian)
	}
	fmt.Fprintf(&b, "\n  cold starts %d measured (%d with warm-up); sandboxes created %d, peak %d; memory %.1f GiB·s, %.0f%% idle; load CV %.3f",
		o.ColdStarts, o.ColdStartsAll, o.SandboxesCreated, o.PeakSandboxes, o.MemoryCost.GBs, 100*o.MemoryCost.IdleShare, o.Sim.LoadCV)
	if res.EmergencyCalls > 0 {
		fmt.Fprintf(&b, "; emergency calls %d (one-shot sandboxes, in the memory)", res.EmergencyCalls)
	}
	return o, pf, b.String(), writeReplayOutputs(out, o, res.Records, s, cfg.TimeScale, pf, sched, schedPerFn)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// cv is the coefficient of variation of v (0 for no spread or no data).
func cv(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var sum, sq float64
	for _, x := range v {
		sum += x
	}
	m := sum / float64(len(v))
	if m == 0 {
		return 0
	}
	for _, x := range v {
		sq += (x - m) * (x - m)
	}
	return math.Sqrt(sq/float64(len(v))) / m
}

func heapMiB() float64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse) / (1 << 20)
}

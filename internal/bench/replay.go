package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ReplayConfig is `brisk replay`: an Azure trace replayed the loader's way.
type ReplayConfig struct {
	TraceDir    string
	Minutes     int // measured minutes (columns)
	Warmup      int // warm-up minutes before them (phase 1)
	StartMinute int // columns skipped at the start of the trace
	// TimeScale multiplies every arrival offset (0.1: ten trace minutes in
	// one); requested runtimes are not scaled.
	TimeScale   float64
	Seed        uint64
	IAT         string // exponential|uniform|equidistant[_shift]
	Granularity string // minute|second
	// Functions keeps the N busiest functions of the window (0: all).
	Functions int
	// Replicate makes K copies of every function (each with its own
	// draws): a synthetic trace K times the sample's size (0 or 1: none).
	Replicate int
	// SkipMinutes is the papers' first-minutes exclusion for the Dirigent
	// and KubeDirect slowdown variants; 0 means 10, negative none.
	SkipMinutes int
	MaxRuntime  time.Duration // runtime clamp; 0: 60 s
	// ScalingMode and StableWindow go into every registered function's
	// spec ("" and 0: the cluster's defaults). The stable window plus the
	// scale-to-zero grace is how long an idle sandbox lives: the keep-alive
	// of the dual-track comparison (docs/benchmarks.md).
	ScalingMode  string
	StableWindow time.Duration
	// KeepAlivePolicy and KeepAlive go into every registered function's
	// spec ("" and 0: the cluster's).
	KeepAlivePolicy string
	KeepAlive       time.Duration
	// Placement goes into every registered function's spec ("": the
	// cluster's).
	Placement string
	// MinSandboxMemoryMB raises every function's memory request (and so
	// its sandboxes' limit) to at least this, and then keeps each call's
	// memory to at most a quarter of the request (a garbage-collected
	// function may hold twice what it touches): the loader's requests (a
	// function's largest memory over 10) suit emulated sandboxes, but are
	// below what a real process needs. 0: the loader's requests.
	MinSandboxMemoryMB int64
	// Python deploys the functions as Python source (pytrace.py: the
	// trace function's protocol, with a web function's imports) instead
	// of the built-in: for the process and native runtimes.
	Python bool
	// Triggers has the trace's timer functions called by cron triggers and
	// its queue functions by NATS triggers (replay_triggers.go).
	Triggers bool
}

// Schedule loads the trace window and draws the schedule.
func (cfg *ReplayConfig) Schedule() (*workload.Schedule, error) {
	if cfg.Minutes <= 0 || cfg.Warmup < 0 || cfg.StartMinute < 0 {
		return nil, fmt.Errorf("replay: --minutes %d must be positive, --warmup %d and --start-minute %d not negative", cfg.Minutes, cfg.Warmup, cfg.StartMinute)
	}
	if cfg.MinSandboxMemoryMB < 0 || cfg.MinSandboxMemoryMB > workload.DefaultMaxMemory {
		return nil, fmt.Errorf("replay: --min-sandbox-memory %d out of range [0, %d]", cfg.MinSandboxMemoryMB, workload.DefaultMaxMemory)
	}
	if cfg.TimeScale <= 0 || cfg.TimeScale > 1000 {
		return nil, fmt.Errorf("replay: --time-scale %g out of range (0, 1000]", cfg.TimeScale)
	}
	iat, shift, err := workload.ParseIAT(cfg.IAT)
	if err != nil {
		return nil, err
	}
	gran, err := workload.ParseGranularity(cfg.Granularity)
	if err != nil {
		return nil, err
	}
	tr, err := workload.LoadTrace(cfg.TraceDir, workload.TraceOptions{StartColumn: cfg.StartMinute, Columns: cfg.Warmup + cfg.Minutes})
	if err != nil {
		return nil, err
	}
	if cfg.Replicate < 0 || cfg.Replicate > 10_000 {
		return nil, fmt.Errorf("replay: --replicate %d out of range [0, 10000]", cfg.Replicate)
	}
	tr = tr.Busiest(cfg.Functions).Replicate(cfg.Replicate)
	return workload.BuildSchedule(tr, workload.ScheduleConfig{Seed: cfg.Seed, IAT: iat, Shift: shift, Granularity: gran,
		WarmupColumns: cfg.Warmup, MaxRuntime: cfg.MaxRuntime})
}

// ReplaySummary is summary.json of brisk replay; the load fields cover the
// measured phase.
type ReplaySummary struct {
	Command string `json:"command"`
	Validity
	workload.Summary
	// Requested is the number of measured-phase invocations the trace asks
	// for; issued must equal it.
	Requested int `json:"requested"`
	// Slowdown: see loadgen.Slowdown for each variant's exact definition.
	Slowdown workload.Slowdown `json:"slowdown"`
	// SchedulingLatencyMs is responseTime − actualDuration of completed
	// measured calls.
	SchedulingLatencyMs workload.Dist `json:"scheduling_latency_ms"`
	// ColdStartsAll counts cold replies of both phases, to compare with
	// SandboxesCreated (which covers the whole run).
	ColdStartsAll    int                 `json:"cold_starts_all_phases"`
	SandboxesCreated int64               `json:"sandboxes_created"`
	PeakSandboxes    int                 `json:"peak_sandboxes"`
	MemoryCost       workload.MemoryCost `json:"memory_cost"`
	// Emergency is the dual track's one-shot sandboxes during the run
	// (from the workers' heartbeats; -1 when not known): how many started,
	// and their memory cost, which MemoryCost (the control plane's table)
	// does not see. TotalGBs adds it to MemoryCost.GBs.
	Emergency struct {
		Sandboxes int64   `json:"sandboxes"`
		GBs       float64 `json:"gb_s"`
	} `json:"emergency"`
	TotalGBs float64 `json:"total_gb_s"`
	// Triggers (--triggers): the trigger-made calls of the measured phase.
	Triggers *ReplayTriggers  `json:"triggers,omitempty"`
	Config   ReplayConfigJSON `json:"config"`
	Host     HostInfo         `json:"host"`
}

// ReplayConfigJSON records the replay's parameters.
type ReplayConfigJSON struct {
	Trace           string  `json:"trace"`
	Minutes         int     `json:"minutes"`
	Warmup          int     `json:"warmup_minutes"`
	StartMinute     int     `json:"start_minute"`
	TimeScale       float64 `json:"time_scale"`
	Seed            uint64  `json:"seed"`
	IAT             string  `json:"iat"`
	Granularity     string  `json:"granularity"`
	Functions       int     `json:"functions"`
	ActiveFunctions int     `json:"active_functions"`
	H2C             bool    `json:"h2c"`
	ScalingMode     string  `json:"scaling_mode,omitempty"`
	StableWindowS   float64 `json:"stable_window_s,omitempty"`
	KeepAlivePolicy string  `json:"keep_alive_policy,omitempty"`
	KeepAliveS      float64 `json:"keep_alive_s,omitempty"`
	Placement       string  `json:"placement,omitempty"`
	MinSandboxMiB   int64   `json:"min_sandbox_memory_mb,omitempty"`
}

//go:embed pytrace.py
var pyTraceSource []byte

// pyTraceZip is pytrace.py as an archive to upload, made on first use:
// zipping it at init cost every brisk process (each CLI command too) 6 ms
// and 0.8 MB of the compressor's tables.
var pyTraceZip = sync.OnceValue(func() []byte {
	b, err := codezip.ZipFiles(map[string][]byte{"pytrace.py": pyTraceSource})
	if err != nil {
		panic(err)
	}
	return b
})

// Replay registers the trace's functions and replays the schedule.
func Replay(ctx context.Context, c *Cluster, o Options, cfg ReplayConfig) (*ReplaySummary, string, error) {
	s, err := cfg.Schedule()
	if err != nil {
		return nil, "", err
	}
	host := hostInfo()
	skip := cfg.SkipMinutes
	switch {
	case skip == 0:
		skip = workload.DefaultSkipMinutes
	case skip < 0:
		skip = 0
	}
	fns := make([]*spec.Function, len(s.Functions))
	names := make([]string, len(s.Functions))
	memMB := map[string]float64{}
	active := 0
	for i := range s.Functions {
		f := &s.Functions[i]
		cpu, mem := workload.ResourceRequest(f)
		mem = max(mem, cfg.MinSandboxMemoryMB)
		names[i] = f.Name()
		fns[i] = &spec.Function{Name: f.Name(), Builtin: "trace", Concurrency: 1, Resources: spec.Resources{MilliCPU: cpu, MemoryMB: mem},
			Placement: cfg.Placement,
			Scaling: spec.Scaling{Mode: cfg.ScalingMode, StableWindow: spec.Duration(cfg.StableWindow),
				KeepAlivePolicy: cfg.KeepAlivePolicy, KeepAlive: spec.Duration(cfg.KeepAlive)}}
		memMB[f.Name()] = float64(mem)
		if f.Total() > 0 {
			active++
		}
	}
	if cfg.Python {
		up, err := c.Client.UploadCode(ctx, pyTraceZip())
		if err != nil {
			return nil, "", fmt.Errorf("uploading the Python trace function: %w", err)
		}
		for _, f := range fns {
			f.Builtin = ""
			f.Code = &spec.Code{Language: spec.LangPython, Handler: "pytrace.handle", Contract: spec.ContractHTTP, Digest: up.Digest}
		}
	}
	defer cleanup(c, &o, names)
	o.logf("registering %d trace functions (%d invoked in the window); %d invocations over %d minutes at time scale %g",
		len(fns), active, len(s.Invocations), s.Columns, cfg.TimeScale)
	if err := firstError(registerAll(ctx, c.Client, fns, o.clients(), true, nil), "registering trace functions"); err != nil {
		return nil, "", err
	}
	calls := make([]loadgen.Call, len(s.Invocations))
	requested := 0
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		calls[i] = loadgen.Call{Function: names[inv.Func], Offset: workload.ScaleOffset(inv.Offset, cfg.TimeScale),
			RuntimeMs: int(inv.RuntimeMs), MemoryMB: int(inv.MemoryMB), Phase: s.Phase(inv), ID: s.InvocationID(inv)}
		if cfg.MinSandboxMemoryMB > 0 {
			calls[i].MemoryMB = min(calls[i].MemoryMB, int(fns[inv.Func].Resources.MemoryMB/4))
		}
		if calls[i].Phase == 2 {
			requested++
		}
	}

	var rt *replayTriggers
	sent := calls
	if cfg.Triggers {
		rt, sent = planTriggers(s, calls, fns, cfg.TimeScale)
		requested = 0
		for i := range sent {
			if sent[i].Phase == 2 {
				requested++
			}
		}
		for _, tt := range rt.timers {
			for _, ph := range tt.phases {
				if ph == 2 {
					requested++
				}
			}
		}
	}

	created0, cerr0 := c.counter(ctx, "brisk_controlplane_sandbox_creations_total")
	em0, emErr0 := emergencyTotals(ctx, c)
	mon := &monitor{c: c, memMB: memMB, interval: time.Second}
	monCtx, stopMon := context.WithCancel(ctx)
	monDone := make(chan struct{})
	go func() { mon.run(monCtx); close(monDone) }()
	inv := &loadgen.HTTPInvoker{Client: loadgen.NewHTTPClient(o.HTTP), Route: loadgen.DataPlane(c.Invoke), Header: c.InvokeHeader()}
	is := newIssuer(&o, inv)
	var start time.Time
	if rt != nil {
		defer rt.stop(ctx, c)
		start = time.Now().Add(replayTriggerLead).Truncate(time.Second)
		if err := rt.create(ctx, c, &o, start); err != nil {
			stopMon()
			<-monDone
			return nil, "", err
		}
		rt.http, is.Invoker, is.Start = inv, rt, start
	}
	recs, err := issue(ctx, &o, "replay", is, sent)
	if err == nil && rt != nil {
		recs, err = rt.finish(ctx, c, &o, start, workload.ScaleOffset(time.Duration(s.Columns)*s.Granularity.Period(), cfg.TimeScale), recs)
	}
	stopMon()
	<-monDone
	if err != nil {
		return nil, "", err
	}
	created1, cerr1 := c.counter(ctx, "brisk_controlplane_sandbox_creations_total")
	// The workers report ended emergency sandboxes with their next
	// heartbeat (every second): wait for those of the last calls.
	var em1 emergencyTotal
	emErr1 := emErr0
	if emErr0 == nil {
		deadline := time.Now().Add(5 * time.Second)
		for {
			em1, emErr1 = emergencyTotals(ctx, c)
			if emErr1 != nil || em1.inUse == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	cpm := 1
	if cfg.Granularity == "second" {
		cpm = 60
	}
	out := &ReplaySummary{Command: "replay", Summary: workload.Summarize(recs), Requested: requested, SandboxesCreated: -1,
		PeakSandboxes: mon.peak, MemoryCost: workload.ComputeMemoryCost(mon.samples),
		Config: ReplayConfigJSON{Trace: cfg.TraceDir, Minutes: cfg.Minutes, Warmup: cfg.Warmup, StartMinute: cfg.StartMinute,
			TimeScale: cfg.TimeScale, Seed: cfg.Seed, IAT: cfg.IAT, Granularity: cfg.Granularity, Functions: len(fns),
			ActiveFunctions: active, H2C: o.HTTP.H2C, ScalingMode: cfg.ScalingMode, StableWindowS: cfg.StableWindow.Seconds(),
			KeepAlivePolicy: cfg.KeepAlivePolicy, KeepAliveS: cfg.KeepAlive.Seconds(), Placement: cfg.Placement,
			MinSandboxMiB: cfg.MinSandboxMemoryMB}}
	out.Emergency.Sandboxes, out.Emergency.GBs = -1, -1
	out.TotalGBs = out.MemoryCost.GBs
	if emErr0 == nil && emErr1 == nil {
		out.Emergency.Sandboxes = em1.started - em0.started
		out.Emergency.GBs = (em1.mibSeconds - em0.mibSeconds) / 1024
		out.TotalGBs += out.Emergency.GBs
	}
	out.MemoryCost.Method = "1 s samples of GET /v1/status (ready+pending sandboxes × requested MiB) and the data plane's brisk_dataplane_inflight gauges (busy = min(in flight, ready) × MiB)"
	if mon.failures > 0 {
		out.MemoryCost.Method += fmt.Sprintf("; %d samples failed, last: %v", mon.failures, mon.lastError)
	}
	if cerr0 == nil && cerr1 == nil {
		out.SandboxesCreated = int64(created1 - created0)
	}
	var pf workload.PerFunction
	out.Slowdown, pf = workload.Slowdowns(recs, workload.SlowdownOptions{WarmupColumns: cfg.Warmup * cpm, SkipMinutes: skip, ColumnsPerMinute: cpm})
	sched, schedPerFn := workload.SchedulingLatency(recs)
	out.SchedulingLatencyMs = workload.NewDist(sched)
	out.ColdStartsAll = out.ColdStarts
	for i := range recs {
		if recs[i].Phase == 1 && recs[i].OK() && recs[i].Cold {
			out.ColdStartsAll++
		}
	}
	if rt != nil {
		out.Triggers = rt.summary(s, recs)
	}
	var verr error
	out.Validity, verr = validity(&o, recs)
	out.Host = host()

	var b strings.Builder
	b.WriteString(formatLoad("replay", &out.Summary, out.Validity, o.Force))
	if !out.Valid && !o.Force {
		b.Reset()
		b.WriteString(formatLoad("replay", &out.Summary, out.Validity, false))
		return out, b.String(), errors.Join(verr, writeReplayOutputs(o.Out, out, recs, s, cfg.TimeScale, pf, sched, schedPerFn))
	}
	fmt.Fprintf(&b, "\n  requested %d measured invocations; scheduling latency ms p50 %.3f p99 %.3f max %.1f",
		requested, out.SchedulingLatencyMs.P50, out.SchedulingLatencyMs.P99, out.SchedulingLatencyMs.Max)
	fmt.Fprintf(&b, "\n  slowdown: geomean of per-function p99 %.3f over %d functions", out.Slowdown.GeomeanP99, out.Slowdown.Functions)
	if out.Slowdown.DirigentGmeanMedian != nil {
		fmt.Fprintf(&b, "; Dirigent median gmean %.3f, KubeDirect median mean %.3f (minutes ≥ %d, %d functions)",
			*out.Slowdown.DirigentGmeanMedian, *out.Slowdown.KubeDirectMeanMedian, skip, out.Slowdown.FilteredFunctions)
	} else {
		fmt.Fprintf(&b, "; Dirigent/KubeDirect variants: no calls after the first %d minutes", skip)
	}
	fmt.Fprintf(&b, "\n  cold starts %d measured (%d with warm-up); sandboxes created %d, peak %d; memory %.1f GiB·s, %.0f%% idle",
		out.ColdStarts, out.ColdStartsAll, out.SandboxesCreated, out.PeakSandboxes, out.MemoryCost.GBs, 100*out.MemoryCost.IdleShare)
	if t := out.Triggers; t != nil {
		fmt.Fprintf(&b, "\n  triggers: %d timer functions, %d measured ticks, %d cold; %d queue functions, %d measured messages, %d cold; tick→start ms p50 %.1f p99 %.1f",
			t.TimerFunctions, t.TimerCalls, t.TimerColdStarts, t.QueueFunctions, t.QueueCalls, t.QueueColdStarts, t.TickToStartMs.P50, t.TickToStartMs.P99)
	}
	if out.Emergency.Sandboxes > 0 {
		fmt.Fprintf(&b, "\n  emergency sandboxes %d, %.2f GiB·s; total memory %.1f GiB·s", out.Emergency.Sandboxes, out.Emergency.GBs, out.TotalGBs)
	}

	b.WriteString("\n" + out.Host.String())
	return out, b.String(), errors.Join(verr, writeReplayOutputs(o.Out, out, recs, s, cfg.TimeScale, pf, sched, schedPerFn))
}

func writeReplayOutputs(dir string, out any, recs []workload.Record, s *workload.Schedule, timeScale float64,
	pf workload.PerFunction, sched, schedPerFn []float64) error {
	if dir == "" {
		return nil
	}
	err := writeOutputs(dir, out, map[string][]workload.Record{"invocations.csv": recs}, []plotSpec{
		{file: "latency_cdf.png", title: "response time per invocation", xLabel: "response time (ms)", logX: true,
			series: []loadgen.Series{{Name: "invocations", Values: latencies(recs)}}},
		{file: "slowdown_cdf.png", title: "per-function slowdown", xLabel: "slowdown (response / requested)", logX: true,
			series: []loadgen.Series{{Name: "p99 per function", Values: pf.P99}, {Name: "Dirigent: gmean per function", Values: pf.DirigentGmean},
				{Name: "KubeDirect: mean per function", Values: pf.KubeDirectMean}}},
		{file: "scheduling_latency_cdf.png", title: "scheduling latency (response − execution)", xLabel: "scheduling latency (ms)", logX: true,
			series: []loadgen.Series{{Name: "per invocation", Values: sched}, {Name: "mean per function", Values: schedPerFn}}},
	})
	if err != nil {
		return err
	}
	return writeFile(dir+"/schedule.csv", func(w io.Writer) error { return s.WriteCSV(w, timeScale) })
}

// emergencyTotal sums the workers' emergency tracks.
type emergencyTotal struct {
	started, inUse int64
	mibSeconds     float64
}

func emergencyTotals(ctx context.Context, c *Cluster) (emergencyTotal, error) {
	st, err := c.Client.Status(ctx)
	if err != nil {
		return emergencyTotal{}, err
	}
	var t emergencyTotal
	for _, n := range st.Nodes {
		if em := n.Emergency; em != nil {
			t.started += em.Started
			t.inUse += int64(em.InUse)
			t.mibSeconds += em.MemoryMBSeconds
		}
	}
	return t, nil
}

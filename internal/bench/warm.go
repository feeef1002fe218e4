package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// WarmConfig is `brisk bench warm`: calls to functions whose sandboxes
// are already running, open-loop at a constant rate or closed-loop.
type WarmConfig struct {
	Rate float64 // open loop: calls per second over all functions
	// Closed, instead of Rate: this many callers, each sending its next call
	// when its reply arrives (loadgen.ClosedLoop) — saturation throughput.
	Closed int
	// Rounds splits the duration into this many turns per side, brisk and
	// direct alternating (with CompareDirect); default 1.
	Rounds    int
	Duration  time.Duration // measured phase
	Warmup    time.Duration // unmeasured calls at the same rate first; default 1s
	Functions int           // default 1; calls go round-robin
	Sandboxes int           // pre-warmed sandboxes per function (min = max); default 2
	// Concurrency per sandbox (the spec's concurrency); 0 = unlimited, so
	// the data plane never queues and the run measures the proxy path.
	Concurrency int
	ExecMs      int // runtime each call asks for; default 0 (an empty function)
	// Direct sends only straight to the sandboxes; CompareDirect runs
	// through brisk and then straight, and reports the difference.
	Direct, CompareDirect bool
}

// WarmSummary is summary.json of bench warm: the top level is the brisk
// run (or the direct run with Direct alone).
type WarmSummary struct {
	Command string `json:"command"`
	Target  string `json:"target"` // "brisk" or "direct"
	Validity
	workload.Summary
	// CPUPerCallUs is this process's CPU time over the run's calls
	// (warm-up included): the generator's, and with --local the whole
	// cluster's and the sandboxes'.
	CPUPerCallUs float64        `json:"cpu_per_call_us"`
	Config       WarmConfigJSON `json:"config"`
	Host         HostInfo       `json:"host"`
	Direct       *DirectRun     `json:"direct,omitempty"`
	Compare      *Comparison    `json:"compare,omitempty"`
}

// WarmConfigJSON records the run's parameters.
type WarmConfigJSON struct {
	Rate        float64 `json:"rate,omitempty"`
	Closed      int     `json:"closed_callers,omitempty"`
	DurationS   float64 `json:"duration_s"`
	WarmupS     float64 `json:"warmup_s"`
	Functions   int     `json:"functions"`
	Sandboxes   int     `json:"sandboxes_per_function"`
	Concurrency int     `json:"concurrency_per_sandbox"`
	ExecMs      int     `json:"exec_ms"`
	H2C         bool    `json:"h2c"`
	Rounds      int     `json:"rounds"`
}

// DirectRun is the same load sent straight to the sandboxes.
type DirectRun struct {
	Validity
	workload.Summary
	CPUPerCallUs float64 `json:"cpu_per_call_us"`
}

// Comparison puts brisk against the direct baseline. Added latencies are
// differences of percentiles (brisk p50 − direct p50), not percentiles of
// per-call differences.
type Comparison struct {
	AddedP50Ms      float64 `json:"added_p50_ms"`
	AddedP99Ms      float64 `json:"added_p99_ms"`
	ThroughputRatio float64 `json:"throughput_ratio"` // brisk / direct
	// CPURatio is direct's CPU per call over brisk's (with --local, where
	// this process is the whole machine's load): the throughput ratio at
	// saturation, where CPU is the limit, measured below it — steadier
	// than pushing both past their knees on a shared machine.
	CPURatio float64 `json:"cpu_ratio,omitempty"`
}

// Warm runs bench warm.
func Warm(ctx context.Context, c *Cluster, o Options, cfg WarmConfig) (*WarmSummary, string, error) {
	if (cfg.Rate <= 0) == (cfg.Closed <= 0) || cfg.Duration <= 0 {
		return nil, "", fmt.Errorf("bench warm: one of rate %g and closed %d, and duration %s, must be positive", cfg.Rate, cfg.Closed, cfg.Duration)
	}
	if cfg.Direct && cfg.CompareDirect {
		return nil, "", errors.New("bench warm: --direct and --compare-direct exclude each other")
	}
	cfg.Functions, cfg.Sandboxes = max(cfg.Functions, 1), max(cfg.Sandboxes, 1)
	if cfg.Warmup == 0 {
		cfg.Warmup = time.Second
	}
	id := runID()
	host := hostInfo()
	names := make([]string, cfg.Functions)
	fns := make([]*spec.Function, cfg.Functions)
	for i := range names {
		names[i] = "bench-warm-" + id + "-" + strconv.Itoa(i)
		fns[i] = &spec.Function{Name: names[i], Builtin: "trace", Concurrency: cfg.Concurrency,
			Scaling: spec.Scaling{Min: cfg.Sandboxes, Max: cfg.Sandboxes}}
		if cfg.Concurrency == 0 {
			// 0 means "default" (1) in a spec; unlimited is spelled as the
			// largest value the spec allows.
			fns[i].Concurrency = 10000
		}
	}
	defer cleanup(c, &o, names)
	o.logf("registering %d functions with %d sandboxes each", cfg.Functions, cfg.Sandboxes)
	if err := firstError(registerAll(ctx, c.Client, fns, o.clients(), false, nil), "registering"); err != nil {
		return nil, "", err
	}
	direct := map[string][]loadgen.Target{}
	for _, n := range names {
		v, err := c.waitReady(ctx, n, cfg.Sandboxes, 2*time.Minute)
		if err != nil {
			return nil, "", err
		}
		for _, sb := range v.Status.Sandboxes {
			if sb.State == "ready" && sb.Address != "" {
				direct[n] = append(direct[n], loadgen.Target{URL: "http://" + sb.Address + "/", Sandbox: sb.ID})
			}
		}
	}
	httpc := loadgen.NewHTTPClient(o.HTTP)
	brisk := &loadgen.HTTPInvoker{Client: httpc, Route: loadgen.DataPlane(c.Invoke), Header: c.InvokeHeader()}
	if err := primeDataPlane(ctx, brisk, names); err != nil {
		return nil, "", err
	}
	ld := load{rate: cfg.Rate, closed: cfg.Closed, names: names, execMs: cfg.ExecMs}

	rounds := max(cfg.Rounds, 1)
	out := &WarmSummary{Command: "bench warm", Target: "brisk", Config: WarmConfigJSON{Rate: cfg.Rate, Closed: cfg.Closed, DurationS: cfg.Duration.Seconds(),
		WarmupS: cfg.Warmup.Seconds(), Functions: cfg.Functions, Sandboxes: cfg.Sandboxes, Concurrency: cfg.Concurrency,
		ExecMs: cfg.ExecMs, H2C: o.HTTP.H2C, Rounds: rounds}}
	var sides []*warmSide
	if !cfg.Direct {
		sides = append(sides, &warmSide{label: "brisk ", inv: brisk})
	}
	if cfg.Direct || cfg.CompareDirect {
		route, err := loadgen.Sandboxes(direct)
		if err != nil {
			return nil, "", err
		}
		// Sandboxes speak HTTP/1.1 (as the data plane does to them), even
		// when the calls to brisk use h2c.
		directc := httpc
		if o.HTTP.H2C {
			h1 := o.HTTP
			h1.H2C = false
			directc = loadgen.NewHTTPClient(h1)
		}
		sides = append(sides, &warmSide{label: "direct", inv: &loadgen.HTTPInvoker{Client: directc, Route: route}})
	}
	// With several rounds the sides take turns, each round a slice of the
	// duration, so that a host getting busier or quieter during the run
	// weighs on both alike.
	for r := range rounds {
		warmup := cfg.Warmup
		if r > 0 {
			warmup = 0
		}
		for _, sd := range sides {
			cpu0 := processCPU()
			recs, err := ld.send(ctx, &o, sd.label, sd.inv, warmup, cfg.Duration/time.Duration(rounds))
			if err != nil {
				return nil, "", err
			}
			sd.add(recs, processCPU()-cpu0)
		}
	}

	csvs := map[string][]workload.Record{}
	var text []string
	var series []loadgen.Series
	var firstErr error
	for _, sd := range sides {
		sum, cpu := sd.summary()
		v, err := validity(&o, sd.recs)
		if firstErr == nil {
			firstErr = err
		}
		series = append(series, loadgen.Series{Name: strings.TrimSpace(sd.label), Values: latencies(sd.recs)})
		text = append(text, formatLoad(sd.label, &sum, v, o.Force))
		switch {
		case sd.label == "brisk ":
			out.Summary, out.Validity, out.CPUPerCallUs = sum, v, cpu
			csvs["invocations.csv"] = sd.recs
		case cfg.Direct:
			out.Target, out.Summary, out.Validity, out.CPUPerCallUs = "direct", sum, v, cpu
			csvs["invocations.csv"] = sd.recs
		default:
			out.Direct = &DirectRun{Validity: v, Summary: sum, CPUPerCallUs: cpu}
			csvs["direct.csv"] = sd.recs
		}
	}
	if d := out.Direct; d != nil {
		out.Compare = &Comparison{AddedP50Ms: out.LatencyMs.P50 - d.LatencyMs.P50, AddedP99Ms: out.LatencyMs.P99 - d.LatencyMs.P99}
		if d.ThroughputRPS > 0 {
			out.Compare.ThroughputRatio = out.ThroughputRPS / d.ThroughputRPS
		}
		if out.CPUPerCallUs > 0 && d.CPUPerCallUs > 0 {
			out.Compare.CPURatio = d.CPUPerCallUs / out.CPUPerCallUs
			text = append(text, fmt.Sprintf("CPU per call (this process): brisk %.1f µs, direct %.1f µs; direct/brisk %.3f", out.CPUPerCallUs, d.CPUPerCallUs, out.Compare.CPURatio))
		}
		if ((out.Valid && d.Valid) || o.Force) && out.Completed > 0 && d.Completed > 0 {
			text = append(text, fmt.Sprintf("brisk over direct: added p50 %+.3f ms, added p99 %+.3f ms, throughput ratio %.3f",
				out.Compare.AddedP50Ms, out.Compare.AddedP99Ms, out.Compare.ThroughputRatio))
		}
	}
	out.Host = host()
	err := writeOutputs(o.Out, out, csvs, []plotSpec{{file: "latency_cdf.png", title: ld.title("warm calls"),
		xLabel: "response time (ms)", logX: true, series: series}})
	text = append(text, out.Host.String())
	return out, strings.Join(text, "\n"), errors.Join(firstErr, err)
}

// warmSide is one target of a warm run (brisk or direct), accumulated
// over rounds.
type warmSide struct {
	label string
	inv   loadgen.Invoker
	recs  []workload.Record
	cpu   time.Duration
	// completed and span (seconds) of each round's measured calls: the
	// throughput is taken over the side's own time only.
	completed int
	span      float64
}

func (sd *warmSide) add(recs []workload.Record, cpu time.Duration) {
	sd.recs = append(sd.recs, recs...)
	sd.cpu += cpu
	if s := workload.Summarize(recs); s.ThroughputRPS > 0 {
		sd.completed += s.Completed
		sd.span += float64(s.Completed) / s.ThroughputRPS
	}
}

// summary is the side's summary over all rounds and its CPU per call.
func (sd *warmSide) summary() (workload.Summary, float64) {
	s := workload.Summarize(sd.recs)
	if sd.span > 0 {
		s.ThroughputRPS = float64(sd.completed) / sd.span
	}
	return s, cpuPerCall(sd.cpu, len(sd.recs))
}

func cpuPerCall(cpu time.Duration, calls int) float64 {
	if calls == 0 || cpu <= 0 {
		return 0
	}
	return float64(cpu.Microseconds()) / float64(calls)
}

// constantRate spreads calls evenly: call i at i/rate, to function i mod
// len(names) — the loader's RPS warm construction. The first warmup's
// worth are phase 1.
func constantRate(names []string, rate float64, warmup, d time.Duration, execMs int) []loadgen.Call {
	nw := int(math.Round(rate * warmup.Seconds()))
	n := nw + int(math.Round(rate*d.Seconds()))
	calls := make([]loadgen.Call, n)
	for i := range calls {
		phase, idx := 2, i-nw
		if i < nw {
			phase, idx = 1, i
		}
		sec := int(float64(i) / rate)
		calls[i] = loadgen.Call{Function: names[i%len(names)], Offset: time.Duration(float64(i) / rate * float64(time.Second)),
			RuntimeMs: execMs, Phase: phase, ID: "sec" + strconv.Itoa(sec) + ".inv" + strconv.Itoa(idx)}
	}
	return calls
}

// primeDataPlane calls each function until it answers 200: the control
// plane reports sandboxes ready before the data plane's endpoint stream
// may have delivered them.
func primeDataPlane(ctx context.Context, inv loadgen.Invoker, names []string) error {
	for _, n := range names {
		var last loadgen.Reply
		err := poll(ctx, 30*time.Second, 5*time.Millisecond, func() (bool, error) {
			last = inv.Invoke(ctx, &loadgen.Call{Function: n})
			return last.Status == 200 && !last.Cold, nil
		}, func() string {
			return fmt.Sprintf("function %s to answer warm (last: HTTP %d %v)", n, last.Status, last.Err)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

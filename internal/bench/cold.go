package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ColdConfig is `brisk bench cold`: every call is a cold start. Each call
// goes to its own function, registered at zero before the clock starts and
// invoked exactly once — the simplest form of the loader's RPS cold
// construction (each call lands on a function at zero).
type ColdConfig struct {
	Rate     float64
	Duration time.Duration
	ExecMs   int // runtime each call asks for; default 0
	// WarmupFraction of the calls (the first ones) are not measured: the
	// loader's docs discard the first 10 % of cold starts. Default 0.1; a
	// negative value measures everything.
	WarmupFraction float64
}

// ColdSummary is summary.json of bench cold.
type ColdSummary struct {
	Command string `json:"command"`
	Validity
	workload.Summary
	// SandboxesCreated is the control plane's creation counter over the
	// run (brisk_controlplane_sandbox_creations_total), to cross-check
	// cold_starts; -1 when it could not be read.
	SandboxesCreated int64 `json:"sandboxes_created"`
	// NotCold counts completed calls that were not cold starts.
	NotCold int            `json:"not_cold"`
	Config  ColdConfigJSON `json:"config"`
	Host    HostInfo       `json:"host"`
}

// ColdConfigJSON records the run's parameters.
type ColdConfigJSON struct {
	Rate           float64 `json:"rate"`
	DurationS      float64 `json:"duration_s"`
	Functions      int     `json:"functions"`
	ExecMs         int     `json:"exec_ms"`
	WarmupFraction float64 `json:"warmup_fraction"`
	H2C            bool    `json:"h2c"`
}

// Cold runs bench cold.
func Cold(ctx context.Context, c *Cluster, o Options, cfg ColdConfig) (*ColdSummary, string, error) {
	if cfg.Rate <= 0 || cfg.Duration <= 0 {
		return nil, "", fmt.Errorf("bench cold: rate %g and duration %s must be positive", cfg.Rate, cfg.Duration)
	}
	if cfg.WarmupFraction == 0 {
		cfg.WarmupFraction = 0.1
	}
	cfg.WarmupFraction = max(cfg.WarmupFraction, 0)
	n := int(math.Ceil(cfg.Rate * cfg.Duration.Seconds()))
	if n > 200_000 {
		return nil, "", fmt.Errorf("bench cold: %d functions (rate × duration) is more than this benchmark registers (200000)", n)
	}
	id := runID()
	host := hostInfo()
	names := make([]string, n)
	fns := make([]*spec.Function, n)
	for i := range names {
		names[i] = "bench-cold-" + id + "-" + strconv.Itoa(i)
		fns[i] = &spec.Function{Name: names[i], Builtin: "trace", Concurrency: 1}
	}
	defer cleanup(c, &o, names)
	o.logf("registering %d functions at zero with %d clients", n, o.clients())
	var regDone atomic.Int64
	bar := loadgen.StartProgress(o.Progress, "register", int64(n), func() (int64, string) { return regDone.Load(), "" })
	regs := registerAll(ctx, c.Client, fns, o.clients(), false, &regDone)
	bar.Stop()
	if err := firstError(regs, "registering"); err != nil {
		return nil, "", err
	}
	warm := int(math.Round(cfg.WarmupFraction * float64(n)))
	calls := make([]loadgen.Call, n)
	for i := range calls {
		phase := 2
		if i < warm {
			phase = 1
		}
		calls[i] = loadgen.Call{Function: names[i], Offset: time.Duration(float64(i) / cfg.Rate * float64(time.Second)),
			RuntimeMs: cfg.ExecMs, Phase: phase, ID: "sec" + strconv.Itoa(int(float64(i)/cfg.Rate)) + ".inv" + strconv.Itoa(i)}
	}
	before, berr := c.counter(ctx, "brisk_controlplane_sandbox_creations_total")
	inv := &loadgen.HTTPInvoker{Client: loadgen.NewHTTPClient(o.HTTP), Route: loadgen.DataPlane(c.Invoke), Header: c.InvokeHeader()}
	recs, err := issue(ctx, &o, "cold", newIssuer(&o, inv), calls)
	if err != nil {
		return nil, "", err
	}
	after, aerr := c.counter(ctx, "brisk_controlplane_sandbox_creations_total")
	out := &ColdSummary{Command: "bench cold", Summary: workload.Summarize(recs), SandboxesCreated: -1,
		Config: ColdConfigJSON{Rate: cfg.Rate, DurationS: cfg.Duration.Seconds(), Functions: n, ExecMs: cfg.ExecMs,
			WarmupFraction: cfg.WarmupFraction, H2C: o.HTTP.H2C}}
	if berr == nil && aerr == nil {
		out.SandboxesCreated = int64(after - before)
	}
	out.NotCold = out.Completed - out.ColdStarts
	var verr error
	out.Validity, verr = validity(&o, recs)
	text := formatLoad("cold", &out.Summary, out.Validity, o.Force)
	if out.Valid || o.Force {
		text += fmt.Sprintf("\n  cold starts %d (measured) + %d warm-up calls; sandboxes created %d; completed but not cold %d",
			out.ColdStarts, out.WarmupCompleted, out.SandboxesCreated, out.NotCold)
	}
	out.Host = host()
	text += "\n" + out.Host.String()
	werr := writeOutputs(o.Out, out, map[string][]workload.Record{"invocations.csv": recs},
		[]plotSpec{{file: "latency_cdf.png", title: fmt.Sprintf("cold starts at %g/s", cfg.Rate), xLabel: "response time (ms)",
			logX: true, series: []loadgen.Series{{Name: "cold", Values: latencies(recs)}}}})
	return out, text, errors.Join(verr, werr)
}

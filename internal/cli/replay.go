package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/brisk-faas/brisk/internal/bench"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newReplay(g *globals) *cobra.Command {
	f := &benchFlags{}
	cfg := bench.ReplayConfig{}
	var dryRun bool
	c := &cobra.Command{
		Use:   "replay TRACE_DIR",
		Short: "Replay an Azure Functions trace (InVitro loader format) against a cluster",
		Long: `Replay an Azure Functions trace the way the InVitro loader does: per-minute
invocation counts reproduced exactly, inter-arrival times drawn from the chosen
distribution, runtime and memory drawn within each function's percentile
brackets, all deterministic for --seed. TRACE_DIR holds invocations.csv,
durations.csv and memory.csv.

With --triggers, the trace's timer functions are called by cron triggers
(ticking at their calls' times, spread evenly over each minute) and its
queue functions by NATS triggers: the generator publishes their calls as
messages on a JetStream stream. Those calls' response times run from the
tick or the publish to the call's end (docs/triggers.md).

The trace's functions are registered as trace-func-<row> (built-in trace
function, concurrency 1, the loader's resource recipe), the schedule is sent
open-loop, and the papers' metrics are computed: slowdown (geometric mean of
per-function p99, and the Dirigent and KubeDirect variants), scheduling
latency, cold starts, sandboxes created and memory cost. --dry-run prints the
schedule as CSV without any cluster. See docs/benchmarks.md.`,
		Example: `  brisk replay ./traces/azure_500 --minutes 30 --local --workers 20 --out results/azure500
  brisk replay ./traces/azure_100 --minutes 10 --time-scale 0.1 --local --out results/azure100
  brisk replay ./traces/azure_500 --minutes 30 --dry-run > schedule.csv`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cfg.TraceDir = args[0]
			if cfg.SkipMinutes == 0 {
				cfg.SkipMinutes = -1 // an explicit 0: no exclusion
			}
			sched, err := cfg.Schedule()
			if err != nil {
				return usageError{err}
			}
			if dryRun {
				return sched.WriteCSV(c.OutOrStdout(), cfg.TimeScale)
			}
			if cfg.Triggers {
				if !f.local {
					return usageError{errors.New("--triggers needs --local: the queue functions' messages go to the local cluster's embedded NATS")}
				}
				f.async = true
			}
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Replay(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 10, 40*time.Millisecond)
	fl := c.Flags()
	registerReplayFlags(fl, &cfg)
	fl.BoolVar(&cfg.Python, "python", false, "deploy the trace functions as Python source (the trace function's protocol with a web function's imports, ~100 ms; docs/languages.md) instead of the built-in: on the process runtime their sandboxes start from templates unless the workers run --templates=false")
	fl.BoolVar(&cfg.Triggers, "triggers", false, "call the trace's timer functions by cron triggers and its queue functions by NATS triggers fed from a JetStream stream (needs --local; docs/triggers.md)")
	fl.StringVar(&cfg.ScalingMode, "scaling-mode", "", "the registered functions' scaling mode: async, sync or dual (with --local, give workers --emergency-slots); default: the cluster's")
	fl.DurationVar(&cfg.StableWindow, "stable-window", 0, "the registered functions' autoscaler stable window (with the 30 s scale-to-zero grace, their keep-alive); 0: the cluster's 60 s")
	fl.StringVar(&cfg.Placement, "placement", "", "the registered functions' placement policy: "+strings.Join(spec.Placements, ", ")+"; default: the cluster's")
	var keepAlive string
	fl.StringVar(&keepAlive, "keep-alive", "", "the registered functions' keep-alive: POLICY, DURATION or POLICY:DURATION (gd:15m, ttl:5m); default: the cluster's")
	c.PreRunE = func(*cobra.Command, []string) error {
		if cfg.Placement != "" && !slices.Contains(spec.Placements, cfg.Placement) {
			return usageError{fmt.Errorf("--placement %q: want one of %v", cfg.Placement, spec.Placements)}
		}
		var err error
		cfg.KeepAlivePolicy, cfg.KeepAlive, err = keepAliveFlag(keepAlive)
		return err
	}
	fl.BoolVar(&dryRun, "dry-run", false, "print the schedule (function,offset_us,runtime_ms,memory_mb) as CSV and exit; no cluster")
	return c
}

// registerReplayFlags registers the trace and schedule flags of replay and
// bench modes.
func registerReplayFlags(fl *pflag.FlagSet, cfg *bench.ReplayConfig) {
	fl.IntVar(&cfg.Minutes, "minutes", 30, "measured minutes of the trace")
	fl.IntVar(&cfg.Warmup, "warmup", 0, "warm-up minutes before them (phase 1, not measured)")
	fl.IntVar(&cfg.StartMinute, "start-minute", 0, "trace minutes to skip at the start")
	fl.Float64Var(&cfg.TimeScale, "time-scale", 1, "multiply arrival times by this (0.1: a trace minute in 6 s); runtimes are not scaled")
	fl.Uint64Var(&cfg.Seed, "seed", 42, "random seed of the schedule")
	fl.StringVar(&cfg.IAT, "iat", "exponential", "inter-arrival times: exponential, uniform or equidistant, optionally with _shift")
	fl.StringVar(&cfg.Granularity, "granularity", "minute", "what a trace column counts: minute or second")
	fl.IntVar(&cfg.Functions, "functions", 0, "replay only the N busiest functions of the window (0: all)")
	fl.IntVar(&cfg.Replicate, "replicate", 0, "make K copies of every function, each with its own arrival and runtime draws: a synthetic trace K times the sample (100 × azure_500: 50,000 functions)")
	fl.IntVar(&cfg.SkipMinutes, "skip-minutes", 10, "first measured minutes the Dirigent and KubeDirect slowdown variants drop (0: none)")
	fl.DurationVar(&cfg.MaxRuntime, "max-runtime", 60*time.Second, "clamp drawn runtimes to at most this")
	fl.Int64Var(&cfg.MinSandboxMemoryMB, "min-sandbox-memory", 0, "raise every function's memory request (its sandboxes' limit) to at least this many MiB and keep each call's memory to a quarter of it: for real runtimes (containerd, native), where the loader's requests (largest memory / 10) are below a process's footprint; 0: the loader's requests")
}

package cli

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/loadgen/bench"
	"github.com/brisk-faas/brisk/internal/sim"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newSim() *cobra.Command {
	cfg := bench.ReplayConfig{}
	sc := sim.Config{}
	var out, keepAlive, calibrate string
	var modes []string
	var windows []time.Duration
	c := &cobra.Command{
		Use:   "sim TRACE_DIR",
		Short: "Simulate a trace replay on a virtual cluster with brisk's own control-plane code",
		Long: `Simulate brisk replay on a cluster of --nodes emulated workers, on a virtual
clock: the control plane's real reconciler (autoscaler, placement policy,
sandbox table) decides, emulated data planes queue and balance calls, and
emulated workers run them on processor-sharing cores (load makes calls
slower) after a cold start that is cheaper where the node already holds the
function's image. The schedule, the metrics and the outputs (summary.json,
invocations.csv, CDF plots) are replay's. A run is deterministic for --seed.
See docs/policies.md.`,
		Example: `  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 1000 --out results/sim-1000
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 100 --placement ch-rlu
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 1000 --placement kubernetes,ch-bl,ch-rlu --out results/compare
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 10000 --replicate 100 --out results/region`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cfg.TraceDir = args[0]
			if cfg.SkipMinutes == 0 {
				cfg.SkipMinutes = -1
			}
			if sc.Nodes <= 0 || sc.Nodes > 1_000_000 {
				return usageError{fmt.Errorf("--nodes %d: want 1..1000000", sc.Nodes)}
			}
			placements := strings.Split(sc.Placement, ",")
			for _, p := range placements {
				if !slices.Contains(spec.Placements, p) {
					return usageError{fmt.Errorf("--placement %q: want one of %v", p, spec.Placements)}
				}
			}
			if sc.EmergencySlots < 0 || sc.EmergencyStart < 0 || sc.EmergencyPercentile < 0 || sc.EmergencyPercentile > 100 {
				return usageError{fmt.Errorf("--emergency-slots, --emergency-start must not be negative, --emergency-percentile in [0, 100]")}
			}
			var err error
			if sc.KeepAlivePolicy, sc.KeepAlive, err = keepAliveFlag(keepAlive); err != nil {
				return err
			}
			sc.Seed = cfg.Seed
			if calibrate != "" {
				cal, err := bench.CalibrateFromFile(cfg, calibrate)
				if err != nil {
					return fmt.Errorf("--calibrate: %w", err)
				}
				sc.Overhead = cal.Overhead
				if !c.Flags().Changed("cold-start") && cal.ColdCalls > 0 {
					sc.ColdStart, sc.CachedColdStart = cal.ColdWait, min(sc.CachedColdStart, cal.ColdWait)
				}
				fmt.Fprintln(c.ErrOrStderr(), cal)
			}
			if len(modes) > 0 {
				return simModes(c, cfg, sc, modes, windows, out)
			}
			if len(placements) > 1 {
				text, err := bench.SimCompare(cfg, sc, placements, out)
				fmt.Fprint(c.OutOrStdout(), text)
				return err
			}
			_, text, err := bench.Sim(cfg, sc, out)
			fmt.Fprintln(c.OutOrStdout(), text)
			return err
		},
	}
	fl := c.Flags()
	registerReplayFlags(fl, &cfg)
	fl.StringVar(&cfg.ScalingMode, "scaling-mode", "", "the functions' scaling mode: async, sync or dual (a call finding no free sandbox is served by a one-shot emergency sandbox: --emergency-*)")
	fl.IntVar(&sc.EmergencySlots, "emergency-slots", 0, "dual mode: one-shot emergency sandboxes per node (0: two per --node-cores, as native-runtime workers offer)")
	fl.DurationVar(&sc.EmergencyStart, "emergency-start", 10*time.Millisecond, "dual mode: an emergency sandbox's start time (the native runtime's pooled shells: ~7–10 ms here)")
	fl.Float64Var(&sc.EmergencyPercentile, "emergency-percentile", 50, "dual mode's metric filter: an emergency call counts toward regular scaling when the keep-alive exceeds this percentile of the function's inter-arrival times over the last hour")
	fl.DurationVar(&cfg.StableWindow, "stable-window", 0, "the functions' autoscaler stable window; 0: 60 s")
	fl.IntVar(&sc.Nodes, "nodes", 100, "emulated worker nodes")
	fl.Float64Var(&sc.NodeCores, "node-cores", 16, "processor-sharing cores per node")
	fl.Int64Var(&sc.NodeMemMB, "node-memory-mb", 64<<10, "memory per node (placement capacity)")
	fl.StringVar(&sc.Placement, "placement", "kubernetes", "placement policy: kubernetes, random, round-robin, bin-packing, sharding, ch-bl, ch-rlu or locality; several, comma-separated, compare them (a run each under --out/<policy>/, one slowdown CDF, compare.md)")
	fl.DurationVar(&sc.ColdStart, "cold-start", 40*time.Millisecond, "sandbox creation time on a node without the function's image")
	fl.DurationVar(&sc.CachedColdStart, "cached-cold-start", 20*time.Millisecond, "sandbox creation time on a node that ran the function before")
	fl.DurationSliceVar(&sc.CallOverhead, "call-overhead", nil, "time added to every call's response beyond its runtime (the warm data path); several values: each call draws one")
	fl.StringVar(&calibrate, "calibrate", "", "a replay of the same schedule (its --out directory or invocations.csv): each call's overhead is drawn from the calls it sent at about the same time, and --cold-start, unless given, is its measured cold calls' median wait for a sandbox")
	fl.StringVar(&keepAlive, "keep-alive", "", "the functions' keep-alive: POLICY, DURATION or POLICY:DURATION (ttl, gd:5m); ttl's duration is the autoscaler's scale-down delay, gd's the longest an idle sandbox is kept (default gd, 15 min)")
	fl.StringVar(&out, "out", "", "directory for summary.json, invocations.csv and plots")
	fl.StringSliceVar(&modes, "modes", nil, "compare scaling modes (async, sync, dual) across --stable-windows, as PulseNet's Fig. 11: slowdown against memory, a run each under --out/<mode>-<window>/, --out/modes.csv and modes.png (keep-alive policy ttl)")
	fl.DurationSliceVar(&windows, "stable-windows", []time.Duration{6 * time.Second, time.Minute, 10 * time.Minute}, "with --modes: the stable windows swept (keep-alive = window + 30 s grace)")
	return c
}

// simModes runs the simulation once per mode and stable window and writes
// the comparison as brisk bench modes does.
func simModes(c *cobra.Command, cfg bench.ReplayConfig, sc sim.Config, modes []string, windows []time.Duration, out string) error {
	if out == "" {
		return usageError{fmt.Errorf("--modes needs --out DIR: each run writes its files under it")}
	}
	if err := checkModeSweep(modes, windows); err != nil {
		return err
	}
	var points []modePoint
	for _, w := range windows {
		for _, m := range modes {
			run, rsc := cfg, sc
			run.ScalingMode, run.StableWindow = m, w
			rsc.ScalingMode, rsc.StableWindow, rsc.KeepAlivePolicy, rsc.KeepAlive = m, w, spec.KeepAliveTTL, 0
			sum, text, err := bench.Sim(run, rsc, filepath.Join(out, m+"-"+w.String()))
			if err != nil {
				return fmt.Errorf("%s, stable window %s: %w", m, w, err)
			}
			fmt.Fprintf(c.ErrOrStderr(), "== %s, stable window %s\n%s\n", m, w, text)
			points = append(points, modePoint{mode: m, window: w, slowdown: sum.Slowdown.GeomeanP99, gbs: sum.TotalGBs,
				emergency: sum.Emergency.Sandboxes, failed: sum.Failed})
		}
	}
	return writeModes(c, out, points, modes)
}

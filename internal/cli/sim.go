package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/bench"
	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/internal/sim"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func newSim() *cobra.Command {
	cfg := bench.ReplayConfig{}
	sc := sim.Config{}
	var out, keepAlive, calibrate, templateFractions, lbs, lbAny string
	var keepAlives []string
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
function's image, and takes a few milliseconds where the node holds the
function's template (--template-fraction of the nodes do). The schedule,
the metrics and the outputs (summary.json, invocations.csv, CDF plots) are
replay's. A run is deterministic for --seed. See docs/policies.md.`,
		Example: `  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 1000 --out results/sim-1000
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 100 --placement ch-rlu
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 1000 --placement kubernetes,ch-bl,ch-rlu --out results/compare
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 1000 --node-cores 4 --concurrency 4 --replicate 50 --lb least-loaded,ch-bl,ch-rlu,p2c --out results/lb
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 10000 --replicate 100 --out results/region
  brisk sim ./traces/azure_500 --minutes 20 --warmup 10 --nodes 1000 --cold-start 150ms --cached-cold-start 150ms --template-fraction 0,0.1,0.5,1 --out results/templates`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cfg.TraceDir = args[0]
			sc.Stop = c.Context().Done() // Ctrl-C or SIGTERM ends the run
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
			if sc.Concurrency < 1 || sc.Concurrency > spec.DefaultCaps().MaxConcurrency {
				return usageError{fmt.Errorf("--concurrency %d: want 1..%d", sc.Concurrency, spec.DefaultCaps().MaxConcurrency)}
			}
			var balancers []string
			if lbAny != "" {
				if lbs != "" || len(placements) > 1 {
					return usageError{fmt.Errorf("--lb compares the data plane's policies and the locality balancers together: give no --load-balancing and one --placement")}
				}
				var err error
				if balancers, err = sim.ParseBalancers(lbAny); err != nil {
					return usageError{fmt.Errorf("--lb: %w", err)}
				}
				if len(balancers) == 1 {
					if err := sim.SetBalancer(&sc, balancers[0]); err != nil {
						return usageError{fmt.Errorf("--lb: %w", err)}
					}
				}
			}
			if lbs != "" {
				balancers = strings.Split(lbs, ",")
				for _, b := range balancers {
					if !slices.Contains(loadbalance.Names(), b) {
						return usageError{fmt.Errorf("--load-balancing %q: want one of %v", b, loadbalance.Names())}
					}
				}
				if len(balancers) > 1 && len(placements) > 1 {
					return usageError{fmt.Errorf("compare either placements or load-balancing policies, not both at once")}
				}
				sc.LoadBalancing = balancers[0]
			}
			if sc.EmergencySlots < 0 || sc.EmergencyStart < 0 || sc.EmergencyPercentile < 0 || sc.EmergencyPercentile > 100 {
				return usageError{fmt.Errorf("--emergency-slots, --emergency-start must not be negative, --emergency-percentile in [0, 100]")}
			}
			fractions, err := parseTemplateFractions(templateFractions)
			if err != nil {
				return err
			}
			if sc.TemplateStart <= 0 {
				return usageError{fmt.Errorf("--template-start %s: want a positive duration", sc.TemplateStart)}
			}
			if len(fractions) > 1 && (len(placements) > 1 || len(modes) > 0) {
				return usageError{fmt.Errorf("--template-fraction sweeps several fractions: give one --placement and no --modes")}
			}
			sc.TemplateFraction = fractions[0]
			var tr *templateRuns
			if c.Flags().Changed("template-fraction") {
				tr = observeTemplates(&sc)
			}
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
			if len(fractions) > 1 {
				return simTemplates(c, cfg, sc, fractions, out)
			}
			if len(modes) > 0 {
				return simModes(c, cfg, sc, tr, modes, windows, out)
			}
			if len(keepAlives) > 0 {
				var kas []bench.KeepAlive
				for _, v := range keepAlives {
					p, d, err := keepAliveFlag(v)
					if err != nil {
						return err
					}
					kas = append(kas, bench.KeepAlive{Name: v, Policy: p, Value: d})
				}
				text, err := bench.SimKeepAlives(cfg, sc, kas, out)
				fmt.Fprint(c.OutOrStdout(), text)
				return err
			}
			if len(balancers) > 1 {
				axis := "load-balancing"
				if lbAny != "" {
					axis = "lb"
				}
				text, err := bench.SimCompareBy(cfg, sc, axis, balancers, out)
				fmt.Fprint(c.OutOrStdout(), text)
				return err
			}
			if len(placements) > 1 {
				text, err := bench.SimCompare(cfg, sc, placements, out)
				if err == nil && tr != nil {
					var b strings.Builder
					for i, p := range placements {
						dir := ""
						if out != "" {
							dir = filepath.Join(out, p)
						}
						fmt.Fprintf(&b, "%s: %s\n", p, tr.runs[i].line())
						err = errors.Join(err, tr.runs[i].addToSummary(dir))
					}
					text += b.String()
				}
				fmt.Fprint(c.OutOrStdout(), text)
				return err
			}
			var timer *sim.Result
			if sc.Triggers {
				sc.OnResult = func(r *sim.Result) { timer = r }
			}
			_, text, err := bench.Sim(cfg, sc, out)
			if err == nil && timer != nil {
				text += fmt.Sprintf("\n  timer functions (cron triggers%s): %d; measured calls %d, cold starts %d", map[bool]string{true: ", not pre-warmed", false: ", pre-warmed"}[sc.NoPrewarm],
					timer.TimerFunctions, timer.TimerCalls, timer.TimerColdStarts)
			}
			if err == nil && tr != nil {
				text += "\n  " + tr.last().line()
				err = tr.last().addToSummary(out)
			}
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
	fl.IntVar(&sc.Concurrency, "concurrency", 1, "concurrent calls per sandbox of every trace function (1, as the loader's functions; above 1 the load-balancing policies differ)")
	fl.StringVar(&lbAny, "lb", "", "load balancing as the papers compare it, as `brisk fn deploy --lb` takes it: a data-plane policy ("+strings.Join(loadbalance.Names(), ", ")+", p2c for power-of-two) or a locality balancer ("+strings.Join(sim.LocalityBalancers, ", ")+"), which in brisk places sandboxes (that run's --placement, with the data plane's default policy); several, comma-separated, compare them (a run each under --out/<name>/, compare.md)")
	fl.StringVar(&lbs, "load-balancing", "", "the data plane's choice of sandbox for each call, a policy of brisk's data plane: "+strings.Join(loadbalance.Names(), ", ")+"; several, comma-separated, compare them (a run each under --out/<policy>/, compare.md); default: the data plane's default, least-loaded with random ties (drawn from --seed)")
	fl.StringVar(&sc.Placement, "placement", "kubernetes", "placement policy: kubernetes, random, round-robin, bin-packing, sharding, ch-bl, ch-rlu or locality; several, comma-separated, compare them (a run each under --out/<policy>/, one slowdown CDF, compare.md)")
	fl.DurationVar(&sc.ColdStart, "cold-start", 40*time.Millisecond, "sandbox creation time on a node without the function's image")
	fl.DurationVar(&sc.CachedColdStart, "cached-cold-start", 20*time.Millisecond, "sandbox creation time on a node that ran the function before")
	fl.DurationSliceVar(&sc.CallOverhead, "call-overhead", nil, "time added to every call's response beyond its runtime (the warm data path); several values: each call draws one")
	fl.StringVar(&calibrate, "calibrate", "", "a replay of the same schedule (its --out directory or invocations.csv): each call's overhead is drawn from the calls it sent at about the same time, and --cold-start, unless given, is its measured cold calls' median wait for a sandbox")
	fl.StringVar(&keepAlive, "keep-alive", "", "the functions' keep-alive: POLICY, DURATION or POLICY:DURATION (ttl, gd:5m, hybrid); ttl's duration is the autoscaler's scale-down delay, gd's the longest an idle sandbox is kept (default gd, 15 min), hybrid's the keep-alive of a function whose idle times do not yet say (docs/policies.md)")
	fl.StringVar(&out, "out", "", "directory for summary.json, invocations.csv and plots")
	fl.StringSliceVar(&modes, "modes", nil, "compare scaling modes (async, sync, dual) across --stable-windows, as PulseNet's Fig. 11: slowdown against memory, a run each under --out/<mode>-<window>/, --out/modes.csv and modes.png (keep-alive policy ttl)")
	fl.StringSliceVar(&keepAlives, "keep-alives", nil, "compare keep-alive settings (as --keep-alive: ttl, gd:15m, hybrid): a run each under --out/<setting>/, --out/keepalive.md and keepalive.png (cold starts against memory)")
	fl.BoolVar(&sc.Triggers, "triggers", false, "the trace's timer-triggered functions are cron triggers: each minute's calls fire at its start, and the functions are pre-warmed before each tick as the control plane does (docs/triggers.md); prints their measured calls and cold starts")
	fl.BoolVar(&sc.NoPrewarm, "no-prewarm", false, "with --triggers: no pre-warming (the ticks only)")
	fl.StringVar(&templateFractions, "template-fraction", "0", "functions from Python source: the fraction of the nodes holding each function's template (chosen per function by rendezvous hashing; placement does not prefer them), where a sandbox forks in --template-start instead of a fresh start (--cold-start); 0: no templates, 1: every node; several, comma-separated, compare them (a run each under --out/template-<F>/, compare.md)")
	fl.DurationVar(&sc.TemplateStart, "template-start", sim.DefaultTemplateStart, "a sandbox's start from its function's template on a node holding it (an emergency sandbox's there too, instead of --emergency-start)")
	fl.DurationSliceVar(&windows, "stable-windows", []time.Duration{6 * time.Second, time.Minute, 10 * time.Minute}, "with --modes: the stable windows swept (keep-alive = window + 30 s grace)")
	return c
}

// simModes runs the simulation once per mode and stable window and writes
// the comparison as brisk bench modes does.
func simModes(c *cobra.Command, cfg bench.ReplayConfig, sc sim.Config, tr *templateRuns, modes []string, windows []time.Duration, out string) error {
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
			dir := filepath.Join(out, m+"-"+w.String())
			sum, text, err := bench.Sim(run, rsc, dir)
			if err == nil && tr != nil {
				text += "\n  " + tr.last().line()
				err = tr.last().addToSummary(dir)
			}
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

// parseTemplateFractions reads --template-fraction: one fraction of the
// nodes in [0, 1], or several, comma-separated.
func parseTemplateFractions(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v >= 0 && v <= 1) {
			return nil, usageError{fmt.Errorf("--template-fraction %q: want fractions in [0, 1], comma-separated", s)}
		}
		out = append(out, v)
	}
	return out, nil
}

// templateRun is what one run's templates did, from the simulator's result
// (bench.Sim's summary does not carry it).
type templateRun struct {
	fraction float64
	start    time.Duration
	nodes    int  // holding each function's template
	aware    bool // the placement policy prefers template nodes
	// starts of regular sandboxes from a template, of created; emergency
	// sandboxes from a template.
	starts, created, emergency int64
	// p50 is the geometric mean over functions of each function's median
	// slowdown (the measured phase's completed calls, as the p99 headline);
	// p99 is each function's p99 slowdown (the CDF).
	p50 float64
	p99 []float64
}

// templateRuns collects a templateRun per simulation, in order.
type templateRuns struct{ runs []templateRun }

func (t *templateRuns) last() *templateRun { return &t.runs[len(t.runs)-1] }

// observeTemplates makes every run of sc report its templates to the
// returned collector (sc's fraction and start: set them first).
func observeTemplates(sc *sim.Config) *templateRuns {
	t := &templateRuns{}
	fraction, start := sc.TemplateFraction, sc.TemplateStart
	aware := sc.Placement == placement.NameLocality
	sc.OnResult = func(res *sim.Result) {
		_, pf := workload.Slowdowns(res.Records, workload.SlowdownOptions{})
		t.runs = append(t.runs, templateRun{fraction: fraction, start: start, nodes: res.TemplateNodes, aware: aware, starts: res.TemplateStarts,
			created: res.SandboxesCreated, emergency: res.EmergencyTemplateStarts, p50: medianSlowdownGeomean(res.Records), p99: pf.P99})
	}
	return t
}

// medianSlowdownGeomean is the geometric mean over functions of each
// function's median slowdown, over the calls workload.Slowdowns' p99
// headline counts (completed, measured phase).
func medianSlowdownGeomean(recs []workload.Record) float64 {
	byFn := map[string][]float64{}
	for i := range recs {
		r := &recs[i]
		if r.Phase != 2 || !r.OK() || r.RequestedUs <= 0 || r.ResponseUs <= 0 {
			continue
		}
		byFn[r.Function] = append(byFn[r.Function], float64(r.ResponseUs)/float64(r.RequestedUs))
	}
	if len(byFn) == 0 {
		return 0
	}
	var sum float64
	for _, name := range slices.Sorted(maps.Keys(byFn)) {
		v := byFn[name]
		slices.Sort(v)
		sum += math.Log(workload.Percentile(v, 50))
	}
	return math.Exp(sum / float64(len(byFn)))
}

func (r *templateRun) hitRate() float64 {
	if r.created == 0 {
		return 0
	}
	return float64(r.starts) / float64(r.created)
}

// line is the run's templates for the text summary.
func (r *templateRun) line() string {
	if r.nodes == 0 {
		return "templates: none (fraction 0)"
	}
	s := fmt.Sprintf("templates: fraction %g (%d nodes per function), start %s: %d of %d sandboxes created from a template (hit rate %.1f%%)",
		r.fraction, r.nodes, r.start, r.starts, r.created, 100*r.hitRate())
	if r.emergency > 0 {
		s += fmt.Sprintf(", %d emergency sandboxes", r.emergency)
	}
	return s
}

// templateSummary is summary.json's "templates" block.
type templateSummary struct {
	Fraction         float64 `json:"fraction"`
	NodesPerFunction int     `json:"nodes_per_function"`
	StartMs          float64 `json:"start_ms"`
	// Starts counts the regular sandboxes that forked a template, of
	// SandboxesCreated; HitRate is their ratio.
	Starts           int64   `json:"starts"`
	SandboxesCreated int64   `json:"sandboxes_created"`
	HitRate          float64 `json:"hit_rate"`
	EmergencyStarts  int64   `json:"emergency_starts"`
	// PlacementAware: the placement policy prefers the nodes that hold a
	// function's template (locality, which nodes' heartbeats inform);
	// the other policies place as without templates.
	PlacementAware     bool    `json:"placement_aware"`
	SlowdownGeomeanP50 float64 `json:"slowdown_geomean_p50"`
}

// addToSummary adds the "templates" block to dir/summary.json, leaving
// the rest of bench's file as it wrote it ("" writes nothing).
func (r *templateRun) addToSummary(dir string) error {
	if dir == "" {
		return nil
	}
	path := filepath.Join(dir, "summary.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	body := bytes.TrimRight(b, " \n")
	if !bytes.HasSuffix(body, []byte("}")) {
		return fmt.Errorf("%s: not a JSON object", path)
	}
	block, err := json.MarshalIndent(templateSummary{Fraction: r.fraction, NodesPerFunction: r.nodes, StartMs: float64(r.start) / 1e6,
		Starts: r.starts, SandboxesCreated: r.created, HitRate: r.hitRate(), EmergencyStarts: r.emergency, PlacementAware: r.aware,
		SlowdownGeomeanP50: r.p50}, "  ", "  ")
	if err != nil {
		return err
	}
	var out bytes.Buffer
	out.Write(bytes.TrimRight(body[:len(body)-1], " \n"))
	out.WriteString(",\n  \"templates\": ")
	out.Write(block)
	out.WriteString("\n}\n")
	if !json.Valid(out.Bytes()) {
		return fmt.Errorf("%s: adding the templates block made invalid JSON", path)
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// simTemplates runs the simulation once per template fraction: each run's
// outputs under out/template-<F>/, and a table (compare.md) and the
// per-function p99 slowdown CDF (slowdown_cdf.png) of the runs in out.
func simTemplates(c *cobra.Command, cfg bench.ReplayConfig, sc sim.Config, fractions []float64, out string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| template fraction | template nodes per function | slowdown gmean p50 | slowdown gmean p99 | cold starts (measured) | sandboxes created | template hit rate | memory GiB·s | wall s |\n|---|---|---|---|---|---|---|---|---|\n")
	var series []loadgen.Series
	for _, f := range fractions {
		rsc := sc
		rsc.TemplateFraction = f
		tr := observeTemplates(&rsc)
		name := strconv.FormatFloat(f, 'g', -1, 64)
		dir := ""
		if out != "" {
			dir = filepath.Join(out, "template-"+name)
		}
		sum, text, err := bench.Sim(cfg, rsc, dir)
		if err == nil {
			text += "\n  " + tr.last().line()
			err = tr.last().addToSummary(dir)
		}
		if err != nil {
			return fmt.Errorf("template fraction %s: %w", name, err)
		}
		fmt.Fprintf(c.ErrOrStderr(), "== template fraction %s\n%s\n", name, text)
		r := tr.last()
		fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %d | %d | %.3f | %.0f | %.1f |\n", name, r.nodes, r.p50, sum.Slowdown.GeomeanP99,
			sum.ColdStarts, sum.SandboxesCreated, r.hitRate(), sum.MemoryCost.GBs, sum.Sim.WallSeconds)
		series = append(series, loadgen.Series{Name: "template fraction " + name, Values: r.p99})
	}
	fmt.Fprint(c.OutOrStdout(), b.String())
	if out == "" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(out, "compare.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	title := fmt.Sprintf("per-function p99 slowdown, %d nodes, templates on a fraction of them", sc.Nodes)
	return loadgen.PlotCDF(filepath.Join(out, "slowdown_cdf.png"), title, "slowdown (response / requested)", true, series...)
}

package cli

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/bench"
	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// modePoint is one replay of the comparison.
type modePoint struct {
	mode      string
	window    time.Duration
	slowdown  float64 // geomean of per-function p99
	gbs       float64 // total memory, emergency sandboxes included
	emergency int64
	failed    int
}

func newBenchModes(g *globals) *cobra.Command {
	f := &benchFlags{}
	cfg := bench.ReplayConfig{}
	var modes []string
	var windows []time.Duration
	var merge bool
	c := &cobra.Command{
		Use:   "modes TRACE_DIR --out DIR",
		Short: "Compare the scaling modes (async, sync, dual) on a trace across keep-alives: slowdown against memory",
		Long: `Replay TRACE_DIR once per scaling mode and stable window (a fresh local
cluster each time with --local) and compare them as PulseNet's Fig. 11 does:
the geometric mean of per-function p99 slowdown against the memory cost
(GiB·s of regular sandboxes plus the dual track's emergency sandboxes),
normalized to the cheapest run. A function's keep-alive is its stable window
plus the 30 s scale-to-zero grace. Writes DIR/<mode>-<window>/ (each
replay's files), DIR/modes.csv and DIR/modes.png.

With --merge it replays nothing: it reads the summary.json of each
DIR/<mode>-<window>/ that earlier runs wrote (for instance one run per
mode and window, each on a fresh cluster, as
scripts/bench-modes-pairing.sh does) and writes modes.csv and modes.png
from them.`,
		Example: `  brisk bench modes traces/azure_100 --minutes 5 --time-scale 0.5 --local --workers 4 --emergency-slots 8 --out results/modes`,
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if f.out == "" {
				return usageError{fmt.Errorf("--out DIR is required: each replay writes its files under it")}
			}
			if err := checkModeSweep(modes, windows); err != nil {
				return err
			}
			cfg.TraceDir = args[0]
			if cfg.SkipMinutes == 0 {
				cfg.SkipMinutes = -1
			}
			if _, err := cfg.Schedule(); err != nil && !merge {
				return usageError{err}
			}
			base := f.out
			var points []modePoint
			for _, w := range windows {
				for _, m := range modes {
					if merge {
						p, err := readModePoint(filepath.Join(base, m+"-"+w.String()), m, w)
						if err != nil {
							return err
						}
						points = append(points, p)
						continue
					}
					run := cfg
					// The stable window is the keep-alive swept here:
					// Knative's ttl, not gd's 15 minutes.
					run.ScalingMode, run.StableWindow, run.KeepAlivePolicy = m, w, spec.KeepAliveTTL
					f.out = filepath.Join(base, m+"-"+w.String())
					fmt.Fprintf(c.ErrOrStderr(), "== %s, stable window %s\n", m, w)
					var sum *bench.ReplaySummary
					err := f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
						s, text, err := bench.Replay(ctx, cl, o, run)
						sum = s
						return text, err
					})
					if err != nil {
						return fmt.Errorf("%s, stable window %s: %w", m, w, err)
					}
					points = append(points, modePoint{mode: m, window: w, slowdown: sum.Slowdown.GeomeanP99, gbs: sum.TotalGBs,
						emergency: sum.Emergency.Sandboxes, failed: sum.Failed})
				}
			}
			f.out = base
			return writeModes(c, base, points, modes)
		},
	}
	f.register(c, 4, 40*time.Millisecond)
	fl := c.Flags()
	registerReplayFlags(fl, &cfg)
	fl.StringSliceVar(&modes, "modes", []string{spec.ModeAsync, spec.ModeSync, spec.ModeDual}, "scaling modes to compare")
	fl.DurationSliceVar(&windows, "stable-windows", []time.Duration{6 * time.Second, time.Minute, 10 * time.Minute}, "stable windows to replay each mode with (keep-alive = window + 30 s grace)")
	fl.BoolVar(&merge, "merge", false, "replay nothing: compare the runs already under --out (DIR/<mode>-<window>/summary.json)")
	return c
}

// readModePoint reads one earlier replay's summary.json.
func readModePoint(dir, mode string, window time.Duration) (modePoint, error) {
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		return modePoint{}, fmt.Errorf("--merge: %w", err)
	}
	var sum bench.ReplaySummary
	if err := json.Unmarshal(b, &sum); err != nil {
		return modePoint{}, fmt.Errorf("--merge: %s: %w", filepath.Join(dir, "summary.json"), err)
	}
	if sum.Config.ScalingMode != mode || time.Duration(sum.Config.StableWindowS*float64(time.Second)) != window {
		return modePoint{}, fmt.Errorf("--merge: %s holds a %s run with stable window %gs, not %s with %s", dir, sum.Config.ScalingMode, sum.Config.StableWindowS, mode, window)
	}
	return modePoint{mode: mode, window: window, slowdown: sum.Slowdown.GeomeanP99, gbs: sum.TotalGBs,
		emergency: sum.Emergency.Sandboxes, failed: sum.Failed}, nil
}

// checkModeSweep checks --modes and --stable-windows of a mode comparison
// (brisk bench modes, brisk sim --modes).
func checkModeSweep(modes []string, windows []time.Duration) error {
	for _, m := range modes {
		if !slices.Contains(spec.ScalingModes, m) {
			return usageError{fmt.Errorf("--modes: %q: want some of %v", m, spec.ScalingModes)}
		}
	}
	for _, w := range windows {
		if w < time.Second || w > time.Hour || w%time.Second != 0 {
			return usageError{fmt.Errorf("--stable-windows: %s: want whole seconds in [1s, 1h]", w)}
		}
	}
	return nil
}

// writeModes writes modes.csv and modes.png and prints the table.
func writeModes(c *cobra.Command, dir string, points []modePoint, modes []string) error {
	cheapest := math.Inf(1)
	for _, p := range points {
		if p.gbs > 0 {
			cheapest = min(cheapest, p.gbs)
		}
	}
	norm := func(p modePoint) float64 {
		if math.IsInf(cheapest, 1) {
			return math.NaN()
		}
		return p.gbs / cheapest
	}
	f, err := os.Create(filepath.Join(dir, "modes.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"mode", "stable_window_s", "keep_alive_s", "slowdown_geomean_p99", "memory_gb_s", "memory_normalized", "emergency_sandboxes", "failed"})
	tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tWINDOW\tKEEP-ALIVE\tSLOWDOWN (gmean p99)\tMEMORY GiB·s\tNORMALIZED\tEMERGENCY\tFAILED")
	series := map[string]*loadgen.XYSeries{}
	for _, p := range points {
		ka := p.window + 30*time.Second
		_ = w.Write([]string{p.mode, strconv.Itoa(int(p.window.Seconds())), strconv.Itoa(int(ka.Seconds())),
			strconv.FormatFloat(p.slowdown, 'f', 4, 64), strconv.FormatFloat(p.gbs, 'f', 2, 64),
			strconv.FormatFloat(norm(p), 'f', 3, 64), strconv.FormatInt(p.emergency, 10), strconv.Itoa(p.failed)})
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%.1f\t%.2f\t%d\t%d\n", p.mode, p.window, ka, p.slowdown, p.gbs, norm(p), p.emergency, p.failed)
		s := series[p.mode]
		if s == nil {
			s = &loadgen.XYSeries{Name: p.mode}
			series[p.mode] = s
		}
		s.X, s.Y = append(s.X, norm(p)), append(s.Y, p.slowdown)
	}
	w.Flush()
	if err := errors.Join(w.Error(), f.Close(), tw.Flush()); err != nil {
		return err
	}
	var list []loadgen.XYSeries
	for _, m := range modes {
		if s := series[m]; s != nil {
			list = append(list, *s)
		}
	}
	title := "slowdown vs memory across keep-alives (" + strings.Join(modes, ", ") + ")"
	if err := loadgen.PlotTradeoff(filepath.Join(dir, "modes.png"), title, "memory cost, normalized to the cheapest run", "geomean of per-function p99 slowdown", list...); err != nil {
		return err
	}
	fmt.Fprintf(c.ErrOrStderr(), "results in %s (modes.csv, modes.png)\n", dir)
	return nil
}

package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Options are shared by every benchmark.
type Options struct {
	// Out is the directory for the CSV, summary.json and plots; "" writes
	// nothing.
	Out string
	// Progress is where a progress bar is drawn when it is a terminal.
	Progress *os.File
	// Log receives a few lines about what the benchmark is doing; nil
	// discards them.
	Log io.Writer
	// HTTP configures the load generator's client.
	HTTP loadgen.HTTPOptions
	// Lateness is the limit beyond which a run is refused.
	Lateness loadgen.Lateness
	// Force writes and prints a refused run's numbers anyway (still marked
	// "valid": false).
	Force bool
	// Clients is the number of concurrent admin-API clients used to set
	// functions up (and, for bench register, the measured clients).
	Clients int
	// Keep leaves the functions a benchmark registered on an existing
	// cluster; by default they are deleted at the end.
	Keep bool
	// Grace bounds the wait for replies after the last send.
	Grace time.Duration
}

func (o *Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

func (o *Options) clients() int { return cmp.Or(o.Clients, 16) }

// Validity is stamped on every summary: a run whose load generator fell
// behind is not a measurement of brisk.
type Validity struct {
	Valid   bool   `json:"valid"`
	Refused string `json:"refused,omitempty"`
}

// ErrRefused is returned (wrapped) for a run refused because its sends
// fell behind; its files are written all the same, marked invalid.
var ErrRefused = errors.New("run refused")

func validity(o *Options, recs []workload.Record) (Validity, error) {
	lim := o.Lateness
	if lim == (loadgen.Lateness{}) {
		lim = loadgen.DefaultLateness
	}
	if err := lim.Check(recs); err != nil {
		v := Validity{Refused: err.Error()}
		if o.Force {
			return v, nil
		}
		return v, fmt.Errorf("%w: %w (rerun at a lower rate, or with --force to see its numbers)", ErrRefused, err)
	}
	return Validity{Valid: true}, nil
}

// runID distinguishes one benchmark's function names from another's on a
// shared cluster.
func runID() string { return strconv.FormatUint(rand.Uint64()%(36*36*36*36), 36) }

// regResult is one acknowledged (or failed) registration.
type regResult struct {
	Start   time.Time
	Latency time.Duration
	Err     error
}

// registerAll registers fns with n concurrent clients, each taking the next
// function. With update, a 409 becomes a PUT of the same spec. The specs are
// encoded before the first is sent and the answers not decoded: what is
// timed is the control plane's work, not the generator's.
func registerAll(ctx context.Context, cl *client.Client, fns []*spec.Function, n int, update bool, done *atomic.Int64) []regResult {
	out := make([]regResult, len(fns))
	bodies := make([][]byte, len(fns))
	for i, f := range fns {
		b, err := json.Marshal(f)
		if err != nil {
			for i := range out {
				out[i].Err = err
			}
			return out
		}
		bodies[i] = b
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, len(fns)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(fns) || ctx.Err() != nil {
					return
				}
				start := time.Now()
				err := cl.CreateJSON(ctx, bodies[i])
				if update && client.IsConflict(err) {
					_, err = cl.Update(ctx, fns[i])
				}
				out[i] = regResult{Start: start, Latency: time.Since(start), Err: err}
				if done != nil {
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return out
}

func firstError(rs []regResult, what string) error {
	failed := 0
	var first error
	for _, r := range rs {
		if r.Err != nil {
			failed++
			first = cmp.Or(first, r.Err)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%s: %d of %d failed, first: %w", what, failed, len(rs), first)
	}
	return nil
}

// cleanup deletes the named functions from an existing cluster (a local
// one disappears anyway).
func cleanup(c *Cluster, o *Options, names []string) {
	if c.IsLocal() || o.Keep || len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range min(o.clients(), len(names)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(names) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := c.Client.Delete(ctx, names[i]); err != nil && !client.IsNotFound(err) {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		o.logf("cleanup: %d of %d functions could not be deleted", f, len(names))
	}
}

// waitReady polls a function until n of its sandboxes are ready.
func (c *Cluster) waitReady(ctx context.Context, name string, n int, timeout time.Duration) (*api.FunctionView, error) {
	var v *api.FunctionView
	err := poll(ctx, timeout, 20*time.Millisecond, func() (bool, error) {
		var err error
		v, err = c.Client.Get(ctx, name)
		return err == nil && v.Status.Ready >= n, err
	}, func() string { return fmt.Sprintf("function %s to have %d ready sandboxes", name, n) })
	return v, err
}

// writeOutputs writes summary.json, the records CSVs and the plots into
// dir, creating it.
func writeOutputs(dir string, summary any, csvs map[string][]workload.Record, plots []plotSpec) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, recs := range csvs {
		if err := writeFile(filepath.Join(dir, name), func(w io.Writer) error { return workload.WriteRecords(w, recs) }); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(dir, "summary.json"), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(summary)
	}); err != nil {
		return err
	}
	for _, p := range plots {
		if err := loadgen.PlotCDF(filepath.Join(dir, p.file), p.title, p.xLabel, p.logX, p.series...); err != nil {
			return err
		}
	}
	return nil
}

type plotSpec struct {
	file, title, xLabel string
	logX                bool
	series              []loadgen.Series
}

func writeFile(path string, f func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f(fh); err != nil {
		fh.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return fh.Close()
}

// latencies returns the response times (ms) of completed measured calls.
func latencies(recs []workload.Record) []float64 {
	var out []float64
	for i := range recs {
		if r := &recs[i]; r.Phase == 2 && r.OK() {
			out = append(out, float64(r.ResponseUs)/1000)
		}
	}
	return out
}

// formatLoad is the short human summary of a load run. A refused run shows
// no latencies unless forced: they measure the generator, not brisk.
func formatLoad(name string, s *workload.Summary, v Validity, force bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d issued, %d ok, %d failed", name, s.Issued, s.Completed, s.Failed)
	if len(s.Statuses) > 1 || s.Statuses["200"] != s.Issued {
		fmt.Fprintf(&b, " %v", s.Statuses)
	}
	if s.LatenessMs.Max > 0 { // a closed loop has no schedule to be late for
		fmt.Fprintf(&b, "; sends late p99 %.2f ms max %.1f ms", s.LatenessMs.P99, s.LatenessMs.Max)
	}
	if !v.Valid {
		fmt.Fprintf(&b, "\n  REFUSED: %s", v.Refused)
		if !force {
			return b.String()
		}
	}
	fmt.Fprintf(&b, "\n  throughput %.0f req/s; latency ms p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f",
		s.ThroughputRPS, s.LatencyMs.P50, s.LatencyMs.P90, s.LatencyMs.P99, s.LatencyMs.P999, s.LatencyMs.Max)
	return b.String()
}

// newIssuer returns an issuer for calls through invoker, with o's limits.
func newIssuer(o *Options, inv loadgen.Invoker) *loadgen.Issuer {
	return &loadgen.Issuer{Invoker: inv, Grace: o.Grace}
}

// issue runs calls with a progress bar.
func issue(ctx context.Context, o *Options, label string, is *loadgen.Issuer, calls []loadgen.Call) ([]workload.Record, error) {
	bar := loadgen.StartProgress(o.Progress, label, int64(len(calls)), func() (int64, string) {
		return is.Issued(), fmt.Sprintf("done %d", is.Done())
	})
	recs, err := is.Run(ctx, calls)
	bar.Stop()
	return recs, err
}

// load is how a run sends its calls to names: open-loop at rate, or with
// closed closed-loop callers.
type load struct {
	rate   float64
	closed int
	names  []string
	execMs int
}

// send sends one run of l through inv, warm-up calls first.
func (l load) send(ctx context.Context, o *Options, label string, inv loadgen.Invoker, warmup, d time.Duration) ([]workload.Record, error) {
	if l.closed > 0 {
		return closedLoop(ctx, o, label, &loadgen.ClosedLoop{Invoker: inv, Callers: l.closed, Warmup: warmup,
			Duration: d, Functions: l.names, RuntimeMs: l.execMs, Grace: o.Grace})
	}
	return issue(ctx, o, label, newIssuer(o, inv), constantRate(l.names, l.rate, warmup, d, l.execMs))
}

// title names the load in a plot's title.
func (l load) title(what string) string {
	if l.closed > 0 {
		return fmt.Sprintf("%s, %d closed-loop callers", what, l.closed)
	}
	return fmt.Sprintf("%s at %g req/s", what, l.rate)
}

// closedLoop runs cl with a progress bar. A closed loop cannot fall behind
// a schedule, so its runs are always valid.
func closedLoop(ctx context.Context, o *Options, label string, cl *loadgen.ClosedLoop) ([]workload.Record, error) {
	total := int64((cl.Warmup + cl.Duration) / time.Millisecond)
	start := time.Now()
	bar := loadgen.StartProgress(o.Progress, label, total, func() (int64, string) {
		return min(int64(time.Since(start)/time.Millisecond), total), fmt.Sprintf("done %d", cl.Done())
	})
	recs, err := cl.Run(ctx)
	bar.Stop()
	return recs, err
}

// HostInfo records how busy the machine was: on a shared host a number
// means little without it.
type HostInfo struct {
	CPUs        int     `json:"cpus"`
	GOMAXPROCS  int     `json:"gomaxprocs"`
	Load1Before float64 `json:"load1_before"`
	Load1After  float64 `json:"load1_after"`
	// CPUPressure is the share of the run's wall time in which some task
	// on the host waited for a CPU (Linux PSI, /proc/pressure/cpu "some");
	// -1 where PSI is unavailable. Near 0 means a quiet host.
	CPUPressure float64 `json:"cpu_pressure_some"`
	// ProcessCores is the CPU time this process (load generator and, with
	// --local, the whole cluster) used over the run, per second of wall time.
	ProcessCores float64 `json:"process_cores"`
}

// hostInfo samples the load now and returns a func that completes the
// record at the end of the run.
func hostInfo() func() HostInfo {
	h := HostInfo{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Load1Before: load1(), CPUPressure: -1}
	start, psi0, cpu0 := time.Now(), psiSomeTotal(), processCPU()
	return func() HostInfo {
		h.Load1After = load1()
		h.ProcessCores = (processCPU() - cpu0).Seconds() / time.Since(start).Seconds()
		if psi1 := psiSomeTotal(); psi0 >= 0 && psi1 >= psi0 {
			h.CPUPressure = float64(psi1-psi0) / float64(time.Since(start).Microseconds())
		}
		return h
	}
}

// processCPU is the user and system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// psiSomeTotal is the "some" total (µs) of /proc/pressure/cpu, or -1.
func psiSomeTotal() int64 {
	data, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "total="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// load1 is the 1-minute load average, or -1 where /proc/loadavg is absent.
func load1() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func (h HostInfo) String() string {
	return fmt.Sprintf("host: %d CPUs, load average %.1f before, %.1f after; CPU pressure (PSI some) %.0f%% of the run; this process used %.2f cores",
		h.CPUs, h.Load1Before, h.Load1After, 100*h.CPUPressure, h.ProcessCores)
}

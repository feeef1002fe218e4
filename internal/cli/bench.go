package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/bench"
	"github.com/brisk-faas/brisk/internal/loadgen"
)

// benchFlags are the flags every benchmark and replay share: which cluster,
// where results go, and the load generator's limits.
type benchFlags struct {
	local            bool
	runtime          string
	workers          int
	createDelay      time.Duration
	nodeCPU          string
	nodeMemoryMB     int64
	out              string
	h2c, force, keep bool
	noTLS            bool
	emergencySlots   int
	clients          int
	maxLate          time.Duration
	maxLateFraction  float64
	grace            time.Duration
	cpuProfile       string
	memProfile       string
	// async gives a --local cluster an asynchronous-call queue (embedded
	// NATS); natsSyncAlways makes it fsync every write.
	async, natsSyncAlways bool
}

func (f *benchFlags) register(c *cobra.Command, workers int, createDelay time.Duration) {
	fl := c.Flags()
	fl.BoolVar(&f.local, "local", false, "start a one-process cluster for the run instead of using --admin-url/--invoke-url")
	fl.StringVar(&f.runtime, "runtime", "emulated", "with --local: sandbox runtime, emulated or process")
	fl.IntVar(&f.workers, "workers", workers, "with --local: emulated worker nodes")
	fl.DurationVar(&f.createDelay, "create-delay", createDelay, "with --local --runtime emulated: sandbox creation delay")
	fl.StringVar(&f.nodeCPU, "node-cpu", "", "with --local: CPU per node, e.g. 64 or 1500m (emulated default 1000 cores, process default all cores)")
	fl.Int64Var(&f.nodeMemoryMB, "node-memory", 0, "with --local: memory per node in MiB (emulated default 4 TiB, process default all memory)")
	fl.IntVar(&f.emergencySlots, "emergency-slots", 0, "with --local: one-shot emergency sandboxes per node for dual-mode functions (0: none)")
	fl.BoolVar(&f.noTLS, "insecure-no-tls", false, "with --local: plaintext gRPC between the components (default: mutual TLS with the cluster CA, as brisk up)")
	fl.BoolVar(&f.keep, "keep", false, "on an existing cluster, keep the functions the run registered")
	fl.IntVar(&f.clients, "clients", 16, "concurrent admin API clients (registration, updates)")
	f.registerLoad(c)
}

// registerLoad registers the load generator's flags (all a run without a
// brisk cluster needs).
func (f *benchFlags) registerLoad(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.out, "out", "", "directory for the per-call CSV, summary.json and PNG plots")
	fl.BoolVar(&f.h2c, "h2c", false, "send calls over HTTP/2 without TLS instead of HTTP/1.1")
	fl.BoolVar(&f.force, "force", false, "report a run even if the load generator fell behind (summary.json still says \"valid\": false)")
	fl.DurationVar(&f.maxLate, "max-late", loadgen.DefaultLateness.Late, "a send later than this counts as late")
	fl.Float64Var(&f.maxLateFraction, "max-late-fraction", loadgen.DefaultLateness.MaxFraction, "refuse a run with more late sends than this fraction")
	fl.DurationVar(&f.grace, "grace", loadgen.DefaultGrace, "how long to wait for replies after the last send")
	fl.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (with --local: the whole cluster too) to the file")
	fl.StringVar(&f.memProfile, "memprofile", "", "write a heap profile of this process at the end of the run (before a --local cluster stops) to the file")
}

func (f *benchFlags) validate() error {
	switch {
	case f.runtime != "emulated" && f.runtime != "process":
		return usageError{fmt.Errorf("--runtime %q: want emulated or process", f.runtime)}
	case f.runtime == "process" && f.workers > 1:
		return usageError{fmt.Errorf("--workers %d needs --runtime emulated (the process runtime runs one node)", f.workers)}
	case f.workers < 1 || f.workers > 100_000:
		return usageError{fmt.Errorf("--workers %d out of range [1, 100000]", f.workers)}
	case f.createDelay < 0:
		return usageError{fmt.Errorf("--create-delay %s must not be negative", f.createDelay)}
	case f.clients < 1 || f.clients > 1024:
		return usageError{fmt.Errorf("--clients %d out of range [1, 1024]", f.clients)}
	}
	return f.validateLoad()
}

func (f *benchFlags) validateLoad() error {
	switch {
	case f.maxLate <= 0 || f.maxLateFraction < 0 || f.maxLateFraction > 1:
		return usageError{fmt.Errorf("--max-late %s must be positive and --max-late-fraction %g in [0, 1]", f.maxLate, f.maxLateFraction)}
	case f.grace <= 0:
		return usageError{fmt.Errorf("--grace %s must be positive", f.grace)}
	}
	return nil
}

// options are the bench.Options the flags ask for.
func (f *benchFlags) options(stderr io.Writer) bench.Options {
	o := bench.Options{Out: f.out, Log: stderr, HTTP: loadgen.HTTPOptions{H2C: f.h2c},
		Lateness: loadgen.Lateness{Late: f.maxLate, MaxFraction: f.maxLateFraction}, Force: f.force,
		Clients: f.clients, Keep: f.keep, Grace: f.grace}
	if file, ok := stderr.(*os.File); ok {
		o.Progress = file
	}
	return o
}

// profiled runs body under the CPU profile and writes the heap profile
// after it, if the flags ask for them.
func (f *benchFlags) profiled(body func() (string, error)) (string, error) {
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return "", err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return "", err
		}
		defer pprof.StopCPUProfile()
	}
	text, err := body()
	if f.memProfile != "" {
		if perr := writeHeapProfile(f.memProfile); perr != nil && err == nil {
			err = perr
		}
	}
	return text, err
}

// run opens the cluster, runs body and closes the cluster; it prints the
// summary text and profiles if asked.
func (f *benchFlags) run(c *cobra.Command, g *globals, body func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error)) error {
	if err := f.validate(); err != nil {
		return err
	}
	capacity, err := nodeCapacity(f.nodeCPU, f.nodeMemoryMB)
	if err != nil {
		return err
	}
	log, err := f.clusterLogger(g)
	if err != nil {
		return err
	}
	ctx := c.Context()
	stderr := c.ErrOrStderr()
	if f.local {
		fmt.Fprintf(stderr, "starting a local cluster: %s runtime, %d worker node(s)\n", f.runtime, f.workers)
	}
	cl, err := bench.Open(ctx, bench.ClusterOptions{Local: f.local, Admin: g.admin, Invoke: g.invoke, Token: g.apiToken(), Runtime: f.runtime,
		EmergencySlots: f.emergencySlots,
		Workers:        f.workers, CreateDelay: f.createDelay, NodeCapacity: capacity, Logger: log, InsecureNoTLS: f.noTLS,
		Async: f.async, AsyncSyncAlways: f.natsSyncAlways})
	if err != nil {
		return err
	}
	if f.local {
		fmt.Fprintf(stderr, "local cluster up: admin http://%s  invoke http://%s\n", cl.Admin, cl.Invoke)
	}
	text, err := f.profiled(func() (string, error) { return body(ctx, cl, f.options(stderr)) })
	if cerr := cl.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("stopping the local cluster: %w", cerr)
	}
	return f.finish(c, text, err)
}

// finish prints a run's summary text and where its files went.
func (f *benchFlags) finish(c *cobra.Command, text string, err error) error {
	if text != "" {
		fmt.Fprintln(c.OutOrStdout(), text)
	}
	if err == nil && f.out != "" {
		fmt.Fprintf(c.ErrOrStderr(), "results in %s\n", f.out)
	}
	return err
}

func writeHeapProfile(path string) error {
	pf, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // the profile shows the live heap as of the last collection
	if err := pprof.WriteHeapProfile(pf); err != nil {
		pf.Close()
		return err
	}
	return pf.Close()
}

// clusterLogger sends a local cluster's logs to --out/cluster.log, or to
// stderr at warning level and above.
func (f *benchFlags) clusterLogger(g *globals) (*slog.Logger, error) {
	if !f.local {
		return nil, nil
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)}
	}
	if f.out == "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: max(lvl, slog.LevelWarn)})), nil
	}
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return nil, err
	}
	// The file stays open for the process's life: the cluster logs until
	// it has stopped, and the process ends soon after.
	file, err := os.Create(filepath.Join(f.out, "cluster.log"))
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewTextHandler(file, &slog.HandlerOptions{Level: lvl})), nil
}

func newBench(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark a cluster: warm calls, cold starts, registration, scale-up, asynchronous calls",
		Long: `Benchmark a brisk cluster the way the Dirigent and KubeDirect papers do.

Each benchmark targets the cluster at --admin-url/--invoke-url, or starts its
own with --local (emulated workers by default). It prints a short summary and,
with --out DIR, writes a per-call CSV, summary.json and PNG plots. A run whose
load generator fell behind its schedule is refused (see --max-late). See
docs/benchmarks.md.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error { return c.Help() },
	}
	c.AddCommand(newBenchWarm(g), newBenchCold(g), newBenchRegister(g), newBenchScale(g), newBenchHTTP(), newBenchModes(g), newBenchAsync(g), newBenchTriggers(g))
	return c
}

func newBenchWarm(g *globals) *cobra.Command {
	f := &benchFlags{}
	cfg := bench.WarmConfig{}
	var compare bool
	c := &cobra.Command{
		Use:   "warm (--rate R | --closed N) --duration D",
		Short: "Calls to pre-warmed sandboxes, open-loop at a rate or closed-loop to saturation (optionally against --direct)",
		Long: `Call functions whose sandboxes are already running.

With --rate, calls go open-loop at a constant rate: sends never wait for
replies, and a run whose sends fell behind is refused. With --closed N, N
callers each send their next call as soon as their last reply arrives: the
run measures saturation throughput (what the system serves with all cores
busy) without the backlog an open-loop generator builds past the knee.
--compare-direct then reports brisk's throughput over --direct's.`,
		Example: `  brisk bench warm --local --rate 2000 --duration 10s --compare-direct --out results/warm-2000
  brisk bench warm --local --closed 64 --duration 10s --rounds 5 --compare-direct --out results/saturation
  brisk bench warm --rate 500 --duration 30s --functions 4 --sandboxes 2`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if cfg.Rate != 0 && cfg.Closed != 0 {
				return usageError{fmt.Errorf("--rate and --closed exclude each other: open loop or closed loop\nUsage: %s", c.UseLine())}
			}
			if cfg.Rate < 0 || cfg.Closed < 0 || cfg.Rate+float64(cfg.Closed) == 0 || cfg.Duration <= 0 {
				return usageError{fmt.Errorf("a positive --rate (or --closed) and --duration are required\nUsage: %s", c.UseLine())}
			}
			if cfg.Direct && compare {
				return usageError{errors.New("--direct and --compare-direct exclude each other")}
			}
			if cfg.Rounds < 1 || cfg.Duration/time.Duration(max(cfg.Rounds, 1)) < 100*time.Millisecond {
				return usageError{errors.New("--rounds must be positive, with at least 100ms of --duration each")}
			}
			if cfg.Functions < 1 || cfg.Sandboxes < 1 || cfg.Concurrency < 0 || cfg.Concurrency > 10000 || cfg.ExecMs < 0 || cfg.Warmup < 0 {
				return usageError{errors.New("--functions and --sandboxes must be positive, --concurrency-per-sandbox in [0, 10000], --exec-ms and --warmup not negative")}
			}
			cfg.CompareDirect = compare
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Warm(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 1, 40*time.Millisecond)
	fl := c.Flags()
	fl.Float64Var(&cfg.Rate, "rate", 0, "open loop: calls per second, over all functions")
	fl.IntVar(&cfg.Closed, "closed", 0, "closed loop: this many callers, each sending its next call when its reply arrives (saturation throughput)")
	fl.DurationVar(&cfg.Duration, "duration", 0, "measured duration (required)")
	fl.IntVar(&cfg.Rounds, "rounds", 1, "with --compare-direct: alternate brisk and direct this many times, each a slice of --duration (host noise weighs on both alike)")
	fl.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured calls at the same rate (or with the same callers) before the measurement")
	fl.IntVar(&cfg.Functions, "functions", 1, "functions the calls go to, round-robin")
	fl.IntVar(&cfg.Sandboxes, "sandboxes", 2, "pre-warmed sandboxes per function (min = max)")
	fl.IntVar(&cfg.Concurrency, "concurrency-per-sandbox", 0, "in-flight calls per sandbox (0: unlimited, so nothing queues)")
	fl.IntVar(&cfg.ExecMs, "exec-ms", 0, "runtime each call asks the function for, in ms")
	fl.BoolVar(&cfg.Direct, "direct", false, "send the load straight to the sandboxes, bypassing brisk (the physical limit)")
	fl.BoolVar(&compare, "compare-direct", false, "run through brisk, then --direct, and report the added latency and throughput ratio")
	return c
}

func newBenchHTTP() *cobra.Command {
	f := &benchFlags{}
	cfg := bench.HTTPConfig{}
	var headers []string
	c := &cobra.Command{
		Use:   "http --url URL (--rate R | --closed N) --duration D",
		Short: "The warm benchmark's load sent to any HTTP endpoint (another platform, side by side)",
		Long: `Send open-loop calls at a constant rate (or, with --closed N, N closed-loop
callers) to any HTTP endpoint, with the same generator, CSV, summary and
plots as bench warm, but nothing registered or
started: the functions must already exist. Calls go round-robin over
--functions functions; "{i}" in --url and --host is replaced by the function's
index (0..functions-1). Use it to measure another FaaS platform on the same
machine with the same load (docs/benchmarks.md, "Side by side"), or a bare
server. With --warmup 0 and --functions at least rate × duration, every call
reaches a function not called before (a cold-start run on a platform that
scales from zero).`,
		Example: `  brisk bench http --url http://127.0.0.1:8080/function/hello --rate 2000 --duration 10s
  brisk bench http --url http://127.0.0.1:18080/ --host 'fn{i}' --functions 10000 --warmup 0 --rate 1000 --duration 10s`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg.Header = http.Header{}
			for _, h := range headers {
				k, v, ok := strings.Cut(h, ":")
				if !ok || strings.TrimSpace(k) == "" {
					return usageError{fmt.Errorf("--header %q: want Name: value", h)}
				}
				cfg.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
			if err := bench.ValidateHTTP(&cfg); err != nil {
				return usageError{err}
			}
			if err := f.validateLoad(); err != nil {
				return err
			}
			stderr := c.ErrOrStderr()
			text, err := f.profiled(func() (string, error) {
				_, text, err := bench.HTTP(c.Context(), f.options(stderr), cfg)
				return text, err
			})
			return f.finish(c, text, err)
		},
	}
	f.registerLoad(c)
	fl := c.Flags()
	fl.StringVar(&cfg.URL, "url", "", "URL of every call, http://host:port/path; {i} becomes the function's index (required)")
	fl.StringVar(&cfg.Host, "host", "", "Host header of every call ({i} becomes the function's index), for platforms that route on it")
	fl.StringArrayVar(&headers, "header", nil, "header sent with every call, \"Name: value\" (repeatable)")
	fl.IntVar(&cfg.Functions, "functions", 1, "functions the calls go to, round-robin")
	fl.Float64Var(&cfg.Rate, "rate", 0, "open loop: calls per second, over all functions")
	fl.IntVar(&cfg.Closed, "closed", 0, "closed loop: this many callers, each sending its next call when its reply arrives (saturation throughput)")
	fl.DurationVar(&cfg.Duration, "duration", 0, "measured duration (required)")
	fl.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured calls at the same rate before the measurement")
	fl.IntVar(&cfg.ExecMs, "exec-ms", 0, "runtime each call asks the function for, in ms (requested_cpu header and body)")
	return c
}

func newBenchCold(g *globals) *cobra.Command {
	f := &benchFlags{}
	cfg := bench.ColdConfig{}
	c := &cobra.Command{
		Use:   "cold --rate R --duration D",
		Short: "Open-loop calls where every call is a cold start (a fresh function at zero per call)",
		Example: `  brisk bench cold --local --rate 500 --duration 10s --out results/cold-500
  brisk bench cold --local --rate 1000 --duration 10s --create-delay 40ms --workers 100`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if cfg.Rate <= 0 || cfg.Duration <= 0 {
				return usageError{fmt.Errorf("--rate and --duration must be positive\nUsage: %s", c.UseLine())}
			}
			if cfg.ExecMs < 0 || cfg.WarmupFraction < 0 || cfg.WarmupFraction >= 1 {
				return usageError{errors.New("--exec-ms must not be negative and --warmup-fraction in [0, 1)")}
			}
			if cfg.WarmupFraction == 0 {
				cfg.WarmupFraction = -1 // an explicit 0 measures every call
			}
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Cold(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 50, 40*time.Millisecond)
	fl := c.Flags()
	fl.Float64Var(&cfg.Rate, "rate", 0, "cold starts per second (required)")
	fl.DurationVar(&cfg.Duration, "duration", 0, "duration (required); rate × duration functions are registered first")
	fl.IntVar(&cfg.ExecMs, "exec-ms", 0, "runtime each call asks the function for, in ms")
	fl.Float64Var(&cfg.WarmupFraction, "warmup-fraction", 0.1, "leading share of the calls not measured (the loader discards the first 10% of cold starts)")
	return c
}

func newBenchRegister(g *globals) *cobra.Command {
	f := &benchFlags{}
	cfg := bench.RegisterConfig{}
	c := &cobra.Command{
		Use:     "register --functions N",
		Short:   "Registration throughput and latency; then how fast new functions become invocable",
		Example: `  brisk bench register --local --functions 2000 --clients 16 --out results/register`,
		Args:    exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if cfg.Functions < 1 || cfg.Functions > 1_000_000 {
				return usageError{fmt.Errorf("--functions %d out of range [1, 1000000]\nUsage: %s", cfg.Functions, c.UseLine())}
			}
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Register(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 1, 40*time.Millisecond)
	c.Flags().IntVar(&cfg.Functions, "functions", 0, "functions to register (required)")
	c.Flags().IntVar(&cfg.Invocable, "invocable", 0, "functions of the register-and-invoke phase (0: min(N, 1000); -1: skip it)")
	return c
}

func newBenchScale(g *globals) *cobra.Command {
	f := &benchFlags{}
	cfg := bench.ScaleConfig{}
	c := &cobra.Command{
		Use:   "scale --functions K --sandboxes N --workers M",
		Short: "KubeDirect's harness: K functions at zero all set to N/K sandboxes at once; time to ready",
		Example: `  brisk bench scale --local --functions 1 --sandboxes 800 --workers 80
  brisk bench scale --local --functions 400 --sandboxes 2000 --workers 400 --create-delay 200ms`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if cfg.Functions < 1 || cfg.Sandboxes < cfg.Functions || cfg.Sandboxes > 1_000_000 {
				return usageError{fmt.Errorf("--functions %d and --sandboxes %d: want 1 ≤ functions ≤ sandboxes ≤ 1000000\nUsage: %s", cfg.Functions, cfg.Sandboxes, c.UseLine())}
			}
			return f.run(c, g, func(ctx context.Context, cl *bench.Cluster, o bench.Options) (string, error) {
				_, text, err := bench.Scale(ctx, cl, o, cfg)
				return text, err
			})
		},
	}
	f.register(c, 1, 200*time.Millisecond)
	c.Flags().IntVar(&cfg.Functions, "functions", 1, "functions K")
	c.Flags().IntVar(&cfg.Sandboxes, "sandboxes", 0, "sandboxes N in all (required)")
	c.Flags().DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "give up when not all are ready by then")
	c.Flags().StringVar(&cfg.GRPC, "controlplane-grpc", "", "an existing cluster's control plane gRPC address: time sandboxes on its endpoint stream (only a cluster run with --insecure-no-tls: the watch has no certificate; default: poll the admin /metrics)")
	return c
}

package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/spec"
	"github.com/brisk-faas/brisk/internal/worker"
	brt "github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/internal/worker/runtime/process"
)

// cpFlags are the control plane's flags, shared by `up` and `controlplane`.
type cpFlags struct {
	dataDir, admin, grpc, placement string
	tick, drainDelay, nodeGrace     time.Duration
	startupGrace                    time.Duration
}

func (f *cpFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "directory for the durable registry (and worker state under `up`)")
	fl.StringVar(&f.admin, "admin", "127.0.0.1:9090", "admin HTTP/JSON API listen address")
	fl.StringVar(&f.grpc, "grpc", "127.0.0.1:9091", "gRPC listen address for workers and data planes")
	fl.StringVar(&f.placement, "placement", "kubernetes", "placement policy: kubernetes, random, round-robin, bin-packing")
	fl.DurationVar(&f.tick, "autoscale-interval", 2*time.Second, "autoscaler decision period")
	fl.DurationVar(&f.drainDelay, "drain-delay", 500*time.Millisecond, "time between withdrawing a sandbox from data planes and terminating it")
	fl.DurationVar(&f.nodeGrace, "node-grace", 10*time.Second, "how long an unreachable worker keeps its sandboxes before they are replaced")
	fl.DurationVar(&f.startupGrace, "startup-grace", 5*time.Second, "after a restart, how long to wait for known workers before placing sandboxes")
}

func (f *cpFlags) config(g *globals) (controlplane.Config, error) {
	log, err := g.logger()
	if err != nil {
		return controlplane.Config{}, err
	}
	if f.tick <= 0 || f.drainDelay < 0 || f.nodeGrace <= 0 || f.startupGrace <= 0 {
		return controlplane.Config{}, usageError{fmt.Errorf("--autoscale-interval, --node-grace and --startup-grace must be positive, --drain-delay not negative")}
	}
	return controlplane.Config{DataDir: f.dataDir, AdminAddr: f.admin, GRPCAddr: f.grpc, Placement: f.placement,
		TickInterval: f.tick, DrainDelay: f.drainDelay, NodeGrace: f.nodeGrace, StartupGrace: f.startupGrace,
		Logger: log.With("component", "controlplane")}, nil
}

func defaultDataDir() string {
	if d := os.Getenv("BRISK_DATA_DIR"); d != "" {
		return d
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".brisk")
	}
	return ".brisk"
}

// wkFlags are the worker's flags, shared by `up` and `worker`.
type wkFlags struct {
	listen, advertise, nodeID, rt, stateDir string
	emulate                                 int
	createDelay                             time.Duration
	cpu                                     string
	memoryMB, maxSandboxes                  int64
	stopOnExit                              bool
}

func (f *wkFlags) register(c *cobra.Command, standalone bool) {
	fl := c.Flags()
	host, _ := os.Hostname()
	fl.StringVar(&f.rt, "runtime", "process", "sandbox runtime: process or emulated")
	fl.IntVar(&f.emulate, "emulate", 1, "with --runtime emulated: number of emulated worker nodes hosted by this process")
	fl.DurationVar(&f.createDelay, "create-delay", 40*time.Millisecond, "with --runtime emulated: sandbox creation delay")
	fl.StringVar(&f.cpu, "cpu", "", "CPU capacity offered per node, e.g. 2 or 1500m (default: all cores)")
	fl.Int64Var(&f.memoryMB, "memory", 0, "memory capacity offered per node in MiB (default: all memory)")
	fl.Int64Var(&f.maxSandboxes, "max-sandboxes", 0, "sandbox limit per node (0 = none)")
	if standalone {
		fl.StringVar(&f.listen, "listen", "127.0.0.1:0", "gRPC listen address of the worker")
		fl.StringVar(&f.advertise, "advertise", "", "address the control plane dials (default: the bound listen address)")
		fl.StringVar(&f.nodeID, "node-id", host, "node id (with --emulate N, a prefix)")
		fl.StringVar(&f.stateDir, "state-dir", filepath.Join(defaultDataDir(), "worker"), "directory for sandbox state and logs")
		fl.BoolVar(&f.stopOnExit, "stop-on-exit", false, "kill all sandboxes when the worker exits (default: keep them for a restarted worker to adopt)")
	}
}

// build makes the worker daemon and, for the emulated runtime, the shared
// sandbox host it needs running beside it.
func (f *wkFlags) build(g *globals, cpAddr string) (*worker.Daemon, *emulated.Host, error) {
	log, err := g.logger()
	if err != nil {
		return nil, nil, err
	}
	capacity, err := nodeCapacity(f.cpu, f.memoryMB)
	if err != nil {
		return nil, nil, err
	}
	cfg := worker.Config{Listen: f.listen, Advertise: f.advertise, ControlPlane: cpAddr, StopSandboxesOnExit: f.stopOnExit,
		Logger: log.With("component", "worker")}
	var host *emulated.Host
	switch f.rt {
	case "process":
		if f.emulate != 1 {
			return nil, nil, usageError{fmt.Errorf("--emulate needs --runtime emulated")}
		}
		rt, err := process.New(process.Config{StateDir: f.stateDir, Logger: log.With("component", "runtime")})
		if err != nil {
			return nil, nil, err
		}
		cfg.Nodes = []worker.NodeConfig{{ID: f.nodeID, Runtime: rt, Capacity: capacity, MaxSandboxes: int(f.maxSandboxes)}}
	case "emulated":
		if f.emulate < 1 || f.emulate > 100000 {
			return nil, nil, usageError{fmt.Errorf("--emulate %d out of range [1, 100000]", f.emulate)}
		}
		if f.createDelay < 0 {
			return nil, nil, usageError{fmt.Errorf("--create-delay must not be negative")}
		}
		host, err = emulated.NewHost("127.0.0.1:0", log.With("component", "emulated"))
		if err != nil {
			return nil, nil, err
		}
		for i := 0; i < f.emulate; i++ {
			id := f.nodeID
			if f.emulate > 1 {
				id = f.nodeID + "-" + strconv.Itoa(i)
			}
			var rt brt.Runtime = host.Runtime(id, f.createDelay)
			cfg.Nodes = append(cfg.Nodes, worker.NodeConfig{ID: id, Runtime: rt, Capacity: capacity, MaxSandboxes: int(f.maxSandboxes)})
		}
	default:
		return nil, nil, usageError{fmt.Errorf("--runtime %q: want process or emulated", f.rt)}
	}
	d, err := worker.New(cfg)
	return d, host, err
}

// nodeCapacity parses --cpu/--memory, defaulting to the whole machine.
func nodeCapacity(cpu string, memMB int64) (spec.Resources, error) {
	r := spec.Resources{MilliCPU: int64(runtime.NumCPU()) * 1000, MemoryMB: memMB}
	if cpu != "" {
		var err error
		if strings.HasSuffix(cpu, "m") {
			r.MilliCPU, err = strconv.ParseInt(strings.TrimSuffix(cpu, "m"), 10, 64)
		} else {
			var v float64
			v, err = strconv.ParseFloat(cpu, 64)
			r.MilliCPU = int64(v * 1000)
		}
		if err != nil || r.MilliCPU <= 0 {
			return r, usageError{fmt.Errorf("--cpu %q: want a positive number of cores (2, 0.5) or millicores (500m)", cpu)}
		}
	}
	if memMB < 0 {
		return r, usageError{fmt.Errorf("--memory %d must not be negative", memMB)}
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = totalMemoryMB()
	}
	return r, nil
}

func totalMemoryMB() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					return kb / 1024
				}
			}
		}
	}
	return 4096
}

// runWorker runs a daemon and, if present, its emulated sandbox host.
func runWorker(ctx context.Context, d *worker.Daemon, host *emulated.Host) error {
	g, ctx := errgroup.WithContext(ctx)
	if host != nil {
		g.Go(func() error { return host.Run(ctx) })
	}
	g.Go(func() error { return d.Run(ctx) })
	return g.Wait()
}

func newControlPlane(g *globals) *cobra.Command {
	f := &cpFlags{}
	c := &cobra.Command{
		Use:   "controlplane",
		Short: "Run a control plane (registry, autoscaler, placer, admin API)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := f.config(g)
			if err != nil {
				return err
			}
			cp, err := controlplane.New(cfg)
			if err != nil {
				return err
			}
			return cp.Run(c.Context())
		},
	}
	f.register(c)
	return c
}

func newDataPlane(g *globals) *cobra.Command {
	var id, listen, cpAddr string
	c := &cobra.Command{
		Use:   "dataplane",
		Short: "Run a data plane (invocation proxy, queues, load balancing)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			dp, err := dataplane.New(dataplane.Config{ID: id, Listen: listen, ControlPlane: cpAddr, Logger: log.With("component", "dataplane")})
			if err != nil {
				return err
			}
			return dp.Run(c.Context())
		},
	}
	host, _ := os.Hostname()
	c.Flags().StringVar(&id, "id", host, "data plane id")
	c.Flags().StringVar(&listen, "invoke", "127.0.0.1:8080", "invocation HTTP listen address (HTTP/1.1 and h2c)")
	c.Flags().StringVar(&cpAddr, "controlplane", "127.0.0.1:9091", "control plane gRPC address")
	return c
}

func newWorker(g *globals) *cobra.Command {
	f := &wkFlags{}
	var cpAddr string
	c := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker daemon (sandbox runtime, readiness probes, heartbeats)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			d, host, err := f.build(g, cpAddr)
			if err != nil {
				return err
			}
			return runWorker(c.Context(), d, host)
		},
	}
	f.register(c, true)
	c.Flags().StringVar(&cpAddr, "controlplane", "127.0.0.1:9091", "control plane gRPC address")
	return c
}

func newUp(g *globals) *cobra.Command {
	cf := &cpFlags{}
	wf := &wkFlags{}
	var invoke string
	c := &cobra.Command{
		Use:   "up",
		Short: "Run a whole cluster on this machine: control plane, data plane and worker",
		Long: `Run a whole cluster in one process on embedded defaults: a control plane
(admin API on --admin), a data plane (invocations on --invoke) and a worker
using the process runtime (or --runtime emulated). State lives in --data-dir.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := cf.config(g)
			if err != nil {
				return err
			}
			log, _ := g.logger()
			host, _ := os.Hostname()
			// A one-machine cluster stops its sandboxes with it.
			wf.listen, wf.nodeID, wf.stateDir, wf.stopOnExit = "127.0.0.1:0", host, filepath.Join(cf.dataDir, "worker"), true
			wk, emu, err := wf.build(g, cf.grpc)
			if err != nil {
				return err
			}
			cp, err := controlplane.New(cfg)
			if err != nil {
				return err
			}
			dp, err := dataplane.New(dataplane.Config{ID: host, Listen: invoke, ControlPlane: cf.grpc, Logger: log.With("component", "dataplane")})
			if err != nil {
				return err
			}
			eg, ctx := errgroup.WithContext(c.Context())
			eg.Go(func() error { return cp.Run(ctx) })
			// The others start once the control plane listens, so their
			// first connection succeeds.
			eg.Go(func() error {
				select {
				case <-ctx.Done():
					return nil
				case <-cp.Ready():
				}
				eg.Go(func() error { return dp.Run(ctx) })
				eg.Go(func() error { return runWorker(ctx, wk, emu) })
				select {
				case <-ctx.Done():
				case <-dp.Ready():
					fmt.Fprintf(os.Stderr, "brisk is up: admin http://%s  invoke http://%s  data %s\n", cp.AdminAddr(), dp.Addr(), cf.dataDir)
				}
				return nil
			})
			return eg.Wait()
		},
	}
	cf.register(c)
	wf.register(c, false)
	c.Flags().StringVar(&invoke, "invoke", "127.0.0.1:8080", "data plane invocation listen address")
	return c
}

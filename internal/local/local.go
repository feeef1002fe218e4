// Package local runs a whole brisk cluster in one process — control plane,
// data plane and a worker daemon hosting one or many nodes — for `brisk up`
// and for benchmarks that bring their own cluster.
package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/spec"
	"github.com/brisk-faas/brisk/internal/worker"
	brt "github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/internal/worker/runtime/process"
)

// Workers describes the worker nodes a daemon hosts.
type Workers struct {
	Runtime      string        // "process" (default) or "emulated"
	Nodes        int           // emulated only: nodes in this process; default 1
	NodeID       string        // node id, or the prefix of emulated node ids; default hostname
	CreateDelay  time.Duration // emulated only: sandbox creation delay
	StateDir     string        // process only: sandbox table and logs
	Capacity     spec.Resources
	MaxSandboxes int
	Listen       string // gRPC listen address; default 127.0.0.1:0
	Advertise    string
	StopOnExit   bool
}

// ErrUsage marks a Workers value that cannot be built; the message says why.
var ErrUsage = errors.New("invalid worker options")

// BuildWorker makes a worker daemon for w and, for the emulated runtime, the
// shared sandbox host that must run beside it (nil otherwise).
func BuildWorker(w Workers, controlPlane string, log *slog.Logger) (*worker.Daemon, *emulated.Host, error) {
	if w.NodeID == "" {
		w.NodeID, _ = os.Hostname()
	}
	if w.Capacity.MilliCPU == 0 {
		w.Capacity.MilliCPU = int64(runtime.NumCPU()) * 1000
	}
	if w.Capacity.MemoryMB == 0 {
		w.Capacity.MemoryMB = TotalMemoryMB()
	}
	cfg := worker.Config{Listen: w.Listen, Advertise: w.Advertise, ControlPlane: controlPlane,
		StopSandboxesOnExit: w.StopOnExit, Logger: log.With("component", "worker")}
	var host *emulated.Host
	switch w.Runtime {
	case "", "process":
		if w.Nodes > 1 {
			return nil, nil, fmt.Errorf("%w: several nodes in one process need the emulated runtime", ErrUsage)
		}
		rt, err := process.New(process.Config{StateDir: w.StateDir, Logger: log.With("component", "runtime")})
		if err != nil {
			return nil, nil, err
		}
		cfg.Nodes = []worker.NodeConfig{{ID: w.NodeID, Runtime: rt, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes}}
	case "emulated":
		n := max(w.Nodes, 1)
		if n > 100000 {
			return nil, nil, fmt.Errorf("%w: %d emulated nodes out of range [1, 100000]", ErrUsage, n)
		}
		if w.CreateDelay < 0 {
			return nil, nil, fmt.Errorf("%w: creation delay must not be negative", ErrUsage)
		}
		var err error
		if host, err = emulated.NewHost("127.0.0.1:0", log.With("component", "emulated")); err != nil {
			return nil, nil, err
		}
		for i := 0; i < n; i++ {
			id := w.NodeID
			if n > 1 {
				id = w.NodeID + "-" + strconv.Itoa(i)
			}
			var rt brt.Runtime = host.Runtime(id, w.CreateDelay)
			cfg.Nodes = append(cfg.Nodes, worker.NodeConfig{ID: id, Runtime: rt, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes})
		}
	default:
		return nil, nil, fmt.Errorf("%w: runtime %q: want process or emulated", ErrUsage, w.Runtime)
	}
	d, err := worker.New(cfg)
	if err != nil && host != nil {
		host.Close()
	}
	return d, host, err
}

// RunWorker runs a daemon and, if present, its emulated sandbox host.
func RunWorker(ctx context.Context, d *worker.Daemon, host *emulated.Host) error {
	g, ctx := errgroup.WithContext(ctx)
	if host != nil {
		g.Go(func() error { return host.Run(ctx) })
	}
	g.Go(func() error { return d.Run(ctx) })
	return g.Wait()
}

// TotalMemoryMB is the machine's memory, the default node capacity.
func TotalMemoryMB() int64 {
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

// Config configures a one-process cluster. The data plane and the worker
// are pointed at the control plane's bound gRPC address, so every listen
// address may be 127.0.0.1:0.
type Config struct {
	ControlPlane controlplane.Config
	DataPlane    dataplane.Config
	Workers      Workers
	Logger       *slog.Logger
}

// Cluster is a running one-process cluster.
type Cluster struct {
	cfg   Config
	cp    *controlplane.ControlPlane
	dp    *dataplane.DataPlane
	ready chan struct{}
	err   error
}

// New validates the config; it starts nothing.
func New(cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ControlPlane.Logger == nil {
		cfg.ControlPlane.Logger = cfg.Logger.With("component", "controlplane")
	}
	if cfg.DataPlane.Logger == nil {
		cfg.DataPlane.Logger = cfg.Logger.With("component", "dataplane")
	}
	cp, err := controlplane.New(cfg.ControlPlane)
	if err != nil {
		return nil, err
	}
	return &Cluster{cfg: cfg, cp: cp, ready: make(chan struct{})}, nil
}

// Ready is closed once the admin API and the data plane listen.
func (c *Cluster) Ready() <-chan struct{} { return c.ready }

// AdminAddr is the admin API's bound address (after Ready).
func (c *Cluster) AdminAddr() string { return c.cp.AdminAddr() }

// InvokeAddr is the data plane's bound address (after Ready).
func (c *Cluster) InvokeAddr() string { return c.dp.Addr() }

// ControlPlane returns the control plane (status, tests).
func (c *Cluster) ControlPlane() *controlplane.ControlPlane { return c.cp }

// Run runs every component until ctx ends or one fails.
func (c *Cluster) Run(ctx context.Context) error {
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error { return c.cp.Run(ctx) })
	// The others start once the control plane listens: they need its
	// bound address, and their first connection then succeeds.
	eg.Go(func() error {
		select {
		case <-ctx.Done():
			return nil
		case <-c.cp.Ready():
		}
		dcfg := c.cfg.DataPlane
		dcfg.ControlPlane = c.cp.GRPCAddr()
		dp, err := dataplane.New(dcfg)
		if err != nil {
			return err
		}
		c.dp = dp
		wk, emu, err := BuildWorker(c.cfg.Workers, c.cp.GRPCAddr(), c.cfg.Logger)
		if err != nil {
			return err
		}
		eg.Go(func() error { return dp.Run(ctx) })
		eg.Go(func() error { return RunWorker(ctx, wk, emu) })
		select {
		case <-ctx.Done():
		case <-dp.Ready():
			close(c.ready)
		}
		return nil
	})
	return eg.Wait()
}

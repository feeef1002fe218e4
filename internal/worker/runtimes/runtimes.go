// Package runtimes builds a worker daemon on the sandbox runtime a
// Workers value names: the choice among process, emulated, containerd,
// native and kube, and what each needs beside it (the network namespace
// pool, the containerd connection and its lock, the Kubernetes informer).
// `brisk worker`, `brisk up` (internal/local) and the benchmarks' local
// clusters assemble their workers here.
package runtimes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/brisk-faas/brisk/internal/kubernetes"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/worker"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	brt "github.com/brisk-faas/brisk/internal/worker/runtime"
	ctrd "github.com/brisk-faas/brisk/internal/worker/runtime/containerd"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native"
	"github.com/brisk-faas/brisk/internal/worker/runtime/process"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// DefaultCPUOvercommit is brisk up's and brisk worker's CPU overcommit: the
// CPU requests of a node's sandboxes may add up to four times its cores.
// FaaS sandboxes are mostly idle (in the Azure traces most functions are
// called less than once a minute), so reserving each one's request would
// fill a 2-core node with 8 idle 250m sandboxes; OpenWhisk reserves no CPU
// at all. Memory is never overcommitted.
const DefaultCPUOvercommit = 4

// MaxCPUOvercommit bounds the factor.
const MaxCPUOvercommit = 100

// Workers describes the worker nodes a daemon hosts.
type Workers struct {
	Runtime     string        // "process" (default), "emulated", "containerd", "native" or "kube"
	Nodes       int           // emulated only: nodes in this process; default 1
	NodeID      string        // node id, or the prefix of emulated node ids; default hostname
	CreateDelay time.Duration // emulated only: sandbox creation delay
	StateDir    string        // process and containerd: sandbox table or labels, and logs
	Capacity    spec.Resources
	// CPUOvercommit multiplies Capacity's CPU into what the CPU requests
	// of a node's sandboxes may add up to (0 or 1: none). Not for kube,
	// whose kubelet admits Pods by their real requests.
	CPUOvercommit float64
	MaxSandboxes  int
	Listen        string // gRPC listen address; default 127.0.0.1:0
	Advertise     string
	// SandboxHost is the address process and emulated sandboxes listen
	// on and data planes dial (process.Config.ListenHost); empty: process
	// 127.0.0.1, emulated Listen's host.
	SandboxHost string
	StopOnExit  bool
	// SandboxUser is who the process runtime runs sandboxes as (see
	// process.Config.User); empty: nobody as root, else this user.
	SandboxUser string
	// Python and Node are the interpreters of functions deployed from
	// source (lang.Config; empty: the defaults).
	Python, Node string
	// NoTemplates starts every sandbox of a Python function fresh
	// (process.Config.NoTemplates, native.Config.NoTemplates).
	NoTemplates  bool
	MaxTemplates int
	// Identity: with CA the daemon gets a certificate from it directly
	// (one process with the control plane); with Join it joins the
	// cluster when it starts. Neither: plaintext gRPC.
	CA   *pki.CA
	Join *pki.Joiner

	// EmergencySlots is how many one-shot emergency sandboxes each node
	// runs at once for dual-mode functions; 0: the runtime's default
	// (DefaultEmergencySlots for native, none for the others); negative:
	// none.
	EmergencySlots int
	// NativeShells is how many parked shells the native runtime keeps
	// ready (native.Config.Shells); 0: its default.
	NativeShells int
	// EmergencyRuntime is the runtime of the emergency track: "" (the
	// node's runtime) or "native" beside containerd (sharing its network
	// pool) or kube (one native runtime on this host for all the nodes the
	// process stands for), with its state under StateDir/emergency.
	EmergencyRuntime string

	// containerd only (StateDir holds the sandboxes' logs):
	ContainerdAddress   string         // socket; default /run/containerd/containerd.sock
	ContainerdNamespace string         // default "brisk"
	Snapshotter         string         // default "overlayfs"
	NetPool             netpool.Config // containerd and native: the sandboxes' network namespaces; the zero value means netpool.Default()

	// kube only: regular sandboxes are Pods bound to Kubernetes nodes.
	Kube KubeWorkers
}

// KubeWorkers says where the kube runtime's Pods go.
type KubeWorkers struct {
	// Kubeconfig reaches the kube-apiserver; empty: as kubectl finds it
	// (the in-cluster service account of a worker run as a Pod, else
	// $KUBECONFIG or ~/.kube/config; internal/kubernetes.Config).
	Kubeconfig string
	// Namespace holds the Pods; default "default".
	Namespace string
	// Nodes are the Kubernetes nodes this process stands for, one worker
	// node each, named as the Kubernetes node (many in one process: KWOK
	// nodes in tests and benchmarks); empty: the one node NodeID. With
	// Placement "scheduler", the nodes the scheduler may use (empty: any).
	Nodes []string
	// Placement is "brisk" (default: Pods bound to the worker node's
	// Kubernetes node, brisk's placer chose it) or "scheduler": one worker
	// node NodeID stands for Nodes (or the whole cluster) and the
	// Kubernetes scheduler places its Pods; its capacity, unless given,
	// is the sum of those nodes' allocatable resources and Pods.
	Placement string
	// KeyPrefixes are the label and annotation key prefixes a function's
	// own keys may carry onto its Pods besides unprefixed ones
	// (kube.Config.KeyPrefixes).
	KeyPrefixes []string
}

// Sidecars are what BuildWorker makes beside a daemon that RunWorker runs
// and stops with it: the emulated runtime's shared sandbox host, or the
// containerd runtime and its network pool.
type Sidecars struct {
	Host *emulated.Host // emulated only

	pool       *netpool.Pool
	unlock     func() // the pool's host lock (netpool.HostLock)
	ctr        *ctrd.Runtime
	nat        *native.Runtime
	kube       *kube.Shared
	stopOnExit bool
}

// DefaultEmergencySlots is the native runtime's default emergency slots per
// node: two per core, at least 4.
func DefaultEmergencySlots() int { return max(4, 2*runtime.NumCPU()) }

// emergencySlots resolves Workers.EmergencySlots for runtime rt.
func (w Workers) emergencySlots(rt string) int {
	switch {
	case w.EmergencySlots != 0:
		return max(0, w.EmergencySlots)
	case rt == "native", w.EmergencyRuntime == "native":
		return DefaultEmergencySlots()
	}
	return 0
}

// ErrUsage marks a Workers value that cannot be built; the message says why.
var ErrUsage = errors.New("invalid worker options")

// CheckEmergencyRuntime checks Workers.EmergencyRuntime against Runtime:
// empty or the same, or native beside containerd or kube.
func CheckEmergencyRuntime(runtime, emergency string) error {
	switch {
	case emergency == "" || emergency == runtime:
		return nil
	case emergency != "native":
		return fmt.Errorf("%w: emergency runtime %q: want native (beside runtime containerd or kube)", ErrUsage, emergency)
	case runtime != "containerd" && runtime != "kube":
		return fmt.Errorf("%w: emergency runtime native goes beside runtime containerd or kube, not %q (runtime native's emergency track already uses it)", ErrUsage, runtime)
	}
	return nil
}

// BuildWorker makes a worker daemon for w and what must run beside it (nil
// for the process runtime). For containerd it connects to containerd and
// tears down the sandboxes a previous worker on the same StateDir left,
// before RunWorker starts the network pool (which reaps their namespaces).
func BuildWorker(w Workers, controlPlane string, log *slog.Logger) (*worker.Daemon, *Sidecars, error) {
	if w.NodeID == "" {
		w.NodeID, _ = os.Hostname()
	}
	given := w.Capacity // kube's scheduler placement sizes the rest from the nodes
	if w.Capacity.MilliCPU == 0 {
		w.Capacity.MilliCPU = int64(runtime.NumCPU()) * 1000
	}
	if w.Capacity.MemoryMB == 0 {
		w.Capacity.MemoryMB = TotalMemoryMB()
	}
	if err := CheckEmergencyRuntime(w.Runtime, w.EmergencyRuntime); err != nil {
		return nil, nil, err
	}
	if w.CPUOvercommit > 1 && w.Runtime != "kube" {
		cores := w.Capacity.MilliCPU
		w.Capacity.MilliCPU = int64(float64(cores) * w.CPUOvercommit)
		log.Info("CPU requests overcommitted", "cpu_m", cores, "overcommit", w.CPUOvercommit, "requests_up_to_m", w.Capacity.MilliCPU)
	}
	if w.EmergencyRuntime == w.Runtime {
		w.EmergencyRuntime = ""
	}
	cfg := worker.Config{Listen: w.Listen, Advertise: w.Advertise, ControlPlane: controlPlane,
		StopSandboxesOnExit: w.StopOnExit, Logger: log.With("component", "worker")}
	if w.StateDir != "" && w.Runtime != "emulated" {
		cfg.Lang = lang.Config{Dir: filepath.Join(w.StateDir, "lang"), Python: w.Python, Node: w.Node}
	}
	var side *Sidecars
	switch w.Runtime {
	case "", "process":
		if w.Nodes > 1 {
			return nil, nil, fmt.Errorf("%w: several nodes in one process need the emulated runtime", ErrUsage)
		}
		rt, err := process.New(process.Config{StateDir: w.StateDir, ListenHost: w.SandboxHost, User: w.SandboxUser, NoTemplates: w.NoTemplates, MaxTemplates: w.MaxTemplates, Logger: log.With("component", "runtime")})
		if err != nil {
			return nil, nil, err
		}
		cfg.Nodes = []worker.NodeConfig{{ID: w.NodeID, Runtime: rt, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes, EmergencySlots: w.emergencySlots(w.Runtime)}}
	case "emulated":
		n := max(w.Nodes, 1)
		if n > 100000 {
			return nil, nil, fmt.Errorf("%w: %d emulated nodes out of range [1, 100000]", ErrUsage, n)
		}
		if w.CreateDelay < 0 {
			return nil, nil, fmt.Errorf("%w: creation delay must not be negative", ErrUsage)
		}
		// The emulated sandboxes are served on the worker's listen host:
		// data planes on other machines reach them there.
		host, err := emulated.NewHost(net.JoinHostPort(cmp.Or(w.SandboxHost, emulatedHost(w.Listen)), "0"), log.With("component", "emulated"))
		if err != nil {
			return nil, nil, err
		}
		side = &Sidecars{Host: host}
		for i := 0; i < n; i++ {
			id := w.NodeID
			if n > 1 {
				id = w.NodeID + "-" + strconv.Itoa(i)
			}
			var rt brt.Runtime = host.Runtime(id, w.CreateDelay)
			cfg.Nodes = append(cfg.Nodes, worker.NodeConfig{ID: id, Runtime: rt, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes, EmergencySlots: w.emergencySlots(w.Runtime)})
		}
	case "containerd":
		if w.Nodes > 1 {
			return nil, nil, fmt.Errorf("%w: several nodes in one process need the emulated runtime", ErrUsage)
		}
		var err error
		if side, err = buildContainerd(w, log); err != nil {
			return nil, nil, err
		}
		cfg.Nodes = []worker.NodeConfig{{ID: w.NodeID, Runtime: side.ctr, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes, EmergencySlots: w.emergencySlots(w.Runtime)}}
		if w.EmergencyRuntime == "native" {
			if side.nat, err = newNative(w, filepath.Join(w.StateDir, "emergency"), side.pool, log); err != nil {
				side.close()
				side.unlock()
				return nil, nil, err
			}
			cfg.Nodes[0].EmergencyRuntime = side.nat
		}
	case "native":
		if w.Nodes > 1 {
			return nil, nil, fmt.Errorf("%w: several nodes in one process need the emulated runtime", ErrUsage)
		}
		var err error
		if side, err = buildNative(w, log); err != nil {
			return nil, nil, err
		}
		cfg.Nodes = []worker.NodeConfig{{ID: w.NodeID, Runtime: side.nat, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes, EmergencySlots: w.emergencySlots(w.Runtime)}}
	case "kube":
		var err error
		if side, cfg.Nodes, err = buildKube(w, given, log); err != nil {
			return nil, nil, err
		}
	default:
		return nil, nil, fmt.Errorf("%w: runtime %q: want process, emulated, containerd, native or kube", ErrUsage, w.Runtime)
	}
	if w.CA != nil {
		ids := make([]string, len(cfg.Nodes))
		for i, n := range cfg.Nodes {
			ids[i] = n.ID
		}
		var id *pki.Identity
		var err error
		if w.StateDir != "" {
			id, err = w.CA.IssueStored(filepath.Join(w.StateDir, "identity"), pki.KindWorker, ids)
		} else {
			id, err = w.CA.Issue(pki.KindWorker, ids, nil, nil)
		}
		if err != nil {
			if side != nil {
				side.close()
			}
			return nil, nil, fmt.Errorf("worker certificate: %w", err)
		}
		cfg.Identity = id
	} else if w.Join != nil {
		j := *w.Join
		j.Logger = log.With("component", "worker")
		cfg.Join = &j
	}
	d, err := worker.New(cfg)
	if err != nil && side != nil {
		side.close()
	}
	return d, side, err
}

// buildKube connects to the kube-apiserver and makes one worker node per
// Kubernetes node of w, each creating its sandboxes as Pods bound to that
// node, or with scheduler placement one worker node whose Pods the
// Kubernetes scheduler places; one informer serves them all. With
// emergency runtime native, one native runtime on this host serves the
// emergency track of every node.
func buildKube(w Workers, given spec.Resources, log *slog.Logger) (*Sidecars, []worker.NodeConfig, error) {
	nodes := w.Kube.Nodes
	if len(nodes) == 0 {
		nodes = []string{w.NodeID}
	}
	if w.Nodes > 1 {
		return nil, nil, fmt.Errorf("%w: with runtime kube, the nodes are the Kubernetes nodes named (--kube-nodes), not --emulate", ErrUsage)
	}
	if w.EmergencyRuntime != "native" && w.EmergencySlots > 0 {
		return nil, nil, fmt.Errorf("%w: with runtime kube, emergency slots need --emergency-runtime native: emergency sandboxes never become Pods", ErrUsage)
	}
	placement := kube.Placement(cmp.Or(w.Kube.Placement, string(kube.PlaceBrisk)))
	if placement != kube.PlaceBrisk && placement != kube.PlaceScheduler {
		return nil, nil, fmt.Errorf("%w: kube placement %q: want brisk or scheduler", ErrUsage, w.Kube.Placement)
	}
	rc, err := kubernetes.Config(w.Kube.Kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: kube runtime: %w", ErrUsage, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shared, err := kube.NewShared(ctx, kube.SharedConfig{REST: rc, Namespace: cmp.Or(w.Kube.Namespace, "default"), Logger: log.With("component", "runtime")})
	if err != nil {
		return nil, nil, err
	}
	side := &Sidecars{kube: shared}
	fail := func(err error) (*Sidecars, []worker.NodeConfig, error) {
		side.close()
		if side.unlock != nil {
			side.unlock()
		}
		return nil, nil, err
	}
	var ncs []worker.NodeConfig
	if placement == kube.PlaceScheduler {
		capacity, maxSandboxes, err := schedulerCapacity(ctx, shared, w, given)
		if err != nil {
			return fail(err)
		}
		rt, err := shared.Runtime(kube.Config{Node: w.NodeID, Placement: placement, Nodes: w.Kube.Nodes, KeyPrefixes: w.Kube.KeyPrefixes,
			Logger: log.With("component", "runtime", "node", w.NodeID)})
		if err != nil {
			return fail(fmt.Errorf("%w: %w", ErrUsage, err))
		}
		ncs = append(ncs, worker.NodeConfig{ID: w.NodeID, Runtime: rt, Capacity: capacity, MaxSandboxes: maxSandboxes, EmergencySlots: w.emergencySlots(w.Runtime)})
	} else {
		for _, n := range nodes {
			rt, err := shared.Runtime(kube.Config{Node: n, KeyPrefixes: w.Kube.KeyPrefixes, Logger: log.With("component", "runtime", "node", n)})
			if err != nil {
				return fail(fmt.Errorf("%w: %w", ErrUsage, err))
			}
			ncs = append(ncs, worker.NodeConfig{ID: n, Runtime: rt, Capacity: w.Capacity, MaxSandboxes: w.MaxSandboxes, EmergencySlots: w.emergencySlots(w.Runtime)})
		}
	}
	if w.EmergencyRuntime == "native" {
		// One native runtime for the host: the nodes this process stands
		// for run here (one, when a worker runs on each Kubernetes node),
		// and one host has one network pool.
		if w.StateDir == "" {
			return fail(fmt.Errorf("%w: the native emergency runtime needs a state directory", ErrUsage))
		}
		if side.pool, side.unlock, err = netPool(w, log); err != nil {
			return fail(err)
		}
		if side.nat, err = newNative(w, filepath.Join(w.StateDir, "emergency"), side.pool, log); err != nil {
			return fail(err)
		}
		side.stopOnExit = w.StopOnExit
		// The slots are this host's: the nodes of one process share its
		// native runtime, so they split them rather than each offering
		// them all (one node, as when a worker runs on each Kubernetes
		// node, gets them all).
		slots := w.emergencySlots(w.Runtime)
		for i := range ncs {
			ncs[i].EmergencyRuntime = side.nat
			ncs[i].EmergencySlots = slots / len(ncs)
			if i < slots%len(ncs) {
				ncs[i].EmergencySlots++
			}
		}
	}
	return side, ncs, nil
}

// schedulerCapacity is the capacity and sandbox limit of the worker node
// that stands for the Kubernetes nodes the scheduler may use: what was
// given, the rest summed from the nodes' allocatable resources (so that
// brisk's accounting never offers more than the nodes have).
func schedulerCapacity(ctx context.Context, shared *kube.Shared, w Workers, given spec.Resources) (spec.Resources, int, error) {
	capacity, maxSandboxes := given, w.MaxSandboxes
	if capacity.MilliCPU > 0 && capacity.MemoryMB > 0 && maxSandboxes > 0 {
		return capacity, maxSandboxes, nil
	}
	nc, err := kube.NodesCapacity(ctx, shared.Client(), w.Kube.Nodes)
	if err != nil {
		return capacity, 0, fmt.Errorf("kube placement scheduler: sizing the worker node from the Kubernetes nodes (give --cpu, --memory and --max-sandboxes, or grant get and list on nodes): %w", err)
	}
	if capacity.MilliCPU == 0 {
		capacity.MilliCPU = nc.MilliCPU
	}
	if capacity.MemoryMB == 0 {
		capacity.MemoryMB = nc.MemoryMB
	}
	if maxSandboxes == 0 {
		maxSandboxes = nc.Pods
	}
	return capacity, maxSandboxes, nil
}

// netPool makes the network pool of the containerd and native runtimes,
// after claiming its names on this host: a second cluster with the same
// ones would tear down this one's namespaces and bridge.
func netPool(w Workers, log *slog.Logger) (*netpool.Pool, func(), error) {
	pcfg := w.NetPool
	if reflect.ValueOf(pcfg).IsZero() { // Config holds a slice: no ==
		pcfg = netpool.Default()
	}
	pcfg.Logger = log // the pool adds its component
	pool, err := netpool.New(pcfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	unlock, err := netpool.HostLock(pcfg, "state dir "+w.StateDir)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return pool, unlock, nil
}

func buildNative(w Workers, log *slog.Logger) (*Sidecars, error) {
	if w.StateDir == "" {
		return nil, fmt.Errorf("%w: the native runtime needs a state directory", ErrUsage)
	}
	pool, unlock, err := netPool(w, log)
	if err != nil {
		return nil, err
	}
	rt, err := newNative(w, w.StateDir, pool, log)
	if err != nil {
		unlock()
		return nil, err
	}
	return &Sidecars{pool: pool, unlock: unlock, nat: rt, stopOnExit: w.StopOnExit}, nil
}

func newNative(w Workers, stateDir string, pool *netpool.Pool, log *slog.Logger) (*native.Runtime, error) {
	return native.New(native.Config{StateDir: stateDir, Pool: pool, Shells: w.NativeShells,
		User: w.SandboxUser, NoTemplates: w.NoTemplates, MaxTemplates: w.MaxTemplates, Logger: log.With("component", "runtime", "runtime", "native")})
}

func buildContainerd(w Workers, log *slog.Logger) (*Sidecars, error) {
	// Shims and their containers can end up re-parented to this process;
	// it must reap them. Nothing else in a containerd worker waits for
	// children (see BecomeSubreaper).
	if err := ctrd.BecomeSubreaper(log.With("component", "reaper")); err != nil {
		log.Warn("cannot become a child subreaper; orphaned shims are left to PID 1", "err", err)
	}
	pool, unlock, err := netPool(w, log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := ctrd.New(ctx, ctrd.Config{Address: w.ContainerdAddress, Namespace: w.ContainerdNamespace, StateDir: w.StateDir,
		Pool: pool, Snapshotter: w.Snapshotter, Logger: log.With("component", "runtime")})
	if err != nil {
		unlock()
		return nil, err
	}
	return &Sidecars{pool: pool, unlock: unlock, ctr: rt, stopOnExit: w.StopOnExit}, nil
}

// close releases what BuildWorker made when the daemon will not run.
func (s *Sidecars) close() {
	if s.Host != nil {
		s.Host.Close()
	}
	if s.ctr != nil {
		s.ctr.Close()
	}
	if s.nat != nil {
		s.nat.Close()
	}
	if s.kube != nil {
		s.kube.Close()
	}
}

// RunWorker runs a daemon and, if present, its sidecars. With containerd it
// starts the network pool first; on the way out, once the daemon has killed
// its sandboxes (StopOnExit), it closes the pool, which removes every
// namespace, veth and the bridge. Without StopOnExit the sandboxes keep
// running with their namespaces, and the next worker on the same StateDir
// tears them down (the pool cannot hand a namespace to a new process yet).
func RunWorker(ctx context.Context, d *worker.Daemon, s *Sidecars) error {
	if s != nil && s.unlock != nil {
		defer s.unlock() // after the pool's Close below
	}
	if s != nil && s.pool != nil {
		if err := s.pool.Start(ctx); err != nil {
			s.close()
			return fmt.Errorf("worker: network pool: %w", err)
		}
	}
	if s != nil && s.nat != nil {
		s.nat.Start()
	}
	g, gctx := errgroup.WithContext(ctx)
	if s != nil && s.Host != nil {
		g.Go(func() error { return s.Host.Run(gctx) })
	}
	g.Go(func() error { return d.Run(gctx) })
	err := g.Wait()
	if s != nil && (s.kube != nil || s.ctr != nil || s.nat != nil) {
		s.close() // Pods not killed (StopOnExit) stay for a restarted worker
		if s.pool != nil && s.stopOnExit {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			if perr := s.pool.Close(cctx); perr != nil {
				err = errors.Join(err, fmt.Errorf("worker: network pool: %w", perr))
			}
			cancel()
		}
	}
	return err
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

// emulatedHost is the IP of listen ("host:port"), or 127.0.0.1 when it
// names none (empty, unspecified, a name).
func emulatedHost(listen string) string {
	h, _, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(h); err == nil && ip != nil && !ip.IsUnspecified() {
		return h
	}
	return "127.0.0.1"
}

package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/internal/spec"
)

// Config configures a control plane. Zero fields take the defaults below.
type Config struct {
	DataDir   string // registry location (required)
	AdminAddr string // HTTP/JSON admin API; default 127.0.0.1:9090
	GRPCAddr  string // gRPC for workers and data planes; default 127.0.0.1:9091
	Placement string // placement policy; default "kubernetes"
	// Autoscale holds the cluster-wide KPA defaults; functions override them.
	Autoscale autoscale.Config
	// TargetUtilization scales a sandbox's concurrency into the autoscaler's
	// target; default 1.0 (Dirigent's choice; Knative uses 0.7).
	TargetUtilization float64
	TickInterval      time.Duration // autoscaler period; default 2s (Knative)
	DrainDelay        time.Duration // endpoint withdrawn -> Tombstone sent; default 500ms
	NodeGrace         time.Duration // unreachable worker -> its sandboxes replaced, node fenced; default 10s
	StartupGrace      time.Duration // restart: wait this long for workers before placing; default 5s
	HandshakeTimeout  time.Duration // default 10s
	// HeartbeatTimeout ends a worker session that has sent nothing (workers
	// heartbeat every second) for this long; default 5s.
	HeartbeatTimeout  time.Duration
	FailureBackoff    time.Duration // first crash-loop backoff; default 200ms, doubling
	MaxFailureBackoff time.Duration // default 30s
	// Caps are the operator's hard limits on function specs; zero fields
	// take spec.DefaultCaps.
	Caps spec.Caps
	// AuthDisabled serves the admin API without tokens (a cluster behind
	// an authenticating proxy, or tests). By default every admin route but
	// /healthz needs a token, and the first start creates an admin token
	// in DataDir/admin.token.
	AuthDisabled bool
	Clock        clock.Clock
	Logger       *slog.Logger
	// WorkerLinkInterceptor, when set, wraps the control plane's end of every
	// link session it opens to a worker (the client stream of
	// Worker.Session). It is an extension point, like
	// httputil.ReverseProxy's hooks: the reliability tests use it to refuse
	// and cut sessions (internal/controlplane/faultnet_test.go). Nil, the
	// default, leaves the stream as gRPC made it.
	WorkerLinkInterceptor grpc.StreamClientInterceptor
	// Registry, when set, is the registry to use instead of a bbolt store in
	// DataDir (a raft replica: see RunReplica). Run leaves it open.
	Registry store.Registry
	// Term is the leadership term stamped on worker sessions; workers refuse
	// sessions of a lower term than one they have seen. 0 outside HA.
	Term uint64
	// Replica, when set, describes this control plane's replica set on
	// GET /v1/replica.
	Replica func() ReplicaView
}

func (c *Config) defaults() {
	c.Caps = c.Caps.WithDefaults()
	if c.AdminAddr == "" {
		c.AdminAddr = "127.0.0.1:9090"
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = "127.0.0.1:9091"
	}
	if c.Autoscale == (autoscale.Config{}) {
		c.Autoscale = autoscale.DefaultConfig()
	}
	if c.TargetUtilization == 0 {
		c.TargetUtilization = 1.0
	}
	if c.TickInterval == 0 {
		c.TickInterval = 2 * time.Second
	}
	if c.DrainDelay == 0 {
		c.DrainDelay = 500 * time.Millisecond
	}
	if c.NodeGrace == 0 {
		c.NodeGrace = 10 * time.Second
	}
	if c.StartupGrace == 0 {
		c.StartupGrace = 5 * time.Second
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 5 * time.Second
	}
	if c.FailureBackoff == 0 {
		c.FailureBackoff = 200 * time.Millisecond
	}
	if c.MaxFailureBackoff == 0 {
		c.MaxFailureBackoff = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// ControlPlane wires the registry, the cluster state, the gRPC service for
// workers and data planes, and the admin HTTP API.
type ControlPlane struct {
	briskv1.UnimplementedControlPlaneServer
	cfg     Config
	id      string
	log     *slog.Logger
	metrics *cpMetrics
	cluster *Cluster
	store   store.Registry
	tokens  *auth.Checker // the registry's tokens, for the admin API

	linkCtx context.Context
	linkWG  sync.WaitGroup
	kicks   sync.Map // node id -> chan struct{}

	adminLis, grpcLis net.Listener
	ready             chan struct{}
	nameLocks         [64]sync.Mutex
	dpSeen            sync.Map // data plane id -> time.Time of its last metrics report
	revMu             sync.Mutex
	lastRev           uint64
}

// New validates the config; it opens and starts nothing.
func New(cfg Config) (*ControlPlane, error) {
	cfg.defaults()
	if cfg.DataDir == "" && cfg.Registry == nil {
		return nil, errors.New("controlplane: data dir is required")
	}
	if err := cfg.Autoscale.Validate(); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	m := newMetrics()
	c, err := newCluster(cfg, m)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	return &ControlPlane{cfg: cfg, id: c.idPrefix, log: cfg.Logger, metrics: m, cluster: c, ready: make(chan struct{}), tokens: auth.NewChecker()}, nil
}

// Ready is closed once both listeners are bound.
func (cp *ControlPlane) Ready() <-chan struct{} { return cp.ready }

// AdminAddr is the bound admin address (after Ready).
func (cp *ControlPlane) AdminAddr() string { return cp.adminLis.Addr().String() }

// GRPCAddr is the bound gRPC address (after Ready).
func (cp *ControlPlane) GRPCAddr() string { return cp.grpcLis.Addr().String() }

// Run opens the registry, rebuilds state, serves, and returns when ctx ends.
func (cp *ControlPlane) Run(ctx context.Context) error {
	st := cp.cfg.Registry
	if st == nil {
		bolt, err := store.Open(cp.cfg.DataDir)
		if err != nil {
			return err
		}
		defer bolt.Close()
		st = bolt
	}
	cp.store, cp.cluster.store = st, st
	var err error
	if err := cp.loadQuotas(); err != nil { // before functions are placed
		return err
	}
	if err := cp.load(ctx); err != nil {
		return err
	}
	if err := cp.loadTokens(); err != nil {
		return err
	}

	if err := cp.bootstrapToken(); err != nil {
		return err
	}
	if cp.grpcLis, err = net.Listen("tcp", cp.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("controlplane: listen %s: %w", cp.cfg.GRPCAddr, err)
	}
	if cp.adminLis, err = net.Listen("tcp", cp.cfg.AdminAddr); err != nil {
		cp.grpcLis.Close()
		return fmt.Errorf("controlplane: listen %s: %w", cp.cfg.AdminAddr, err)
	}
	gs := grpc.NewServer(rpc.ServerOptions()...)
	briskv1.RegisterControlPlaneServer(gs, cp)
	hs := &http.Server{
		Handler:           cp.authenticate(cp.adminHandler()),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	close(cp.ready)
	cp.log.Info("control plane serving", "admin", cp.AdminAddr(), "grpc", cp.GRPCAddr(), "data_dir", cp.cfg.DataDir)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := gs.Serve(cp.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		if err := hs.Serve(cp.adminLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error { cp.every(gctx, cp.cfg.TickInterval, cp.cluster.tick); return nil })
	g.Go(func() error { cp.every(gctx, time.Second, cp.cluster.sampleLoad); return nil })
	g.Go(func() error {
		t := time.NewTimer(cp.cfg.StartupGrace)
		defer t.Stop()
		select {
		case <-gctx.Done():
		case <-t.C:
			cp.fenceSilentNodes()
			cp.cluster.mu.Lock()
			cp.cluster.resumeLocked("startup grace period over")
			cp.cluster.mu.Unlock()
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-sctx.Done():
			gs.Stop()
		}
		return nil
	})
	err = g.Wait()
	cp.linkWG.Wait()
	return err
}

// load rebuilds functions and workers from the registry and starts a link
// (recover handshake) to every known worker.
func (cp *ControlPlane) load(ctx context.Context) error {
	fns, err := cp.store.Functions()
	if err != nil {
		return err
	}
	workers, err := cp.store.Workers()
	if err != nil {
		return err
	}
	cp.linkCtx = ctx
	c := cp.cluster
	c.mu.Lock()
	c.paused = len(workers) > 0
	c.mu.Unlock()
	for _, f := range fns {
		cp.noteRevision(f.Revision)
		c.upsertFunction(f)
	}
	cp.metrics.functions.Set(float64(len(fns)))
	// Every known worker is registered before any link starts. The startup
	// pause ends once every registered worker has answered; registering and
	// linking them one by one let the first worker's handshake end it while
	// the others were not registered yet, and the control plane then placed
	// duplicates of the sandboxes they were about to report.
	nodes := make([]*nodeState, len(workers))
	starts := make([]bool, len(workers))
	for i, w := range workers {
		nodes[i], starts[i] = c.registerNode(w)
	}
	for i, w := range workers {
		cp.linkNode(w.ID, nodes[i], starts[i])
	}
	cp.log.Info("registry loaded", "functions", len(fns), "workers", len(workers))
	return nil
}

// fenceSilentNodes handles anomaly #2 (CHAIN.md §3.10 case 2): a worker
// that has not answered since this control plane (a restart, or a new
// leader) started may run sandboxes nobody here knows of. Placement is about
// to resume and replace them, so the worker is fenced first: its drain mark
// is made durable before anything is placed, and when it returns it kills
// everything before it answers. Written synchronously, outside the cluster
// lock: a crash right after must not forget the fence.
func (cp *ControlPlane) fenceSilentNodes() {
	c := cp.cluster
	var fenced []store.Worker
	c.mu.Lock()
	if !c.paused { // every worker known at the start has answered
		c.mu.Unlock()
		return
	}
	now := c.clk.Now()
	for _, n := range c.nodeList {
		if n.sess == nil && n.gen == 0 && !n.rec.Drain {
			n.rec.Drain = true
			c.place[n.idx].Schedulable = false
			if n.downSince.IsZero() {
				n.downSince = now
			}
			fenced = append(fenced, *n.rec)
		}
	}
	c.mu.Unlock()
	for i := range fenced {
		cp.log.Warn("worker silent since the control plane started: fencing it before placing", "node", fenced[i].ID)
		if err := cp.store.PutWorker(&fenced[i]); err != nil {
			cp.log.Error("persisting drain mark", "node", fenced[i].ID, "err", err)
		}
	}
}

func (cp *ControlPlane) startNode(w *store.Worker) {
	n, start := cp.cluster.registerNode(w)
	cp.linkNode(w.ID, n, start)
}

// linkNode starts node n's link (start) or makes the running one redial now.
func (cp *ControlPlane) linkNode(id string, n *nodeState, start bool) {
	kick, _ := cp.kicks.LoadOrStore(id, make(chan struct{}, 1))
	if start {
		cp.linkWG.Add(1)
		go func() { defer cp.linkWG.Done(); cp.runLink(cp.linkCtx, n, kick.(chan struct{})) }()
		return
	}
	select {
	case kick.(chan struct{}) <- struct{}{}:
	default:
	}
}

// every runs f every d on the cluster's clock until ctx ends: the
// autoscaler ticks (TickInterval) and the load samples (once a second,
// Knative's scrape interval).
func (cp *ControlPlane) every(ctx context.Context, d time.Duration, f func()) {
	t := cp.cluster.clk.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			f()
		}
	}
}

// ---------------------------------------------------------------- gRPC

// RegisterWorker records a worker durably and (re)starts its link.
func (cp *ControlPlane) RegisterWorker(ctx context.Context, r *briskv1.RegisterWorkerRequest) (*briskv1.RegisterWorkerResponse, error) {
	if r.GetNodeId() == "" || r.GetAddress() == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id and address are required")
	}
	c := cp.cluster
	c.mu.Lock()
	drain := false
	if n := c.nodes[r.GetNodeId()]; n != nil {
		drain = n.rec.Drain
	}
	c.mu.Unlock()
	w := &store.Worker{ID: r.GetNodeId(), Address: r.GetAddress(), MaxSandboxes: int(r.GetMaxSandboxes()), Runtime: r.GetRuntime(),
		Capacity: spec.Resources{MilliCPU: r.GetCapacity().GetMilliCpu(), MemoryMB: r.GetCapacity().GetMemoryMb()},
		Drain:    drain, RegisteredAt: time.Now().UTC()}
	if err := cp.store.PutWorker(w); err != nil {
		return nil, status.Errorf(codes.Unavailable, "persisting worker: %v", err)
	}
	cp.startNode(w)
	return &briskv1.RegisterWorkerResponse{ControlPlaneId: cp.id}, nil
}

// RegisterDataPlane records a data plane durably.
func (cp *ControlPlane) RegisterDataPlane(ctx context.Context, r *briskv1.RegisterDataPlaneRequest) (*briskv1.RegisterDataPlaneResponse, error) {
	if r.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is required")
	}
	if err := cp.store.PutDataPlane(&store.DataPlane{ID: r.GetId(), Address: r.GetAddress(), RegisteredAt: time.Now().UTC()}); err != nil {
		return nil, status.Errorf(codes.Unavailable, "persisting data plane: %v", err)
	}
	return &briskv1.RegisterDataPlaneResponse{ControlPlaneId: cp.id}, nil
}

// WatchEndpoints streams a snapshot, then deltas, until the data plane leaves.
func (cp *ControlPlane) WatchEndpoints(r *briskv1.WatchEndpointsRequest, stream briskv1.ControlPlane_WatchEndpointsServer) error {
	w := cp.cluster.subscribe(r.GetDataPlaneId())
	defer cp.cluster.unsubscribe(w)
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-w.notify:
		}
		if b := w.take(); b != nil {
			if err := stream.Send(b); err != nil {
				return err
			}
		}
	}
}

// ReportMetrics feeds the autoscalers.
func (cp *ControlPlane) ReportMetrics(ctx context.Context, r *briskv1.MetricsReport) (*briskv1.MetricsAck, error) {
	cp.cluster.recordMetrics(r)
	cp.dpSeen.Store(r.GetDataPlaneId(), time.Now())
	return &briskv1.MetricsAck{}, nil
}

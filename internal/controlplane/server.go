package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/internal/compat/dirigent"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config configures a control plane. Zero fields take the defaults below.
type Config struct {
	// grpcListener and adminListener, when set, are the sockets of
	// GRPCAddr and AdminAddr, bound already and kept open across terms
	// (RunReplica's views of them: handoff.go).
	grpcListener, adminListener net.Listener

	DataDir   string // registry location (required)
	AdminAddr string // HTTP/JSON admin API; default 127.0.0.1:9090
	// DirigentAddr, when set, serves Dirigent's registration contract
	// there (internal/compat/dirigent) for the InVitro loader;
	// DirigentImages is what a registered image runs as (dirigent.ImagesTrace,
	// the default, or dirigent.ImagesKeep).
	DirigentAddr   string
	DirigentImages string
	// DirigentKeepAlive, when set, is how long an idle sandbox of a function
	// registered there lives (its stable window, no grace): shorter than the
	// loader's RpsCooldownSeconds makes its "cold" calls cold.
	DirigentKeepAlive time.Duration
	GRPCAddr          string // gRPC for workers and data planes; default 127.0.0.1:9091
	Placement         string // placement policy; default "kubernetes"
	// KeepAlivePolicy is the default of functions whose spec names none:
	// spec.KeepAliveTTL (the default) or spec.KeepAliveGD.
	KeepAlivePolicy string
	// LoadBalancing is the default data-plane policy of functions whose
	// spec names none ("": least-loaded).
	LoadBalancing string
	// TemplateFraction is the fraction of the workers that make each
	// function from source's template at deploy (reconciler.Config).
	TemplateFraction float64
	// Autoscale holds the cluster-wide KPA defaults; functions override them.
	Autoscale autoscale.Config
	// TargetUtilization scales a sandbox's concurrency into the autoscaler's
	// target; default 1.0 (Dirigent's choice; Knative uses 0.7).
	TargetUtilization float64
	// ScalingMode is the default of functions whose spec names none:
	// spec.ModeAsync (the default) or spec.ModeDual.
	ScalingMode      string
	TickInterval     time.Duration // autoscaler period; default 2s (Knative)
	DrainDelay       time.Duration // endpoint withdrawn -> Tombstone sent, on Clock; default 500ms, negative: none
	NodeGrace        time.Duration // unreachable worker -> its sandboxes replaced, node fenced; default 10s
	StartupGrace     time.Duration // restart: wait this long for workers before placing; default 5s
	HandshakeTimeout time.Duration // default 10s
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
	// TrustedProxies are the hosts (addresses or names) whose
	// X-Forwarded-For the admin API's failed-authentication throttle
	// believes: the other replicas, whose followers forward their
	// clients' requests to the leader. Names are resolved when a request
	// needs them, at most every 30 s (a replica's Pod may come back with
	// another address).
	TrustedProxies []string
	// BootstrapAdminToken and BootstrapJoinToken, when set, are the first
	// admin and join tokens: registered when the registry has none of
	// their kind, instead of made and written to DataDir (brisk k8s
	// install makes them into a Secret every replica reads).
	BootstrapAdminToken, BootstrapJoinToken string
	// BootstrapDeployToken, when set, is registered as a deploy token
	// named bootstrap-deploy when the registry has none of that name and
	// nothing has used it yet (brisk k8s install gives the Function
	// controller one, not the admin token). Never made when not given.
	BootstrapDeployToken string

	Clock  clock.Clock
	Logger *slog.Logger
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
	// VerifyLeader, when set (a raft replica), is asked before every admin
	// read: a leader cut off or paused while another was elected answers
	// no read from its stale state (docs/reliability.md, "Partitions").
	VerifyLeader func() error
	// CA, when set, is the cluster CA: gRPC serves TLS with a certificate
	// it issues, every call but Join needs a client certificate of it, and
	// the first start writes a join token to DataDir/join.token (see
	// identity.go and docs/security.md). Nil serves plaintext gRPC
	// (--insecure-no-tls, and tests).
	CA *pki.CA
	// TLSSANs are extra host names and IP addresses for the gRPC server's
	// certificate (brisk checks identities, not host names; other clients
	// may).
	TLSSANs []string
	// AdminTLS, when set, serves the admin API over HTTPS.
	AdminTLS *tls.Config
	// Async, when set, is the asynchronous queue triggers queue their
	// calls in, and its NATS connection the one NATS triggers without a
	// URL subscribe on (docs/triggers.md). Nil: triggers are refused.
	Async *async.Queue
	// TriggerNATSAllow lists address ranges external NATS servers of
	// triggers may be at besides public addresses.
	TriggerNATSAllow []netip.Prefix
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
	if c.ScalingMode == "" {
		c.ScalingMode = spec.ModeAsync
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
	// Unsafe, not Unimplemented: every method of the service must be
	// ControlPlane's own, or the build fails (a method left on another
	// type would answer Unimplemented at run time).
	briskv1.UnsafeControlPlaneServer
	cfg     Config
	id      string
	log     *slog.Logger
	metrics *cpMetrics
	cluster *Cluster
	store   store.Registry
	dpSeen  sync.Map // data plane id -> time.Time of its last metrics report
	// tokens are the registry's tokens: the admin API's and the join
	// tokens workers and data planes present.
	tokens *auth.Checker
	// admin is the REST surface: functions, tokens, secrets, namespaces,
	// triggers, traffic, logs, the dashboard and Dirigent's registration
	// (internal/controlplane/admin). The ControlPlane itself is the link:
	// the gRPC service workers and data planes join and report to, and the
	// sessions to the workers (link.go, identity.go, watch.go).
	admin *admin.API

	dirigentLis net.Listener

	linkCtx context.Context
	linkWG  sync.WaitGroup
	kicks   sync.Map // node id -> chan struct{}

	adminLis, grpcLis net.Listener
	ready             chan struct{}
	ident             *pki.Identity // the gRPC server's and worker-link client's certificate (with CA)
	dpKeys            sync.Map      // data plane id -> key id its record is bound to
	nodeLocks         [64]sync.Mutex
	dpMu              sync.Mutex // serialises data plane registrations (the binding check)
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
	switch cfg.DirigentImages {
	case "":
		cfg.DirigentImages = dirigent.ImagesTrace
	case dirigent.ImagesTrace, dirigent.ImagesKeep:
	default:
		return nil, fmt.Errorf("controlplane: dirigent images %q: want %q or %q", cfg.DirigentImages, dirigent.ImagesTrace, dirigent.ImagesKeep)
	}
	m := newMetrics()
	c, err := newCluster(cfg, m)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	cp := &ControlPlane{cfg: cfg, id: c.idPrefix, log: cfg.Logger, metrics: m, cluster: c, tokens: auth.NewChecker(), ready: make(chan struct{})}
	var replica func() any
	if cfg.Replica != nil {
		replica = func() any { return cfg.Replica() }
	}
	cp.admin = admin.New(admin.Config{ID: c.idPrefix, DataDir: cfg.DataDir, Logger: cfg.Logger, Registry: m.reg, Functions: m.functions,
		AuthDisabled: cfg.AuthDisabled, BootstrapAdminToken: cfg.BootstrapAdminToken, BootstrapDeployToken: cfg.BootstrapDeployToken,
		TrustedProxies: cfg.TrustedProxies, Caps: cfg.Caps, DirigentImages: cfg.DirigentImages, DirigentKeepAlive: cfg.DirigentKeepAlive,
		Replica: replica, VerifyLeader: cfg.VerifyLeader, Async: cfg.Async, TriggerNATSAllow: cfg.TriggerNATSAllow,
		DataPlaneSeen: cp.dataPlaneSeen}, c, cp.tokens)
	return cp, nil
}

// dataPlaneSeen is when data plane id last reported metrics.
func (cp *ControlPlane) dataPlaneSeen(id string) (time.Time, bool) {
	t, ok := cp.dpSeen.Load(id)
	if !ok {
		return time.Time{}, false
	}
	return t.(time.Time), true
}

// Ready is closed once both listeners are bound.
func (cp *ControlPlane) Ready() <-chan struct{} { return cp.ready }

// AdminAddr is the bound admin address (after Ready).
func (cp *ControlPlane) AdminAddr() string { return cp.adminLis.Addr().String() }

// DirigentAddr is the bound registration address ("" without one).
func (cp *ControlPlane) DirigentAddr() string {
	if cp.dirigentLis == nil {
		return ""
	}
	return cp.dirigentLis.Addr().String()
}

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
	cp.admin.Open(st)
	// The control plane's identity first: load starts the links to known
	// workers, which present it.
	tlsCfg, err := cp.grpcTLS()
	if err != nil {
		return err
	}
	if err := cp.admin.LoadQuotas(); err != nil { // before functions are placed
		return err
	}
	if err := cp.admin.LoadSecrets(); err != nil { // before sandboxes are created
		return err
	}
	if err := cp.load(ctx); err != nil {
		return err
	}
	if err := cp.admin.LoadTokens(); err != nil {
		return err
	}
	if err := cp.admin.LoadTriggers(); err != nil {
		return err
	}

	if err := cp.admin.BootstrapToken(); err != nil {
		return err
	}
	if err := cp.bootstrapJoinToken(); err != nil {
		return err
	}
	if err := cp.admin.BootstrapDeployToken(); err != nil {
		return err
	}
	if err := cp.loadDataPlaneKeys(); err != nil {
		return err
	}
	if cp.grpcLis = cp.cfg.grpcListener; cp.grpcLis == nil {
		if cp.grpcLis, err = net.Listen("tcp", cp.cfg.GRPCAddr); err != nil {
			return fmt.Errorf("controlplane: listen %s: %w", cp.cfg.GRPCAddr, err)
		}
	}
	if cp.adminLis = cp.cfg.adminListener; cp.adminLis == nil {
		if cp.adminLis, err = net.Listen("tcp", cp.cfg.AdminAddr); err != nil {
			cp.grpcLis.Close()
			return fmt.Errorf("controlplane: listen %s: %w", cp.cfg.AdminAddr, err)
		}
	}
	if cp.cfg.DirigentAddr != "" {
		if cp.dirigentLis, err = net.Listen("tcp", cp.cfg.DirigentAddr); err != nil {
			cp.grpcLis.Close()
			cp.adminLis.Close()
			return fmt.Errorf("controlplane: listen %s: %w", cp.cfg.DirigentAddr, err)
		}
	}
	gs := grpc.NewServer(append(rpc.ServerOptions(tlsCfg), IdentityInterceptors(cp.cfg.CA)...)...)
	briskv1.RegisterControlPlaneServer(gs, cp)
	hs := &http.Server{
		Handler:           cp.admin.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	close(cp.ready)
	if cp.dirigentLis != nil {
		cp.log.Info("Dirigent registration listener", "addr", cp.dirigentLis.Addr().String(), "images", cp.cfg.DirigentImages)
	}
	cp.log.Info("control plane serving", "admin", cp.AdminAddr(), "grpc", cp.GRPCAddr(), "data_dir", cp.cfg.DataDir,
		"grpc_tls", cp.cfg.CA != nil, "admin_tls", cp.cfg.AdminTLS != nil)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := gs.Serve(cp.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		lis := cp.adminLis
		if cp.cfg.AdminTLS != nil {
			lis = tls.NewListener(lis, cp.cfg.AdminTLS)
		}
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	if cp.dirigentLis != nil {
		ds := &http.Server{
			Handler:           cp.admin.DirigentHandler(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
		}
		g.Go(func() error {
			if err := ds.Serve(cp.dirigentLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return ds.Shutdown(sctx)
		})
	}
	g.Go(func() error { cp.every(gctx, cp.cfg.TickInterval, cp.cluster.tick); return nil })
	g.Go(func() error { cp.every(gctx, time.Second, cp.cluster.sampleLoad); return nil })
	g.Go(func() error { cp.admin.RunTriggers(gctx); return nil })
	g.Go(func() error {
		t := time.NewTimer(cp.cfg.StartupGrace)
		defer t.Stop()
		select {
		case <-gctx.Done():
		case <-t.C:
			cp.fenceSilentNodes()
			cp.cluster.step(reconciler.Resume{Why: "startup grace period over"})
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
	if len(workers) > 0 {
		c.mu.Lock()
		c.r.Pause()
		c.mu.Unlock()
	}
	for _, f := range fns {
		cp.admin.NoteRevision(f.Revision)
		cp.admin.ApplyFunction(f)
	}
	cp.metrics.functions.Set(float64(len(fns)))
	// Every known worker is registered before any link starts. The startup
	// pause ends once every registered worker has answered; registering and
	// linking them one by one let the first worker's handshake end it while
	// the others were not registered yet, and the control plane then placed
	// duplicates of the sandboxes they were about to report.
	nodes := make([]*nodeLink, len(workers))
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

// fenceSilentNodes handles anomaly #2 (docs/reliability.md, case 2): a worker
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
	// Only drain marks come of it; they are written here, synchronously.
	for _, cmd := range c.r.Step(c.clk.Now(), reconciler.FenceSilent{}) {
		if p, ok := cmd.(reconciler.PersistWorker); ok {
			fenced = append(fenced, p.Worker)
		}
	}
	c.mu.Unlock()
	for i := range fenced {
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
func (cp *ControlPlane) linkNode(id string, n *nodeLink, start bool) {
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
	key, err := cp.caller(ctx, pki.KindWorker, r.GetNodeId())
	if err != nil {
		cp.log.Warn("worker registration refused", "node", r.GetNodeId(), "err", err)
		return nil, err
	}
	// One registration of an id at a time: the binding check and the
	// write that binds must not interleave with another key's.
	h := fnv.New32a()
	h.Write([]byte(r.GetNodeId()))
	lk := &cp.nodeLocks[h.Sum32()%uint32(len(cp.nodeLocks))]
	lk.Lock()
	defer lk.Unlock()
	c := cp.cluster
	c.mu.Lock()
	drain := false
	if rec, _, ok := c.r.Node(r.GetNodeId()); ok {
		drain = rec.Drain
		switch {
		case key == "":
			key = rec.KeyID // no TLS: keep the binding
		case rec.KeyID != "" && rec.KeyID != key:
			c.mu.Unlock()
			cp.log.Warn("worker registration refused: node id bound to another key", "node", r.GetNodeId())
			return nil, errClaimed(pki.KindWorker, r.GetNodeId())
		}
	}
	c.mu.Unlock()
	w := &store.Worker{ID: r.GetNodeId(), Address: r.GetAddress(), MaxSandboxes: int(r.GetMaxSandboxes()), Runtime: r.GetRuntime(),
		Capacity: spec.Resources{MilliCPU: r.GetCapacity().GetMilliCpu(), MemoryMB: r.GetCapacity().GetMemoryMb()},
		Drain:    drain, RegisteredAt: time.Now().UTC(), KeyID: key}
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
	key, err := cp.caller(ctx, pki.KindDataPlane, r.GetId())
	if err != nil {
		cp.log.Warn("data plane registration refused", "id", r.GetId(), "err", err)
		return nil, err
	}
	cp.dpMu.Lock()
	defer cp.dpMu.Unlock()
	if v, ok := cp.dpKeys.Load(r.GetId()); ok {
		switch {
		case key == "":
			key = v.(string)
		case v.(string) != key:
			cp.log.Warn("data plane registration refused: id bound to another key", "id", r.GetId())
			return nil, errClaimed(pki.KindDataPlane, r.GetId())
		}
	}
	if err := cp.store.PutDataPlane(&store.DataPlane{ID: r.GetId(), Address: r.GetAddress(), RegisteredAt: time.Now().UTC(), KeyID: key}); err != nil {
		return nil, status.Errorf(codes.Unavailable, "persisting data plane: %v", err)
	}
	if key != "" {
		cp.dpKeys.Store(r.GetId(), key)
	}
	return &briskv1.RegisterDataPlaneResponse{ControlPlaneId: cp.id}, nil
}

// WatchEndpoints streams a snapshot, then deltas, until the data plane leaves.
func (cp *ControlPlane) WatchEndpoints(r *briskv1.WatchEndpointsRequest, stream briskv1.ControlPlane_WatchEndpointsServer) error {
	if _, err := cp.caller(stream.Context(), pki.KindDataPlane, r.GetDataPlaneId()); err != nil {
		return err
	}
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
	if _, err := cp.caller(ctx, pki.KindDataPlane, r.GetDataPlaneId()); err != nil {
		return nil, err
	}
	cp.cluster.recordMetrics(r)
	cp.dpSeen.Store(r.GetDataPlaneId(), time.Now())
	return &briskv1.MetricsAck{}, nil
}

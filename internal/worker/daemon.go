package worker

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// NodeConfig describes one node hosted by a daemon.
type NodeConfig struct {
	ID           string
	Runtime      runtime.Runtime
	Capacity     spec.Resources
	MaxSandboxes int // 0 = unlimited
	// EmergencySlots is how many one-shot emergency sandboxes the node runs
	// at once for data planes (the dual track); 0 takes no emergency calls.
	EmergencySlots int
	// EmergencyRuntime starts the emergency sandboxes; nil: Runtime. A
	// fast runtime here beside a slower regular one (native beside
	// containerd) is PulseNet's pairing: regular instances as before,
	// the excess served in milliseconds.
	EmergencyRuntime runtime.Runtime
}

// Config configures a worker daemon.
type Config struct {
	Listen       string // gRPC listen address; default 127.0.0.1:0
	Advertise    string // address registered with the control plane; default the bound address
	ControlPlane string // control plane gRPC address; comma-separated replicas of an HA control plane
	Nodes        []NodeConfig
	// HeartbeatInterval is how often each node reports load; default 1s.
	HeartbeatInterval time.Duration
	// CreateTimeout bounds one sandbox start, detached from any RPC; default 2m.
	CreateTimeout time.Duration
	// FlushInterval batches state updates; default 1ms.
	FlushInterval time.Duration
	// StopSandboxesOnExit kills every sandbox when Run returns (brisk up);
	// otherwise they keep running and a restarted daemon adopts them.
	StopSandboxesOnExit bool
	Logger              *slog.Logger
	// SessionInterceptor, when set, wraps the worker's end of every
	// control-plane link session (Worker.Session; no other RPC). It is an
	// extension point, like httputil.ReverseProxy's hooks: the reliability
	// tests use it to drop, delay, duplicate, reorder and cut the messages of
	// a session (internal/controlplane/faultnet_test.go). Nil, the default,
	// serves sessions unwrapped.
	SessionInterceptor grpc.StreamServerInterceptor
	// Identity is the daemon's certificate (naming every hosted node) and
	// the cluster CA: the Worker service then serves TLS to control planes
	// only, and the daemon registers over mutual TLS. Join, when Identity
	// is nil, gets it at the start of Run (join token or stored
	// certificate). Neither: plaintext (--insecure-no-tls, tests).
	Identity *pki.Identity
	Join     *pki.Joiner
	// Lang runs functions deployed from source (spec.Code) on runtimes
	// that run commands: Dir is where their code is kept (empty: such
	// functions fail to start, saying why, except on the emulated
	// runtime, which runs nothing). Fetch is set by the daemon.
	Lang lang.Config
}

func (c *Config) defaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.CreateTimeout == 0 {
		c.CreateTimeout = 2 * time.Minute
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Daemon serves the Worker gRPC service for one or more nodes and keeps them
// registered with the control plane.
type Daemon struct {
	briskv1.UnimplementedWorkerServer
	cfg   Config
	log   *slog.Logger
	nodes map[string]*Node
	first *Node
	lis   net.Listener
	ready chan struct{}
	lang  *lang.Manager // nil without Config.Lang.Dir
	// cp is the control plane's client once Run has dialled it.
	cpMu sync.Mutex
	cp   briskv1.ControlPlaneClient
}

// New builds a daemon; it starts nothing.
func New(cfg Config) (*Daemon, error) {
	cfg.defaults()
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("worker: no nodes configured")
	}
	if cfg.ControlPlane == "" {
		return nil, errors.New("worker: control plane address is required")
	}
	boot := randomID()
	d := &Daemon{cfg: cfg, log: cfg.Logger, nodes: make(map[string]*Node), ready: make(chan struct{})}
	if cfg.Lang.Dir != "" {
		lc := cfg.Lang
		lc.Fetch, lc.Logger = d.fetchCode, cfg.Logger.With("component", "lang")
		var err error
		if d.lang, err = lang.New(lc); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	for _, nc := range cfg.Nodes {
		if nc.ID == "" || nc.Runtime == nil {
			return nil, errors.New("worker: every node needs an id and a runtime")
		}
		if _, dup := d.nodes[nc.ID]; dup {
			return nil, fmt.Errorf("worker: duplicate node id %q", nc.ID)
		}
		n := newNode(nc.ID, boot, nc.Runtime, nc.Capacity, nc.MaxSandboxes, cfg.CreateTimeout, cfg.Logger)
		n.em.slots = max(0, nc.EmergencySlots)
		n.lang = d.lang
		if nc.EmergencyRuntime != nil {
			n.emRT = nc.EmergencyRuntime
		}
		d.nodes[nc.ID] = n
		if d.first == nil {
			d.first = n
		}
	}
	return d, nil
}

// nodeIDs lists the hosted nodes' ids.
// liveSandboxes maps every sandbox the daemon's nodes hold to its
// function.
func (d *Daemon) liveSandboxes() map[string]string {
	out := map[string]string{}
	for _, n := range d.nodes {
		n.mu.Lock()
		for id, sb := range n.sandboxes {
			out[id] = sb.rec.GetFunction()
		}
		n.mu.Unlock()
	}
	return out
}

func (d *Daemon) nodeIDs() []string {
	ids := make([]string, 0, len(d.nodes))
	for _, nc := range d.cfg.Nodes {
		ids = append(ids, nc.ID)
	}
	return ids
}

// Node returns a hosted node by id (status and tests).
func (d *Daemon) Node(id string) *Node { return d.nodes[id] }

// Addr is the bound gRPC address, valid after Ready.
func (d *Daemon) Addr() string { return d.lis.Addr().String() }

// Ready is closed once the daemon listens.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// Run serves until ctx ends.
func (d *Daemon) Run(ctx context.Context) error {
	lis, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("worker: listen %s: %w", d.cfg.Listen, err)
	}
	d.lis = lis
	if d.cfg.Identity == nil && d.cfg.Join != nil {
		j := *d.cfg.Join
		j.Kind = pki.KindWorker
		j.IDs = d.nodeIDs()
		if d.cfg.Identity, err = j.Identity(ctx); err != nil {
			lis.Close()
			return fmt.Errorf("worker: %w", err)
		}
	}
	adv := d.cfg.Advertise
	if adv == "" {
		adv = lis.Addr().String()
	}
	for _, n := range d.nodes {
		n.adopt(ctx)
	}
	var tlsCfg *tls.Config
	if id := d.cfg.Identity; id != nil {
		// Only a control plane of the cluster may open sessions or push
		// images (the stream interceptor below); data planes may make
		// emergency calls (unary).
		tlsCfg = id.ServerTLS(true, pki.KindControlPlane, pki.KindDataPlane)
	}
	opts := rpc.ServerOptions(tlsCfg)
	opts = append(opts, grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := onlyControlPlane(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		if ic := d.cfg.SessionInterceptor; ic != nil && info.FullMethod == briskv1.Worker_Session_FullMethodName {
			return ic(srv, ss, info, h)
		}
		return h(srv, ss)
	}), grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod != briskv1.Worker_Emergency_FullMethodName {
			if err := onlyControlPlane(ctx, info.FullMethod); err != nil {
				return nil, err
			}
		}
		return h(ctx, req)
	}))
	srv := grpc.NewServer(opts...)
	briskv1.RegisterWorkerServer(srv, d)
	close(d.ready)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	var wg sync.WaitGroup
	rctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() { defer wg.Done(); d.registerLoop(rctx, adv) }()
	dirs := map[string]bool{}
	for _, n := range d.nodes {
		for _, rt := range n.runtimes() {
			if lk, ok := rt.(LogKeeper); ok && !dirs[lk.LogDir()] {
				dirs[lk.LogDir()] = true
				wg.Add(1)
				go func(dir string) { defer wg.Done(); keepLogs(rctx, dir, defaultLogLimits, d.liveSandboxes, d.log) }(lk.LogDir())
			}
		}
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		srv.Stop()
	}
	wg.Wait()
	for _, n := range d.nodes {
		for _, rt := range n.runtimes() {
			if ts, ok := rt.(interface{ StopTemplates() }); ok {
				ts.StopTemplates()
			}
		}
	}
	if d.cfg.StopSandboxesOnExit {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		var sw sync.WaitGroup
		for _, n := range d.nodes {
			sw.Add(1)
			go func() { defer sw.Done(); n.Stop(sctx) }()
		}
		sw.Wait()
		cancel()
	}
	for _, n := range d.nodes {
		for _, rt := range n.runtimes() {
			// What a runtime keeps on the host for its sandboxes, once
			// none is left (the process runtime's loopback guard).
			if sd, ok := rt.(interface{ Shutdown() error }); ok {
				if serr := sd.Shutdown(); serr != nil {
					d.log.Warn("runtime shutdown", "runtime", rt.Name(), "err", serr)
				}
			}
		}
	}
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// registerLoop registers every node with the control plane, and registers
// again whenever a node has had no session for a while (the control plane may
// have lost or never seen the record).
func (d *Daemon) registerLoop(ctx context.Context, adv string) {
	var creds credentials.TransportCredentials
	if id := d.cfg.Identity; id != nil {
		creds = credentials.NewTLS(id.ClientTLS(pki.KindControlPlane, ""))
	}
	conn, err := rpc.DialLeader(creds, d.cfg.ControlPlane)
	if err != nil {
		d.log.Error("worker: control plane address", "err", err)
		return
	}
	defer conn.Close()
	cp := briskv1.NewControlPlaneClient(conn)
	d.cpMu.Lock()
	d.cp = cp
	d.cpMu.Unlock()
	defer func() {
		d.cpMu.Lock()
		d.cp = nil
		d.cpMu.Unlock()
	}()
	registered := make(map[string]time.Time)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		for id, n := range d.nodes {
			n.mu.Lock()
			stale := !n.connected && time.Since(n.lastLive) > 3*time.Second
			n.mu.Unlock()
			last, done := registered[id]
			if done && (!stale || time.Since(last) < 3*time.Second) {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := cp.RegisterWorker(rctx, &briskv1.RegisterWorkerRequest{
				NodeId: id, Address: adv, BootId: n.bootID, MaxSandboxes: int32(n.max), Runtime: n.rt.Name(),
				Capacity: &briskv1.Resources{MilliCpu: n.capacity.MilliCPU, MemoryMb: n.capacity.MemoryMB},
			})
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					d.log.Debug("registering with control plane", "node", id, "err", err)
				}
				continue
			}
			registered[id] = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// fetchCode gets a code archive from the control plane (lang.Config.Fetch).
func (d *Daemon) fetchCode(ctx context.Context, digest string) ([]byte, error) {
	d.cpMu.Lock()
	cp := d.cp
	d.cpMu.Unlock()
	if cp == nil {
		return nil, errors.New("not connected to the control plane")
	}
	stream, err := cp.FetchCode(ctx, &briskv1.FetchCodeRequest{Digest: digest})
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(out)+len(m.GetData()) > spec.MaxCodeBytes {
			return nil, fmt.Errorf("the archive is over %d bytes", spec.MaxCodeBytes)
		}
		out = append(out, m.GetData()...)
	}
}

// Session serves one control-plane link session (see the package doc and
// docs/architecture.md for the handshake).
func (d *Daemon) Session(stream briskv1.Worker_SessionServer) error {
	n := d.first
	if md, ok := metadata.FromIncomingContext(stream.Context()); ok {
		if v := md.Get("brisk-node"); len(v) > 0 {
			if n = d.nodes[v[0]]; n == nil {
				return status.Errorf(codes.NotFound, "node %q is not hosted here", v[0])
			}
		}
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHello()
	if h == nil {
		return status.Error(codes.InvalidArgument, "first message of a session must be Hello")
	}
	if ok, seen := n.admit(h.GetTerm()); !ok {
		return status.Errorf(codes.FailedPrecondition, "control-plane term %d is older than term %d seen: a newer leader took over", h.GetTerm(), seen)
	}
	ctx := stream.Context()
	ack := n.install(ctx, h)
	epoch := h.GetEpoch()
	defer n.disconnected(epoch)
	var sendMu sync.Mutex
	send := func(m *briskv1.FromWorker) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		m.Epoch = epoch
		return stream.Send(m)
	}
	if err := send(&briskv1.FromWorker{Msg: &briskv1.FromWorker_HelloAck{HelloAck: ack}}); err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	senderDone := make(chan error, 1)
	go func() { senderDone <- d.sendLoop(sctx, n, epoch, send) }()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if m.GetEpoch() != epoch || n.currentEpoch() != epoch {
			// A newer session took over: this stream is stale.
			return status.Error(codes.FailedPrecondition, "stale session epoch")
		}
		switch msg := m.Msg.(type) {
		case *briskv1.ToWorker_Fetch:
			if err := send(&briskv1.FromWorker{Msg: &briskv1.FromWorker_Fetch{Fetch: n.fetch(msg.Fetch.GetIds())}}); err != nil {
				return err
			}
		case *briskv1.ToWorker_Commands:
			if !n.apply(ctx, epoch, msg.Commands) {
				return status.Error(codes.FailedPrecondition, "stale session epoch")
			}
		case *briskv1.ToWorker_Hello:
			return status.Error(codes.InvalidArgument, "Hello inside a live session")
		}
		select {
		case err := <-senderDone:
			return err
		default:
		}
	}
}

// sendLoop flushes state updates in small batches and sends heartbeats.
func (d *Daemon) sendLoop(ctx context.Context, n *Node, epoch uint64, send func(*briskv1.FromWorker) error) error {
	hb := time.NewTicker(d.cfg.HeartbeatInterval)
	defer hb.Stop()
	// First heartbeat at once so the control plane knows the node's load.
	if err := send(&briskv1.FromWorker{Msg: &briskv1.FromWorker_Updates{Updates: &briskv1.Updates{Heartbeat: n.heartbeat()}}}); err != nil {
		return err
	}
	for {
		var beat *briskv1.Heartbeat
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.notify:
			// Let a burst of state changes gather into one batch.
			if d.cfg.FlushInterval > 0 {
				t := time.NewTimer(d.cfg.FlushInterval)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
			}
		case <-hb.C:
			beat = n.heartbeat()
		}
		recs, ok := n.takePending(epoch)
		if !ok {
			return status.Error(codes.FailedPrecondition, "session superseded")
		}
		if len(recs) == 0 && beat == nil {
			continue
		}
		if err := send(&briskv1.FromWorker{Msg: &briskv1.FromWorker_Updates{Updates: &briskv1.Updates{Records: recs, Heartbeat: beat}}}); err != nil {
			return err
		}
	}
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/compat/lambda"
	"github.com/brisk-faas/brisk/internal/dataplane/endpoints"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/internal/rpc"
)

// DataPlane is one data plane: the invocation proxy plus its link to the
// control plane. Create it with New and start it with Run.
type DataPlane struct {
	// synced is set once the first endpoint snapshot is applied; until
	// then /healthz answers 503, so a front door does not send calls to a
	// data plane that knows no function yet.
	synced atomic.Bool
	// applied is closed and replaced after every applied batch: a call for
	// a function not known yet waits on it (see awaitFunction).
	applied      atomic.Pointer[chan struct{}]
	awaiting     atomic.Int64 // calls waiting in awaitFunction now
	cfg          Config
	log          *slog.Logger
	epoch        time.Time // base of nanotime
	epochNs      int64     // epoch in Unix ns: X-Start-Time = epochNs + a call's arrival
	rnd          func() uint64
	prom         *promMetrics
	transport    *http.Transport
	proxy        *httputil.ReverseProxy
	handler      http.Handler
	bodyTooLarge string
	fwdProto     string     // X-Forwarded-Proto of calls: http or https (Config.TLS)
	bodyBudget   bodyBudget // bytes buffered bodies may still hold (body.go)
	// Invocation auth (auth.go): the tokens the control plane sent, and
	// whether it asks for them at all.
	tokens *auth.Checker
	// lambda serves the AWS Lambda API over the data plane (lambda.go).
	lambda *lambda.API
	authOn atomic.Bool
	// bodiesReading counts requests reading their body ahead of the call.
	bodiesReading atomic.Int64
	// em is the dual track's emergency path (emergency.go).
	em emergencyTrack

	// Routing table: name -> *function. Lookups take no lock; Apply writes
	// entries one by one under applyMu, so a batch costs what it changes,
	// not the size of the table.
	fns   sync.Map
	epSeq atomic.Uint64 // endpoint add counter; see endpoint.seq

	applyMu   sync.Mutex
	table     *table               // the routing table the published sets come from; guarded by applyMu
	pools     map[string]*connPool // sandbox address -> upstream connections; guarded by applyMu
	leftPools []*connPool          // references to drop at the end of an Apply; guarded by applyMu
	nsCount   map[string]int       // the routing table's functions per namespace; guarded by applyMu
	// namespaces is nsCount's keys, for Host routing (lookupHost).
	namespaces atomic.Pointer[map[string]bool]

	// Urgent (no-capacity) reports: functions to include, and a 1-slot
	// doorbell that coalesces triggers while one report is in flight.
	// active: the functions with load to report (not quiet), which the
	// reports visit instead of the whole table (thousands of functions
	// are mostly idle). Guarded by activeMu, with each function's listed.
	activeMu   sync.Mutex
	active     []*function
	urgentMu   sync.Mutex
	urgentFns  []*function
	urgentBell chan struct{}

	unreach unreachable // endpoints calls could not connect to (deadends.go)

	// draining: endpoints withdrawn with calls still in them, which every
	// report lists until the calls end, so that the control plane kills
	// the sandbox only then (drainingIDs).
	drainMu  sync.Mutex
	draining []drainingEndpoint

	started atomic.Bool
	id      atomic.Pointer[string]
	addr    atomic.Pointer[string]
	ready   chan struct{}
}

// New validates cfg and builds a data plane. It starts nothing and binds
// nothing.
func New(cfg Config) (*DataPlane, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &DataPlane{
		cfg:          cfg,
		log:          cfg.Logger,
		epoch:        time.Now(),
		rnd:          loadbalance.NewRand(rand.Uint64()),
		transport:    newTransport(),
		table:        endpoints.New[*fnConf, *endpoint](),
		nsCount:      make(map[string]int),
		pools:        make(map[string]*connPool),
		urgentBell:   make(chan struct{}, 1),
		unreach:      unreachable{bell: make(chan struct{}, 1)},
		ready:        make(chan struct{}),
		bodyTooLarge: fmt.Sprintf("request body larger than %d bytes", cfg.MaxBodyBytes),
		fwdProto:     "http",
	}
	if cfg.TLS != nil {
		d.fwdProto = "https"
	}
	d.epochNs = d.epoch.UnixNano()
	d.bodyBudget.left.Store(cfg.BodyBufferTotal)
	d.tokens = auth.NewChecker()
	d.lambda = lambda.New(lambdaBackend{d})
	var extra []prometheus.Collector
	if cfg.Async != nil {
		extra = cfg.Async.Collectors()
	}
	prom, err := newPromMetrics(cfg.Registerer, d.functions, &d.bodiesReading, extra)
	if err != nil {
		return nil, err
	}
	d.prom = prom
	if cfg.ID != "" {
		d.id.Store(&cfg.ID)
	}
	ch := make(chan struct{})
	d.applied.Store(&ch)
	d.proxy = &httputil.ReverseProxy{
		Rewrite:        d.rewrite,
		Transport:      d.transport,
		BufferPool:     &proxy.BufferPool{},
		ModifyResponse: d.modifyResponse,
		ErrorHandler:   d.proxyError,
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	d.handler = http.HandlerFunc(d.serveHTTP)
	return d, nil
}

// Handler returns the invocation handler, the same one Run serves.
func (d *DataPlane) Handler() http.Handler { return d.handler }

// Ready is closed once Run has bound its listener.
func (d *DataPlane) Ready() <-chan struct{} { return d.ready }

// Addr returns the bound invocation address, or "" before Ready.
func (d *DataPlane) Addr() string {
	if a := d.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// ID returns the data plane's id; a defaulted id is known once Ready.
func (d *DataPlane) ID() string {
	if id := d.id.Load(); id != nil {
		return *id
	}
	return ""
}

func (d *DataPlane) nanotime() int64 { return int64(time.Since(d.epoch)) }

// Run binds Listen and serves HTTP/1.1 and h2c, or with Config.TLS
// HTTP/1.1 over TLS (the front end, internal/dataplane/front, with net/http
// behind it), and with a ControlPlane
// address keeps the endpoint watch and the metric reports running. It
// returns after ctx ends and a graceful Shutdown (bounded by
// ShutdownTimeout), or when serving fails.
func (d *DataPlane) Run(ctx context.Context) error {
	if !d.started.CompareAndSwap(false, true) {
		return errors.New("dataplane: Run called twice")
	}
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("dataplane: listen %s: %w", d.cfg.Listen, err)
	}
	addr := ln.Addr().String()
	d.addr.Store(&addr)
	if d.id.Load() == nil {
		host, _ := os.Hostname()
		_, port, _ := net.SplitHostPort(addr)
		id := fmt.Sprintf("dp-%s-%s", host, port)
		d.id.Store(&id)
	}
	if d.cfg.ControlPlane != "" && d.cfg.Identity == nil && d.cfg.Join != nil {
		j := *d.cfg.Join
		j.Kind, j.IDs = pki.KindDataPlane, []string{d.ID()}
		if d.cfg.Identity, err = j.Identity(ctx); err != nil {
			ln.Close()
			return fmt.Errorf("dataplane: %w", err)
		}
	}
	close(d.ready)

	if d.cfg.TLS != nil {
		ln = tls.NewListener(ln, listenerTLS(d.cfg.TLS))
	}
	fe := d.newFrontEnd(d.newServer())
	serveErr := make(chan error, 1)
	go func() { serveErr <- fe.Serve(ln) }()
	reapCtx, stopReap := context.WithCancel(ctx)
	defer stopReap()
	go d.reapIdle(reapCtx)

	linkCtx, stopLink := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLink()
	var wg sync.WaitGroup
	if d.cfg.ControlPlane != "" {
		// Shared brisk dial options: capped reconnect backoff, keepalives,
		// a 64 MiB receive limit for large snapshots.
		// Several addresses (comma-separated) are the replicas of an HA
		// control plane: the connection follows their leader.
		var creds credentials.TransportCredentials
		if id := d.cfg.Identity; id != nil {
			creds = credentials.NewTLS(id.ClientTLS(pki.KindControlPlane, ""))
		}
		conn, err := rpc.DialLeader(creds, d.cfg.ControlPlane)
		if err != nil {
			fe.Close()
			return fmt.Errorf("dataplane: control plane %s: %w", d.cfg.ControlPlane, err)
		}
		defer conn.Close()
		l := newLink(d, conn)
		wg.Go(func() { l.watch(linkCtx) })
		wg.Go(func() { l.reportPeriodic(linkCtx) })
		wg.Go(func() { l.reportUrgent(linkCtx) })
		wg.Go(func() { l.reportUnreachable(linkCtx) })
	}
	if d.cfg.Async != nil {
		// The consumer stops with ctx: its running attempts end and their
		// calls go back to the queue for another data plane (or this one
		// after a restart).
		wg.Go(func() { d.runAsync(ctx) })
	}
	d.log.Info("data plane serving", "id", d.ID(), "addr", addr, "control_plane", d.cfg.ControlPlane)

	select {
	case <-ctx.Done():
		err = nil
	case err = <-serveErr:
		err = fmt.Errorf("dataplane: serve %s: %w", addr, err)
	}
	// Drain with the link still up, so queued requests can still get the
	// sandboxes the control plane is starting for them.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ShutdownTimeout)
	if serr := fe.Shutdown(sctx); serr != nil {
		d.log.Warn("graceful shutdown incomplete; closing connections", "err", serr)
	}
	cancel()
	stopLink()
	wg.Wait()
	d.transport.CloseIdleConnections()
	d.em.close()
	d.applyMu.Lock()
	for _, p := range d.pools {
		p.Close()
	}
	d.applyMu.Unlock()
	return err
}

// listenerTLS is cfg for the invocation listener: TLS 1.2 or later, and
// HTTP/1.1 the only protocol offered (the front end reads HTTP/1.1; the
// net/http server behind it sees decrypted bytes on a connection that is
// not a *tls.Conn, so it could not serve h2 anyway).
func listenerTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS12)
	c.NextProtos = []string{"http/1.1"}
	return c
}

// newServer is the net/http server behind the front end: it serves the
// connections the front end hands over (HTTP/1.1, and h2c unless the
// listener is TLS: prior-knowledge HTTP/2 inside TLS is not offered).
func (d *DataPlane) newServer() *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(d.cfg.TLS == nil)
	return &http.Server{
		Handler:           d.handler,
		Protocols:         &protocols,
		ReadHeaderTimeout: d.cfg.ReadHeaderTimeout,
		ReadTimeout:       d.cfg.ReadTimeout,
		WriteTimeout:      d.cfg.WriteTimeout,
		IdleTimeout:       d.cfg.IdleTimeout,
		MaxHeaderBytes:    d.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelDebug),
	}
}

// reapIdle closes upstream connections idle past idleTimeout until ctx
// ends.
func (d *DataPlane) reapIdle(ctx context.Context) {
	proxy.Reap(ctx, idleTimeout, func() []*proxy.Pool {
		d.applyMu.Lock()
		defer d.applyMu.Unlock()
		pools := make([]*proxy.Pool, 0, len(d.pools))
		for _, p := range d.pools {
			pools = append(pools, p.Pool)
		}
		return pools
	})
}

// noteActive puts fn on the reporting list (an arrival woke it, or an
// uncounted emergency call left a latency to report).
func (d *DataPlane) noteActive(fn *function) {
	d.activeMu.Lock()
	if !fn.listed {
		fn.listed = true
		d.active = append(d.active, fn)
	}
	d.activeMu.Unlock()
}

// ringUrgent rings the urgent report's doorbell.
func (d *DataPlane) ringUrgent() {
	select {
	case d.urgentBell <- struct{}{}:
	default:
	}
}

// markUrgent queues fn for an immediate no-capacity report and rings the
// doorbell. Many triggers before the reporter wakes make one report.
func (d *DataPlane) markUrgent(fn *function) {
	if fn.urgent.CompareAndSwap(false, true) {
		d.urgentMu.Lock()
		d.urgentFns = append(d.urgentFns, fn)
		d.urgentMu.Unlock()
	}
	d.ringUrgent()
}

package gateway

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brisk-faas/brisk/internal/naming"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/internal/telemetry"
)

// Gateway proxies invocations to data planes, each function to the one its
// name hashes to. Create it with New and start it with Run.
type Gateway struct {
	cfg       Config
	log       *slog.Logger
	dps       []*backend
	prom      *promMetrics
	none      *telemetry.CodeCounters // requests no data plane could take
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	health    *http.Client
	handler   http.Handler

	started atomic.Bool
	addr    atomic.Pointer[string]
	ready   chan struct{}
}

// backend is one data plane.
type backend struct {
	idx      int
	addr     string
	hash     uint64
	hdr      []string // X-Brisk-Dataplane value, shared by every response
	conns    *proxy.Pool
	up       atomic.Bool
	fails    int // consecutive failed probes; touched only by the prober
	requests *telemetry.CodeCounters
	connFail prometheus.Counter
}

// New validates cfg and builds a gateway. It starts nothing and binds
// nothing.
func New(cfg Config) (*Gateway, error) {
	cfg = cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	prom, err := newPromMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	g := &Gateway{
		cfg:       cfg,
		log:       cfg.Logger,
		prom:      prom,
		none:      &telemetry.CodeCounters{Vec: prom.requests, Label: noDataPlane},
		transport: newTransport(),
		ready:     make(chan struct{}),
	}
	for i, a := range cfg.DataPlanes {
		b := &backend{idx: i, addr: a, hash: hashString(a), hdr: []string{a},
			conns:    proxy.NewPool(a, maxIdlePerDataPlane, upstreamBufSize),
			requests: &telemetry.CodeCounters{Vec: prom.requests, Label: a},
			connFail: prom.failovers.WithLabelValues(a)}
		// Up until shown otherwise: a data plane that is down at start is
		// found by the first probes, or sooner by the first request that
		// fails to connect to it, which then moves on to the next one.
		b.up.Store(true)
		if err := prom.upGauge(b); err != nil {
			return nil, err
		}
		g.dps = append(g.dps, b)
	}
	g.health = &http.Client{
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: dialTimeout}).DialContext,
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      retryTransport{g},
		BufferPool:     &proxy.BufferPool{},
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.proxyError,
		ErrorLog:       slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	g.handler = http.HandlerFunc(g.serveHTTP)
	return g, nil
}

// Handler returns the gateway's HTTP handler, the same one Run serves.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Ready is closed once Run has bound its listener.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Addr returns the bound listen address, or "" before Ready.
func (g *Gateway) Addr() string {
	if a := g.addr.Load(); a != nil {
		return *a
	}
	return ""
}

// Run binds Listen, serves HTTP/1.1 and h2c (HTTP/1.1 over TLS with
// Config.TLS), and probes the data planes. It
// returns after ctx ends and a graceful shutdown, or when serving fails.
func (g *Gateway) Run(ctx context.Context) error {
	if !g.started.CompareAndSwap(false, true) {
		return errors.New("gateway: Run called twice")
	}
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen %s: %w", g.cfg.Listen, err)
	}
	addr := ln.Addr().String()
	g.addr.Store(&addr)
	close(g.ready)

	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(g.cfg.TLS == nil)
	if g.cfg.TLS != nil {
		// net/http bounds the handshake by ReadHeaderTimeout.
		tc := g.cfg.TLS.Clone()
		tc.MinVersion = max(tc.MinVersion, tls.VersionTLS12)
		tc.NextProtos = []string{"http/1.1"}
		ln = tls.NewListener(ln, tc)
	}
	srv := &http.Server{
		Handler:           http10Closes(g.handler),
		Protocols:         &protocols,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		// No WriteTimeout: it would bound the whole response, and only the
		// data plane knows each function's timeout (it extends its own
		// write deadline per function); the data plane ends calls that
		// overrun, which ends them here too.
		IdleTimeout:    idleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	probeCtx, stopProbes := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProbes()
	var wg sync.WaitGroup
	for _, b := range g.dps {
		wg.Go(func() { g.probeLoop(probeCtx, b) })
	}
	wg.Go(func() { g.reapIdle(probeCtx) })
	g.log.Info("gateway serving", "addr", addr, "data_planes", g.cfg.DataPlanes)

	select {
	case <-ctx.Done():
		err = nil
	case err = <-serveErr:
		err = fmt.Errorf("gateway: serve %s: %w", addr, err)
	}
	// Keep probing while draining, so requests still in flight can fail
	// over if a data plane goes away meanwhile.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	if serr := srv.Shutdown(sctx); serr != nil {
		g.log.Warn("graceful shutdown incomplete; closing connections", "err", serr)
		_ = srv.Close()
	}
	cancel()
	stopProbes()
	wg.Wait()
	g.transport.CloseIdleConnections()
	for _, b := range g.dps {
		b.conns.Prune(math.MaxInt64)
	}
	g.health.CloseIdleConnections()
	return err
}

// callsPath is the data planes' asynchronous-call API (brisk calls).
const callsPath = "/v1/calls"

func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	name, byPath := functionOf(r)
	if byPath && name != "" || !byPath && naming.NamesFunction(name) {
		g.forward(w, r, name)
		return
	}
	if !byPath {
		if r.URL.Path == callsPath || strings.HasPrefix(r.URL.Path, callsPath+"/") {
			// Every data plane serves the one queue's calls: the one
			// this fixed key hashes to (or the next up) will do.
			g.forward(w, r, callsPath)
			return
		}
		switch r.URL.Path {
		case "/healthz":
			w.Header()["Content-Type"] = hdrText
			_, _ = w.Write([]byte("ok\n"))
			return
		case "/metrics":
			if g.prom.handler != nil {
				if !g.metricsAllowed(r) {
					writeError(w, r.Header["X-Call-Id"], nil, http.StatusForbidden, "forbidden",
						"/metrics: send the gateway's --metrics-token as a bearer token (without one, only loopback clients may read it)")
					return
				}
				g.prom.handler.ServeHTTP(w, r)
				return
			}
		}
	}
	writeError(w, r.Header["X-Call-Id"], nil, http.StatusNotFound, reasonNoFunction,
		"no function named in the request: call /function/NAME/... or send a Host header whose first label is the function name")
}

// metricsAllowed: the request carries the metrics token, or there is none
// and it comes from this host.
func (g *Gateway) metricsAllowed(r *http.Request) bool {
	if tok := g.cfg.MetricsToken; tok != "" {
		got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return subtle.ConstantTimeCompare([]byte(got), []byte(tok)) == 1
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

// setUp records a data plane's health and logs the transitions.
func (g *Gateway) setUp(b *backend, up bool, reason error) {
	if b.up.Swap(up) == up {
		return
	}
	if up {
		g.log.Info("data plane up", "dataplane", b.addr)
	} else {
		g.log.Warn("data plane down", "dataplane", b.addr, "err", reason)
	}
}

// probeLoop checks b every HealthInterval, starting at once.
func (g *Gateway) probeLoop(ctx context.Context, b *backend) {
	t := time.NewTicker(g.cfg.HealthInterval)
	defer t.Stop()
	for {
		if err := g.probe(ctx, b); err == nil {
			b.fails = 0
			g.setUp(b, true, nil)
		} else if ctx.Err() == nil {
			// One lost probe on a busy machine is not an outage; two are.
			if b.fails++; b.fails >= 2 {
				g.setUp(b, false, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *Gateway) probe(ctx context.Context, b *backend) error {
	ctx, cancel := context.WithTimeout(ctx, min(g.cfg.HealthInterval, maxHealthTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.addr+"/healthz", nil)
	if err != nil {
		return err
	}
	// A data plane routes by Host before it serves /healthz: a host name
	// that is also a function's name would send the probe to the function.
	req.Host = "localhost"
	resp, err := g.health.Do(req)
	if err != nil {
		return err
	}
	// Read the short body so the connection is kept for the next probe.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /healthz: %s", resp.Status)
	}
	return nil
}

// http10Closes closes an HTTP/1.0 connection after its request. net/http
// ignores Transfer-Encoding on HTTP/1.0 requests, so on a kept-alive one
// it would read a chunked body as the next request (a desync); RFC 9112
// section 6.1 has such framing treated as faulty and the connection
// closed. HTTP/1.0 clients that keep connections alive are rare enough
// that closing all of them costs nothing worth keeping.
func http10Closes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 && r.ProtoMinor == 0 {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

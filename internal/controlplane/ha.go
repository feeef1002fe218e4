package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/controlplane/replica"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/pkg/api"
)

// ReplicaView is GET /v1/replica: this replica's role in its replica set.
type ReplicaView struct {
	ID     string         `json:"id"`
	Role   string         `json:"role"` // "leader" or "follower"
	Term   uint64         `json:"term"`
	Leader *replica.Peer  `json:"leader,omitempty"`
	Peers  []replica.Peer `json:"peers"`
}

func replicaView(reg *replica.Registry, peers []replica.Peer) ReplicaView {
	v := ReplicaView{ID: reg.Self().ID, Role: "follower", Term: reg.Term(), Peers: peers}
	if reg.IsLeader() {
		v.Role = "leader"
	}
	if l, ok := reg.Leader(); ok {
		v.Leader = &l
	}
	return v
}

// RunReplica runs one replica of a replicated control plane until ctx ends.
// While reg's replica is the raft leader it runs a whole ControlPlane on
// cfg's addresses over reg: registry loaded, every known worker recovered
// with the recover handshake, endpoints streamed to the data planes that
// reconnect. When leadership ends, that ControlPlane stops (its worker
// sessions end, and the workers refuse its term from then on) and the replica
// serves as a follower on the same addresses: admin calls are proxied to
// the leader, gRPC calls answered with the leader's address (rpc.LeaderConn
// follows it). Each term gets a fresh ControlPlane, so nothing of a former
// term's sandbox view survives: the workers are the source of truth.
func RunReplica(ctx context.Context, cfg Config, reg *replica.Registry, peers []replica.Peer) error {
	cfg.defaults()
	log := cfg.Logger.With("replica", reg.Self().ID)
	// The addresses are bound once, for every term and role (handoff.go).
	grpcLis, err := listenRetry(ctx, cfg.GRPCAddr)
	if err != nil {
		return err
	}
	adminLis, err := listenRetry(ctx, cfg.AdminAddr)
	if err != nil {
		grpcLis.Close()
		return err
	}
	grpcH, adminH := newHandoff(grpcLis), newHandoff(adminLis)
	defer grpcH.close()
	defer adminH.close()
	for ctx.Err() == nil {
		cfg.grpcListener, cfg.adminListener = grpcH.view(), adminH.view()
		if reg.IsLeader() {
			if err := runTerm(ctx, cfg, reg, peers); err != nil && ctx.Err() == nil {
				log.Error("leader term ended with an error", "err", err)
				// A short pause keeps a persistent failure from spinning.
				sleepCtx(ctx, 100*time.Millisecond)
			}
			continue
		}
		if err := runFollower(ctx, cfg, reg, peers); err != nil && ctx.Err() == nil {
			log.Error("follower server", "err", err)
			sleepCtx(ctx, 100*time.Millisecond)
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// runTerm serves as leader until leadership or ctx ends.
func runTerm(ctx context.Context, cfg Config, reg *replica.Registry, peers []replica.Peer) error {
	for _, p := range peers {
		if host, _, err := net.SplitHostPort(p.AdminAddr); err == nil && host != "" && p.ID != reg.Self().ID {
			cfg.TrustedProxies = append(cfg.TrustedProxies, host)
		}
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// Leadership lost ends the term. The poll backs up the channel,
		// which keeps only the latest value.
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case v := <-reg.LeaderCh():
				if !v {
					cancel()
					return
				}
			case <-t.C:
				if !reg.IsLeader() {
					cancel()
					return
				}
			}
		}
	}()
	wctx, wcancel := context.WithTimeout(tctx, 10*time.Second)
	err := reg.WaitLeader(wctx)
	wcancel()
	if err != nil {
		return nil // not leader after all: the loop serves as follower
	}
	start := time.Now()
	cfg.Registry, cfg.Term = reg, reg.Term()
	cfg.Replica = func() ReplicaView { return replicaView(reg, peers) }
	cfg.VerifyLeader = reg.VerifyLeader
	cp, err := New(cfg)
	if err != nil {
		return err
	}
	go func() {
		select {
		case <-cp.Ready():
			cfg.Logger.Info("leading the control plane", "replica", reg.Self().ID, "term", cfg.Term, "ready_in", time.Since(start))
		case <-tctx.Done():
		}
	}()
	err = cp.Run(tctx)
	cfg.Logger.Info("leader term over", "replica", reg.Self().ID, "term", cfg.Term)
	return err
}

// runFollower serves the follower's admin and gRPC listeners (cfg's views
// of the replica's sockets) until this replica becomes leader or ctx ends.
func runFollower(ctx context.Context, cfg Config, reg *replica.Registry, peers []replica.Peer) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	grpcLis, adminLis := cfg.grpcListener, cfg.adminListener
	var tlsCfg *tls.Config
	if cfg.CA != nil {
		id, err := ServerIdentity(cfg.CA, reg.Self().ID, cfg.GRPCAddr, cfg.TLSSANs)
		if err != nil {
			grpcLis.Close()
			adminLis.Close()
			return err
		}
		tlsCfg = id.ServerTLS(false)
	}
	if cfg.AdminTLS != nil {
		adminLis = tls.NewListener(adminLis, cfg.AdminTLS)
	}
	gs := grpc.NewServer(rpc.ServerOptions(tlsCfg)...)
	briskv1.RegisterControlPlaneServer(gs, &follower{reg: reg})
	hs := &http.Server{
		Handler:           auth.RefuseForged(followerAdmin(reg, peers, cfg.AdminTLS), cfg.AuthDisabled, admin.WriteError),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go func() { _ = gs.Serve(grpcLis) }()
	go func() { _ = hs.Serve(adminLis) }()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
wait:
	for {
		select {
		case <-fctx.Done():
			break wait
		case v := <-reg.LeaderCh():
			if v {
				break wait
			}
		case <-t.C:
			if reg.IsLeader() {
				break wait
			}
		}
	}
	// Quickly: the leader's servers take these sockets next.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	defer scancel()
	_ = hs.Shutdown(sctx)
	_ = hs.Close()
	gs.Stop()
	return nil
}

// listenRetry binds addr, retrying briefly: a replica restarted at once
// may find its predecessor still letting go of it.
func listenRetry(ctx context.Context, addr string) (net.Listener, error) {
	var err error
	for range 50 {
		var l net.Listener
		if l, err = net.Listen("tcp", addr); err == nil {
			return l, nil
		}
		sleepCtx(ctx, 20*time.Millisecond)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("listen %s: %w", addr, err)
}

// followerAdmin proxies the admin API to the leader, so clients may use any
// replica; /healthz and /v1/replica answer locally.
func followerAdmin(reg *replica.Registry, peers []replica.Peer, adminTLS *tls.Config) http.Handler {
	scheme := "http"
	var transport http.RoundTripper
	if adminTLS != nil {
		// The leader serves the same certificate: trust what the operator
		// gave, or the system's roots.
		scheme = "https"
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: adminTLS.RootCAs, MinVersion: tls.VersionTLS12}
		transport = t
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok (follower)\n"))
	})
	mux.HandleFunc("GET /v1/replica", func(w http.ResponseWriter, r *http.Request) {
		admin.WriteJSON(w, http.StatusOK, replicaView(reg, peers))
	})
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			l, _ := reg.Leader()
			pr.Out.URL.Scheme, pr.Out.URL.Host = scheme, l.AdminAddr
			pr.SetXForwarded()
			// Checked here (auth.RefuseForged), against this replica's
			// address: the leader's is another.
			pr.Out.Header.Del("Origin")
		},
		Transport: transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// Nothing reached the leader when it could not be dialled: a
			// client may send the request to another replica.
			if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
				w.Header().Set(api.HeaderNotForwarded, "1")
			}
			w.Header().Set("Retry-After", "1")
			admin.WriteError(w, http.StatusServiceUnavailable, "control-plane leader unreachable: "+err.Error()+"; retry")
		},
	}
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l, ok := reg.Leader(); !ok || l.ID == reg.Self().ID {
			w.Header().Set("Retry-After", "1")
			w.Header().Set(api.HeaderNotForwarded, "1")
			admin.WriteError(w, http.StatusServiceUnavailable, "no control-plane leader elected yet; retry")
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	return mux
}

// follower answers the control-plane gRPC service on a replica that is not
// the leader: every call is refused with the leader's address.
type follower struct {
	briskv1.UnimplementedControlPlaneServer
	reg *replica.Registry
}

func (f *follower) refuse(ctx context.Context) error {
	l, ok := f.reg.Leader()
	if !ok || l.ID == f.reg.Self().ID {
		return rpc.NotLeader("")
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(rpc.LeaderHintKey, l.GRPCAddr))
	return rpc.NotLeader(l.GRPCAddr)
}

func (f *follower) RegisterWorker(ctx context.Context, _ *briskv1.RegisterWorkerRequest) (*briskv1.RegisterWorkerResponse, error) {
	return nil, f.refuse(ctx)
}

func (f *follower) RegisterDataPlane(ctx context.Context, _ *briskv1.RegisterDataPlaneRequest) (*briskv1.RegisterDataPlaneResponse, error) {
	return nil, f.refuse(ctx)
}

func (f *follower) ReportMetrics(ctx context.Context, _ *briskv1.MetricsReport) (*briskv1.MetricsAck, error) {
	return nil, f.refuse(ctx)
}

func (f *follower) ReportUnreachable(ctx context.Context, _ *briskv1.UnreachableReport) (*briskv1.UnreachableAck, error) {
	return nil, f.refuse(ctx)
}

func (f *follower) Join(ctx context.Context, _ *briskv1.JoinRequest) (*briskv1.JoinResponse, error) {
	return nil, f.refuse(ctx)
}

func (f *follower) WatchEndpoints(_ *briskv1.WatchEndpointsRequest, stream briskv1.ControlPlane_WatchEndpointsServer) error {
	return f.refuse(stream.Context())
}

// errNotLeader reports whether err is a registry write refused because this
// replica is no longer the leader.
func errNotLeader(err error) bool { return errors.Is(err, replica.ErrNotLeader) }

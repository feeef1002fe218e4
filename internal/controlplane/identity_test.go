package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/pkg/api"
)

// The attack of issue 18: any process that reached the gRPC port could
// register as a worker (and receive every sandbox of a new function, so
// every call body), and one reusing a real node's id overwrote its record
// for good. These tests run it against a control plane with a cluster CA.

type tlsCP struct {
	cp    *ControlPlane
	ca    *pki.CA
	dir   string
	token string
}

func startTLSControlPlane(t *testing.T) *tlsCP {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.CreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := runCP(t, Config{DataDir: dir, AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", CA: ca,
		StartupGrace: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	tok, err := pki.ReadSecretFile(filepath.Join(dir, JoinTokenFile))
	if err != nil {
		t.Fatalf("join token: %v", err)
	}
	return &tlsCP{cp: cp, ca: ca, dir: dir, token: tok}
}

// join joins as kind with ids, keeping the key in dir ("" in memory).
func (c *tlsCP) join(t *testing.T, token, kind, dir string, ids ...string) (*pki.Identity, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j := &pki.Joiner{ControlPlane: c.cp.GRPCAddr(), Kind: kind, IDs: ids, Token: token, CAPin: c.ca.Pin(), Dir: dir,
		Logger: slog.New(slog.DiscardHandler)}
	return j.Identity(ctx)
}

// client dials the control plane as id (nil: TLS without a certificate).
func (c *tlsCP) client(t *testing.T, id *pki.Identity) briskv1.ControlPlaneClient {
	t.Helper()
	var cfg *tls.Config
	if id != nil {
		cfg = id.ClientTLS(pki.KindControlPlane, "")
	} else {
		pool := c.ca.Pool()
		cfg = &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, VerifyConnection: func(cs tls.ConnectionState) error {
			return pki.Verify(pool, cs.PeerCertificates, x509.ExtKeyUsageServerAuth, pki.KindControlPlane, "")
		}}
	}
	conn, err := rpc.Dial(c.cp.GRPCAddr(), credentials.NewTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return briskv1.NewControlPlaneClient(conn)
}

func (c *tlsCP) worker(id string) *store.Worker {
	ws, _ := c.cp.store.Workers()
	for _, w := range ws {
		if w.ID == id {
			return w
		}
	}
	return nil
}

func wantCode(t *testing.T, what string, err error, codes ...codes.Code) {
	t.Helper()
	for _, c := range codes {
		if status.Code(err) == c {
			return
		}
	}
	t.Fatalf("%s: got %v, want one of %v", what, err, codes)
}

func registerReq(id, addr string) *briskv1.RegisterWorkerRequest {
	return &briskv1.RegisterWorkerRequest{NodeId: id, Address: addr, Runtime: "emulated",
		Capacity: &briskv1.Resources{MilliCpu: 64000, MemoryMb: 1 << 20}}
}

func TestJoinNeedsAValidToken(t *testing.T) {
	c := startTLSControlPlane(t)
	if _, err := c.join(t, "", pki.KindWorker, "", "w1"); err == nil {
		t.Fatal("joined without a token")
	}
	_, err := c.join(t, "brisk_0123456789abcdef_notthesecret", pki.KindWorker, "", "w1")
	if err == nil {
		t.Fatal("joined with a forged token")
	}
	// A raw Join, as a rogue would send it, is refused too.
	_, err = c.client(t, nil).Join(context.Background(), &briskv1.JoinRequest{Token: "nope", Kind: pki.KindWorker, NodeIds: []string{"w1"}})
	wantCode(t, "raw join with a bad token", err, codes.Unauthenticated, codes.InvalidArgument)
	id, err := c.join(t, c.token, pki.KindWorker, "", "w1")
	if err != nil {
		t.Fatalf("join with the cluster's token: %v", err)
	}
	if !pki.Names(id.Cert.Leaf, pki.KindWorker, "w1") {
		t.Fatalf("certificate for %v", id.Cert.Leaf.URIs)
	}
	// A join with a pin of another CA never sends the token.
	other, _ := pki.CreateCA(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	j := &pki.Joiner{ControlPlane: c.cp.GRPCAddr(), Kind: pki.KindWorker, IDs: []string{"w2"}, Token: c.token, CAPin: other.Pin(),
		Logger: slog.New(slog.DiscardHandler)}
	if _, err := j.Identity(ctx); err == nil {
		t.Fatal("joined a control plane whose CA does not match the pin")
	}
}

func TestNoCertificateNoCalls(t *testing.T) {
	c := startTLSControlPlane(t)
	cl := c.client(t, nil) // TLS, but no client certificate
	_, err := cl.RegisterWorker(context.Background(), registerReq("rogue", "127.0.0.1:1"))
	wantCode(t, "RegisterWorker without a certificate", err, codes.Unauthenticated)
	_, err = cl.RegisterDataPlane(context.Background(), &briskv1.RegisterDataPlaneRequest{Id: "rogue"})
	wantCode(t, "RegisterDataPlane without a certificate", err, codes.Unauthenticated)
	_, err = cl.ReportMetrics(context.Background(), &briskv1.MetricsReport{DataPlaneId: "rogue"})
	wantCode(t, "ReportMetrics without a certificate", err, codes.Unauthenticated)
	s, err := cl.WatchEndpoints(context.Background(), &briskv1.WatchEndpointsRequest{DataPlaneId: "rogue"})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, "WatchEndpoints without a certificate", err, codes.Unauthenticated)

	// Plaintext does not even reach the service.
	conn, err := rpc.Dial(c.cp.GRPCAddr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = briskv1.NewControlPlaneClient(conn).RegisterWorker(ctx, registerReq("rogue", "127.0.0.1:1"))
	wantCode(t, "plaintext RegisterWorker", err, codes.Unavailable, codes.DeadlineExceeded)

	// A certificate of another CA is refused in the handshake.
	other, _ := pki.CreateCA(t.TempDir())
	foreign, _ := other.Issue(pki.KindWorker, []string{"rogue"}, nil, nil)
	foreign.CA = c.ca.Cert // it trusts the real control plane
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	_, err = c.client(t, foreign).RegisterWorker(ctx2, registerReq("rogue", "127.0.0.1:1"))
	wantCode(t, "RegisterWorker with a foreign certificate", err, codes.Unavailable, codes.Unauthenticated, codes.DeadlineExceeded)
	if c.worker("rogue") != nil {
		t.Fatal("a rogue worker was registered")
	}
}

func TestCertificateCannotClaimAnotherNode(t *testing.T) {
	c := startTLSControlPlane(t)
	a, err := c.join(t, c.token, pki.KindWorker, t.TempDir(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	// node-a registers (its address is a dead port: no session needed here).
	if _, err := c.client(t, a).RegisterWorker(context.Background(), registerReq("node-a", "127.0.0.1:1")); err != nil {
		t.Fatalf("node-a registering itself: %v", err)
	}
	before := *c.worker("node-a")
	if before.KeyID == "" {
		t.Fatal("node-a's record is not bound to its key")
	}

	// A rogue holding the join token joins as node-b and claims node-a.
	b, err := c.join(t, c.token, pki.KindWorker, "", "node-b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.client(t, b).RegisterWorker(context.Background(), registerReq("node-a", "127.0.0.1:2"))
	wantCode(t, "node-b's certificate registering node-a", err, codes.PermissionDenied)

	// It cannot get a certificate for node-a either: the id is bound.
	if _, err := c.join(t, c.token, pki.KindWorker, "", "node-a"); err == nil {
		t.Fatal("a second key joined as node-a")
	}
	// Even a certificate naming node-a (from the CA, another key: say one
	// joined before node-a first registered) cannot overwrite the record.
	forged, _ := c.ca.Issue(pki.KindWorker, []string{"node-a"}, nil, nil)
	_, err = c.client(t, forged).RegisterWorker(context.Background(), registerReq("node-a", "127.0.0.1:3"))
	wantCode(t, "another key's node-a certificate", err, codes.PermissionDenied)

	// A data plane's certificate cannot register a worker, nor a worker's
	// act as a data plane.
	dp, err := c.join(t, c.token, pki.KindDataPlane, "", "dp-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.client(t, dp).RegisterWorker(context.Background(), registerReq("dp-1", "127.0.0.1:4"))
	wantCode(t, "a data plane registering a worker", err, codes.PermissionDenied)
	_, err = c.client(t, a).RegisterDataPlane(context.Background(), &briskv1.RegisterDataPlaneRequest{Id: "node-a"})
	wantCode(t, "a worker registering a data plane", err, codes.PermissionDenied)
	_, err = c.client(t, dp).ReportMetrics(context.Background(), &briskv1.MetricsReport{DataPlaneId: "dp-2"})
	wantCode(t, "dp-1 reporting as dp-2", err, codes.PermissionDenied)

	after := c.worker("node-a")
	if after == nil || after.Address != before.Address || after.KeyID != before.KeyID || after.Capacity != before.Capacity {
		t.Fatalf("node-a's record changed: before %+v after %+v", before, after)
	}
	// node-a itself may register again (a restart, a new address) with its
	// stored key and certificate, without the token.
	again, err := c.join(t, "", pki.KindWorker, "", "node-a")
	if err == nil {
		t.Fatalf("in-memory join without a token succeeded: %v", again)
	}
	if _, err := c.client(t, a).RegisterWorker(context.Background(), registerReq("node-a", "127.0.0.1:5")); err != nil {
		t.Fatalf("node-a registering again: %v", err)
	}
	if w := c.worker("node-a"); w.Address != "127.0.0.1:5" {
		t.Fatalf("node-a's own re-registration not applied: %+v", w)
	}
}

// The control plane dials a worker's Session server and checks that its
// certificate names the node it dials; a worker presenting another node's
// certificate gets no session (and so no sandboxes, no calls).
func TestControlPlaneChecksTheWorkersCertificate(t *testing.T) {
	c := startTLSControlPlane(t)
	a, err := c.join(t, c.token, pki.KindWorker, "", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.join(t, c.token, pki.KindWorker, "", "node-b")
	if err != nil {
		t.Fatal(err)
	}
	// node-a registers the address of a server that presents node-b's
	// certificate, then (second run) its own.
	for _, tc := range []struct {
		serve *pki.Identity
		ok    bool
	}{{b, false}, {a, true}} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		handshakes := make(chan error, 16)
		go func() {
			for {
				nc, err := lis.Accept()
				if err != nil {
					return
				}
				cfg := tc.serve.ServerTLS(true, pki.KindControlPlane)
				cfg.NextProtos = []string{"h2"}
				// TLS 1.3 with a client certificate: the server's handshake
				// ends with the client's Finished, or its alert.
				conn := tls.Server(nc, cfg)
				go func() {
					handshakes <- conn.Handshake()
					conn.Close()
				}()
			}
		}()
		if _, err := c.client(t, a).RegisterWorker(context.Background(), registerReq("node-a", lis.Addr().String())); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-handshakes:
			if tc.ok && err != nil {
				t.Fatalf("control plane refused node-a's own certificate: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("control plane opened a session to a server presenting node-b's certificate as node-a")
			}
			if !tc.ok && !isRemoteAlert(err) {
				t.Fatalf("handshake ended with %v; want the control plane's alert", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the control plane never dialled node-a")
		}
		lis.Close()
	}
}

// isRemoteAlert reports whether the peer (the control plane) aborted the
// handshake.
func isRemoteAlert(err error) bool {
	var ae tls.AlertError
	return errors.As(err, &ae) || err != nil && strings.Contains(err.Error(), "remote error")
}

// TestBootstrapTokensGiven runs a control plane given its first admin,
// join and deploy tokens (as brisk k8s install makes them into a Secret):
// it accepts them, each with its own scope only, writes none to its data
// dir, makes no others, and brings none back once revoked.
func TestBootstrapTokensGiven(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.CreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	admin, _, _ := auth.New([]string{auth.ScopeAdmin}, nil, "")
	join, _, _ := auth.New([]string{auth.ScopeJoin}, nil, "")
	deploy, _, _ := auth.New([]string{auth.ScopeDeploy}, nil, "")
	cp, _ := runCP(t, Config{DataDir: dir, AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", CA: ca,
		BootstrapAdminToken: admin, BootstrapJoinToken: join, BootstrapDeployToken: deploy,
		StartupGrace: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	for _, f := range []string{api.AdminTokenFile, JoinTokenFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s written although the token was given: %v", f, err)
		}
	}
	c := &tlsCP{cp: cp, ca: ca, dir: dir, token: join}
	if _, err := c.join(t, join, pki.KindWorker, "", "w1"); err != nil {
		t.Errorf("joining with the given join token: %v", err)
	}
	get := func(path, tok string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+cp.AdminAddr()+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		path, tok string
		want      int
	}{{"/v1/tokens", admin, http.StatusOK}, {"/v1/tokens", join, http.StatusForbidden}, {"/v1/tokens", "", http.StatusUnauthorized},
		{"/v1/tokens", deploy, http.StatusForbidden}, {"/v1/functions", deploy, http.StatusOK}, {"/v1/functions", join, http.StatusForbidden}} {
		if got := get(c.path, c.tok); got != c.want {
			t.Errorf("GET %s with token %.12q: %d, want %d", c.path, c.tok, got, c.want)
		}
	}
	toks, err := cp.store.Tokens()
	if err != nil || len(toks) != 3 {
		t.Fatalf("registry tokens: %d (%v), want the 3 given", len(toks), err)
	}

	// w1 registers (the registry is in use), then the join token is
	// revoked. The next leader term bootstraps again
	// (no join token in the registry): the given one, still in the
	// Secret, must not come back; a new one goes to the data dir.
	if err := cp.store.PutWorker(&store.Worker{ID: "w1", RegisteredAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		if slices.Contains(tk.Scopes, auth.ScopeJoin) || slices.Contains(tk.Scopes, auth.ScopeDeploy) {
			if err := cp.store.DeleteToken(tk.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cp.admin.LoadTokens(); err != nil {
		t.Fatal(err)
	}
	if err := cp.bootstrapJoinToken(); err != nil {
		t.Fatal(err)
	}
	if err := cp.admin.BootstrapDeployToken(); err != nil {
		t.Fatal(err)
	}
	if got := get("/v1/functions", deploy); got != http.StatusUnauthorized {
		t.Errorf("the revoked given deploy token after a new bootstrap: %d, want 401", got)
	}
	if _, err := c.join(t, join, pki.KindWorker, "", "w2"); err == nil {
		t.Error("the revoked given join token joined a worker after a new bootstrap")
	}
	fresh, err := os.ReadFile(filepath.Join(dir, JoinTokenFile))
	if err != nil {
		t.Fatalf("no new join token in the data dir: %v", err)
	}
	if _, err := c.join(t, strings.TrimSpace(string(fresh)), pki.KindWorker, "", "w2"); err != nil {
		t.Errorf("joining with the new join token: %v", err)
	}
}

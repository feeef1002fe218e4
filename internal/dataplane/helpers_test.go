package dataplane

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	frontend "github.com/brisk-faas/brisk/internal/dataplane/front"
	"github.com/brisk-faas/brisk/internal/testutil"
)

// testServer is a data plane's invocation listener in a test: the front
// end, with the net/http server behind it, as Run serves it.
type testServer struct {
	URL   string
	front *frontend.Server
}

// newTestDP returns a data plane (not Run) served on a loopback port by its
// front end.
func newTestDP(t testing.TB, mod func(*Config)) (*DataPlane, *testServer) {
	t.Helper()
	cfg := Config{}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	scheme := "http://"
	if d.cfg.TLS != nil { // as Run serves it
		ln, scheme = tls.NewListener(ln, listenerTLS(d.cfg.TLS)), "https://"
	}
	srv := &testServer{URL: scheme + ln.Addr().String(), front: d.newFrontEnd(d.newServer())}
	done := make(chan struct{})
	go func() { _ = srv.front.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.front.Close(); <-done })
	return d, srv
}

func fnSpec(name string, mods ...func(*briskv1.FunctionSpec)) *briskv1.FunctionSpec {
	s := &briskv1.FunctionSpec{Name: name, Revision: 1, Builtin: "trace", Concurrency: 1}
	for _, m := range mods {
		m(s)
	}
	return s
}

func ep(fn, id, addr string) *briskv1.Endpoint {
	return &briskv1.Endpoint{SandboxId: id, Function: fn, Address: addr, NodeId: "n1"}
}

// newSandbox starts an upstream and returns its host:port.
func newSandbox(t testing.TB, h http.HandlerFunc) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// seen is what the echo sandbox saw.
type seen struct {
	Path, RawQuery, Sandbox, CallID, XFF, XFHost, XFProto, Host string
}

func echo(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_ = json.NewEncoder(w).Encode(seen{
		Path:     r.URL.Path,
		RawQuery: r.URL.RawQuery,
		Sandbox:  r.Header.Get("X-Brisk-Sandbox"),
		CallID:   r.Header.Get("X-Call-Id"),
		XFF:      r.Header.Get("X-Forwarded-For"),
		XFHost:   r.Header.Get("X-Forwarded-Host"),
		XFProto:  r.Header.Get("X-Forwarded-Proto"),
		Host:     r.Host,
	})
}

type result struct {
	code   int
	body   string
	header http.Header
	err    error
}

func do(t testing.TB, req *http.Request) result {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, body: string(b), header: resp.Header, err: err}
}

func get(t testing.TB, url string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

// goGet runs a GET in the background.
func goGet(t testing.TB, url string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- get(t, url) }()
	return ch
}

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// waitFor awaits cond; the timeout only turns a hang into a failure.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, cond, what)
}

func decodeSeen(t testing.TB, r result) seen {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.code != http.StatusOK {
		t.Fatalf("status %d: %s", r.code, r.body)
	}
	var s seen
	if err := json.Unmarshal([]byte(r.body), &s); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return s
}

// wantError checks a brisk-generated JSON error.
func wantError(t testing.TB, r result, code int, substr string) {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.code != code {
		t.Fatalf("status %d, want %d (body %s)", r.code, code, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var body struct{ Error string }
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("error body %q is not JSON: %v", r.body, err)
	}
	if !strings.Contains(body.Error, substr) {
		t.Fatalf("error %q does not contain %q", body.Error, substr)
	}
}

// gate is a sandbox whose requests block until released, announcing each
// arrival. A failing test unblocks it so server shutdown cannot hang.
type gate struct {
	addr    string
	arrived chan string // X-Call-Id of each arrival
	release chan struct{}
	stop    chan struct{}
}

func newGate(t testing.TB) *gate {
	g := &gate{arrived: make(chan string, 100), release: make(chan struct{}, 100), stop: make(chan struct{})}
	g.addr = newSandbox(t, g.handler)
	t.Cleanup(func() { close(g.stop) }) // runs before the sandbox's Close
	return g
}

func (g *gate) handler(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Call-Id")
	g.arrived <- id
	select {
	case <-g.release:
	case <-g.stop:
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, "done "+id)
}

func (d *DataPlane) queued(name string) int {
	fn := d.lookup(name)
	if fn == nil {
		return -1
	}
	return int(fn.q.Len())
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

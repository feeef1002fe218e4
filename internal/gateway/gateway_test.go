package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/naming"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/internal/testutil"
)

// ---- hashing ----

func newTestGateway(t testing.TB, dps ...string) *Gateway {
	t.Helper()
	g, err := New(Config{DataPlanes: dps, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("fn-%d", i)
	}
	return out
}

func mustPick(t testing.TB, g *Gateway, name string) string {
	t.Helper()
	dp, ok := g.Pick(name)
	if !ok {
		t.Fatalf("Pick(%q): no data plane", name)
	}
	return dp
}

func TestPickIsStableAndAgreesAcrossGateways(t *testing.T) {
	a := newTestGateway(t, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080")
	// Another gateway, configured in another order.
	b := newTestGateway(t, "10.0.0.3:8080", "10.0.0.1:8080", "10.0.0.2:8080")
	for _, n := range names(1000) {
		first := mustPick(t, a, n)
		if again := mustPick(t, a, n); again != first {
			t.Fatalf("%s: picked %s then %s", n, first, again)
		}
		if other := mustPick(t, b, n); other != first {
			t.Fatalf("%s: gateway a picks %s, gateway b %s", n, first, other)
		}
	}
}

func TestPickSpreadsFunctionsEvenly(t *testing.T) {
	dps := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}
	g := newTestGateway(t, dps...)
	share := map[string]int{}
	for _, n := range names(1000) {
		share[mustPick(t, g, n)]++
	}
	for _, dp := range dps {
		if s := share[dp]; s < 200 || s > 470 {
			t.Errorf("%s got %d of 1000 functions, want 200..470 (shares %v)", dp, s, share)
		}
	}
}

func TestRemovingADataPlaneMovesOnlyItsFunctions(t *testing.T) {
	g := newTestGateway(t, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080")
	before := map[string]string{}
	for _, n := range names(1000) {
		before[n] = mustPick(t, g, n)
	}
	removed := g.dps[1]
	removed.up.Store(false)
	moved := 0
	for n, was := range before {
		now := mustPick(t, g, n)
		switch {
		case was == removed.addr && now == removed.addr:
			t.Fatalf("%s stayed on the removed data plane", n)
		case was == removed.addr:
			moved++
		case now != was:
			t.Fatalf("%s moved from %s to %s though %s was not removed", n, was, now, was)
		}
	}
	if moved == 0 {
		t.Fatal("no function was on the removed data plane")
	}
	// And back: every function returns to where it was.
	removed.up.Store(true)
	for n, was := range before {
		if now := mustPick(t, g, n); now != was {
			t.Fatalf("%s: %s after the data plane returned, %s before", n, now, was)
		}
	}
}

func TestPickWithNoHealthyDataPlane(t *testing.T) {
	g := newTestGateway(t, "10.0.0.1:8080", "10.0.0.2:8080")
	for _, b := range g.dps {
		b.up.Store(false)
	}
	if dp, ok := g.Pick("hello"); ok {
		t.Fatalf("Pick with every data plane down = %q, want none", dp)
	}
}

func BenchmarkPick(b *testing.B) {
	g := newTestGateway(b, "10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080")
	ns := names(1000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := g.Pick(ns[i%len(ns)]); !ok {
			b.Fatal("no data plane")
		}
		i++
	}
}

// ---- config ----

func TestNewRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no data planes", Config{}, "at least one"},
		{"duplicate", Config{DataPlanes: []string{"127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8080"}}, "twice"},
		{"no port", Config{DataPlanes: []string{"127.0.0.1"}}, "host:port"},
		{"no host", Config{DataPlanes: []string{":8080"}}, "host is empty"},
		{"bad port", Config{DataPlanes: []string{"dp1:http"}}, "port"},
		{"port range", Config{DataPlanes: []string{"dp1:70000"}}, "port"},
		{"empty entry", Config{DataPlanes: []string{"dp1:8080", ""}}, "host:port"},
		{"negative interval", Config{DataPlanes: []string{"dp1:8080"}, HealthInterval: -time.Second}, "health_interval"},
	}
	for _, tc := range cases {
		tc.cfg.Registerer = prometheus.NewRegistry()
		g, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, %v; want an error containing %q", tc.name, g, err, tc.want)
		}
	}
	if _, err := New(Config{DataPlanes: []string{"dp1:8080", "[::1]:8080"}, Registerer: prometheus.NewRegistry()}); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
}

// ---- routing rules ----

// The gateway must hash on the very name the data plane routes by. A data
// plane with no functions answers every request with a 404 that names the
// function it looked for, which makes its routing observable.
func TestRoutingAgreesWithDataPlane(t *testing.T) {
	dp, err := dataplane.New(dataplane.Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ host, target string }{
		{"127.0.0.1:8080", "/function/hello"},
		{"127.0.0.1:8080", "/function/hello/"},
		{"127.0.0.1:8080", "/function/hello/a/b?x=1"},
		{"127.0.0.1:8080", "/function/Hello/x"},
		{"127.0.0.1:8080", "/function/a%2Fb/c"},
		{"127.0.0.1:8080", "/function/"},
		{"127.0.0.1:8080", "/function"},
		{"127.0.0.1:8080", "/functions/hello"},
		{"127.0.0.1:8080", "/"},
		{"hello.brisk.local", "/"},
		{"hello.brisk.local", "/function-like/path?q=1"},
		{"HELLO.Example.COM:8080", "/x"},
		{"hello:8080", "/x"},
		{"hello", "/x"},
		{"My-Fn.ns.svc", "/"},
		{"localhost:8080", "/x"},
		{"localhost", "/"},
		{"10.1.2.3", "/x"},
		{"[::1]:8080", "/x"},
		{"", "/x"},
		{"hello.brisk.local", "/function/other/x"},
	}
	for _, tc := range cases {
		r := httptest.NewRequest(http.MethodGet, "http://placeholder"+tc.target, nil)
		r.Host = tc.host
		w := httptest.NewRecorder()
		dp.Handler().ServeHTTP(w, r)
		var body struct{ Error string }
		if err := json.Unmarshal(w.Body.Bytes(), &body); w.Code != http.StatusNotFound || err != nil {
			t.Fatalf("data plane on Host %q %s: %d %s", tc.host, tc.target, w.Code, w.Body)
		}
		var dpName string
		if _, err := fmt.Sscanf(body.Error, "function %q not found", &dpName); err != nil && !strings.HasPrefix(body.Error, "no function named") {
			t.Fatalf("data plane on Host %q %s: unexpected message %q", tc.host, tc.target, body.Error)
		}

		name, byPath := functionOf(r)
		routed := byPath && name != "" || !byPath && naming.NamesFunction(name)
		gwName := ""
		if routed {
			gwName = name
		}
		if gwName != dpName {
			t.Errorf("Host %q %s: gateway routes by %q, data plane by %q", tc.host, tc.target, gwName, dpName)
		}
	}
}

// ---- end to end, with stand-in data planes ----

// fakeDP stands in for a data plane: it answers /healthz, and echoes who it
// is and what it received.
type fakeDP struct {
	name string
	addr string
	mu   sync.Mutex
	srv  *http.Server
	hits int
}

type echoed struct {
	DP, Method, Path, RawQuery, Host, Body, Header, XFF string
}

func newFakeDP(t *testing.T, name string) *fakeDP {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDP{name: name, addr: ln.Addr().String()}
	f.serve(ln)
	t.Cleanup(f.stop)
	return f
}

func (f *fakeDP) handler(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" && r.Host == "localhost" {
		_, _ = io.WriteString(w, "ok\n")
		return
	}
	f.mu.Lock()
	f.hits++
	f.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(echoed{DP: f.name, Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
		Host: r.Host, Body: string(body), Header: r.Header.Get("X-Test"), XFF: r.Header.Get("X-Forwarded-For")})
}

func (f *fakeDP) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(f.handler)}
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// stop closes the listener and every connection: dials are refused after.
func (f *fakeDP) stop() {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	_ = srv.Close()
}

// restart listens again on the same address. Another process may have
// taken the port meanwhile, so keep trying for a while.
func (f *fakeDP) restart(t *testing.T) {
	t.Helper()
	var ln net.Listener
	testutil.Eventually(t, 10*time.Second, func() bool {
		var err error
		ln, err = net.Listen("tcp", f.addr)
		return err == nil
	}, "listen again on %s", f.addr)
	f.serve(ln)
}

func (f *fakeDP) hitCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

func runGateway(t *testing.T, interval time.Duration, dps ...*fakeDP) *Gateway {
	t.Helper()
	return runGatewayWith(t, nil, interval, dps...)
}

// runGatewayWith is runGateway with mod applied to the configuration.
func runGatewayWith(t *testing.T, mod func(*Config), interval time.Duration, dps ...*fakeDP) *Gateway {
	t.Helper()
	cfg := Config{Listen: "127.0.0.1:0", HealthInterval: interval, Registerer: prometheus.NewRegistry()}
	if mod != nil {
		mod(&cfg)
	}
	for _, d := range dps {
		cfg.DataPlanes = append(cfg.DataPlanes, d.addr)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-g.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	return g
}

type response struct {
	code      int
	dataplane string
	echo      echoed
	raw       string
}

func call(t *testing.T, method, url, host, body string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	req.Header.Set("X-Test", "kept")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{code: resp.StatusCode, dataplane: resp.Header.Get("X-Brisk-Dataplane"), raw: string(raw)}
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.echo); err != nil {
			t.Fatalf("%s %s: bad echo %q: %v", method, url, raw, err)
		}
	}
	return r
}

// nameOn returns a function name that hashes to dp.
func nameOn(t *testing.T, g *Gateway, dp string) string {
	t.Helper()
	for _, n := range names(1000) {
		if got, _ := g.Pick(n); got == dp {
			return n
		}
	}
	t.Fatalf("no name hashes to %s", dp)
	return ""
}

func TestProxyRoutesByPathAndHost(t *testing.T) {
	a, b, c := newFakeDP(t, "a"), newFakeDP(t, "b"), newFakeDP(t, "c")
	g := runGateway(t, time.Second, a, b, c)
	byAddr := map[string]string{a.addr: "a", b.addr: "b", c.addr: "c"}
	base := "http://" + g.Addr()

	for _, d := range []*fakeDP{a, b, c} {
		fn := nameOn(t, g, d.addr)

		r := call(t, http.MethodPost, base+"/function/"+fn+"/sub/path?x=1&y=two", "", "payload "+fn)
		if r.code != http.StatusOK || r.echo.DP != d.name || r.dataplane != d.addr {
			t.Fatalf("/function/%s: %d from %q (header %q), want data plane %s: %s", fn, r.code, r.echo.DP, r.dataplane, d.name, r.raw)
		}
		want := echoed{DP: d.name, Method: "POST", Path: "/function/" + fn + "/sub/path", RawQuery: "x=1&y=two",
			Host: g.Addr(), Body: "payload " + fn, Header: "kept", XFF: "127.0.0.1"}
		if r.echo != want {
			t.Errorf("data plane saw %+v, want %+v", r.echo, want)
		}

		host := strings.ToUpper(fn) + ".brisk.local"
		r = call(t, http.MethodGet, base+"/any?q=1", host, "")
		if r.code != http.StatusOK || r.echo.DP != d.name || r.dataplane != d.addr {
			t.Fatalf("Host %s: %d from %q (header %q), want data plane %s: %s", host, r.code, r.echo.DP, r.dataplane, d.name, r.raw)
		}
		if r.echo.Host != host || r.echo.Path != "/any" || r.echo.RawQuery != "q=1" {
			t.Errorf("Host routing: data plane saw %+v", r.echo)
		}
	}
	if got := byAddr[mustPick(t, g, "hello")]; got == "" {
		t.Fatalf("Pick(hello) is not a configured data plane")
	}
}

func TestProxyAnswersWithoutAFunction(t *testing.T) {
	a := newFakeDP(t, "a")
	g := runGateway(t, time.Second, a)
	base := "http://" + g.Addr()
	for _, target := range []string{"/", "/function/", "/some/path"} {
		r := call(t, http.MethodGet, base+target, "", "")
		if r.code != http.StatusNotFound || !strings.Contains(r.raw, "no function named in the request") {
			t.Errorf("GET %s: %d %s, want 404 naming the routing rules", target, r.code, r.raw)
		}
	}
	if r := call(t, http.MethodGet, base+"/healthz", "", ""); r.code != http.StatusOK || r.raw != "ok\n" {
		t.Errorf("gateway /healthz: %d %q", r.code, r.raw)
	}
	if a.hitCount() != 0 {
		t.Errorf("data plane got %d requests that named no function", a.hitCount())
	}
	// A function's own /healthz is still the function's.
	if r := call(t, http.MethodGet, base+"/healthz", "fn.brisk.local", ""); r.code != http.StatusOK || r.echo.DP != "a" || r.echo.Path != "/healthz" {
		t.Errorf("Host-routed /healthz: %d %s, want it proxied", r.code, r.raw)
	}
}

func TestMetrics(t *testing.T) {
	a, b := newFakeDP(t, "a"), newFakeDP(t, "b")
	g := runGateway(t, time.Second, a, b)
	base := "http://" + g.Addr()
	fn := nameOn(t, g, a.addr)
	for range 3 {
		if r := call(t, http.MethodGet, base+"/function/"+fn, "", ""); r.code != http.StatusOK {
			t.Fatalf("call: %d %s", r.code, r.raw)
		}
	}
	r := call(t, http.MethodGet, base+"/metrics", "", "")
	for _, want := range []string{
		fmt.Sprintf(`brisk_gateway_requests_total{code="200",dataplane=%q} 3`, a.addr),
		fmt.Sprintf(`brisk_gateway_dataplane_up{dataplane=%q} 1`, a.addr),
		fmt.Sprintf(`brisk_gateway_dataplane_up{dataplane=%q} 1`, b.addr),
	} {
		if !strings.Contains(r.raw, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, r.raw)
		}
	}
}

func TestNoDataPlaneAvailable(t *testing.T) {
	a, b := newFakeDP(t, "a"), newFakeDP(t, "b")
	g := runGateway(t, time.Hour, a, b) // only connection failures mark them down
	a.stop()
	b.stop()
	// The first health checks' idle connections: a request sent over one
	// that a stopped data plane resets has left the gateway (502, not a
	// refused connection), which is not what this test is about.
	g.transport.CloseIdleConnections()
	base := "http://" + g.Addr()
	r := call(t, http.MethodPost, base+"/function/hello", "", "body")
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.raw, "no data plane available") {
		t.Fatalf("all data planes gone: %d %s, want 503", r.code, r.raw)
	}
	if dp, ok := g.Pick("hello"); ok {
		t.Fatalf("Pick after every data plane refused: %s", dp)
	}
	// Later requests fail fast, without dialling.
	r = call(t, http.MethodGet, base+"/function/other", "", "")
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.raw, "no data plane available") {
		t.Fatalf("second request: %d %s, want 503", r.code, r.raw)
	}
	m := call(t, http.MethodGet, base+"/metrics", "", "")
	if want := `brisk_gateway_requests_total{code="503",dataplane="none"} 2`; !strings.Contains(m.raw, want) {
		t.Errorf("/metrics lacks %s:\n%s", want, m.raw)
	}
}

func TestFailoverAndReturn(t *testing.T) {
	a, b, c := newFakeDP(t, "a"), newFakeDP(t, "b"), newFakeDP(t, "c")
	g := runGateway(t, 200*time.Millisecond, a, b, c)
	base := "http://" + g.Addr()
	fn := nameOn(t, g, b.addr)
	next := g.pick(fn, []bool{false, true, false}) // runner-up in fn's order
	if next == nil || next.addr == b.addr {
		t.Fatalf("runner-up of %s: %v", fn, next)
	}

	b.stop()
	// A body big enough to need several reads.
	payload := make([]byte, 256<<10)
	for i := range payload {
		payload[i] = byte('a' + rand.IntN(26))
	}
	r := call(t, http.MethodPost, base+"/function/"+fn, "", string(payload))
	if r.code != http.StatusOK || r.dataplane != next.addr || r.echo.DP == "b" {
		t.Fatalf("request for %s after its data plane closed: %d via %q, want 200 via %s: %.200s", fn, r.code, r.dataplane, next.addr, r.raw)
	}
	if !bytes.Equal([]byte(r.echo.Body), payload) {
		t.Fatalf("body after failover: %d bytes arrived, %d sent, equal prefix %v", len(r.echo.Body), len(payload),
			strings.HasPrefix(string(payload), r.echo.Body))
	}
	if dp := mustPick(t, g, fn); dp != next.addr {
		t.Fatalf("Pick(%s) = %s after failover, want %s", fn, dp, next.addr)
	}
	// Functions of the other data planes stayed where they were.
	for _, d := range []*fakeDP{a, c} {
		other := nameOn(t, g, d.addr)
		if r := call(t, http.MethodGet, base+"/function/"+other, "", ""); r.code != http.StatusOK || r.dataplane != d.addr {
			t.Fatalf("%s: %d via %s, want %s", other, r.code, r.dataplane, d.addr)
		}
	}

	b.restart(t)
	testutil.Eventually(t, 10*time.Second, func() bool {
		dp, _ := g.Pick(fn)
		return dp == b.addr
	}, "%s back on %s after it returned", fn, b.addr)
	r = call(t, http.MethodPost, base+"/function/"+fn, "", "again")
	if r.code != http.StatusOK || r.echo.DP != "b" || r.dataplane != b.addr || r.echo.Body != "again" {
		t.Fatalf("after return: %d via %q: %s", r.code, r.dataplane, r.raw)
	}
}

// A data plane that stops answering probes is taken out after two failures
// and put back after one success, without any request noticing.
func TestHealthChecksMarkDownAndUp(t *testing.T) {
	a, b := newFakeDP(t, "a"), newFakeDP(t, "b")
	g := runGateway(t, 20*time.Millisecond, a, b)
	fn := nameOn(t, g, a.addr)
	a.stop()
	testutil.Eventually(t, 10*time.Second, func() bool {
		dp, _ := g.Pick(fn)
		return dp == b.addr
	}, "%s moves to %s once probes fail", fn, b.addr)
	a.restart(t)
	testutil.Eventually(t, 10*time.Second, func() bool {
		dp, _ := g.Pick(fn)
		return dp == a.addr
	}, "%s back on %s", fn, a.addr)
}

func TestRunTwiceAndListenError(t *testing.T) {
	a := newFakeDP(t, "a")
	g := runGateway(t, time.Second, a)
	if err := g.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("second Run: %v", err)
	}
	g2, err := New(Config{Listen: g.Addr(), DataPlanes: []string{a.addr}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := g2.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Errorf("Run on a taken address: %v", err)
	}
}

func TestIsConnectError(t *testing.T) {
	port := testutil.FreePort(t)
	_, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err == nil || !proxy.IsDialError(err) {
		t.Errorf("refused connection: IsDialError(%v) = false", err)
	}
	if proxy.IsDialError(errors.New("EOF")) || proxy.IsDialError(io.ErrUnexpectedEOF) {
		t.Error("non-dial errors count as connection failures")
	}
}

// Clients may speak h2c to the gateway, as to a data plane.
func TestH2CClient(t *testing.T) {
	a := newFakeDP(t, "a")
	g := runGateway(t, time.Second, a)
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.Addr()+"/function/hello?x=1", strings.NewReader("over h2c"))
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e echoed
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK {
		t.Fatalf("h2c: %s %d %v", resp.Proto, resp.StatusCode, err)
	}
	if e.Body != "over h2c" || e.RawQuery != "x=1" || e.XFF != "203.0.113.7, 127.0.0.1" {
		t.Fatalf("h2c request arrived as %+v", e)
	}
}

// An HTTP/1.0 request with Transfer-Encoding on a kept-alive connection:
// net/http ignores the header, so the chunked body would be read as the
// next request and relayed (a desync, issue 36). The gateway closes
// HTTP/1.0 connections after their request: one reply, one call.
func TestHTTP10ConnectionsClose(t *testing.T) {
	dp := newFakeDP(t, "a")
	g := runGateway(t, time.Hour, dp)
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	smuggled := "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := fmt.Fprintf(c, "POST /function/f HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n",
		len(smuggled), smuggled); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading until the close: %v (read %q)", err, all)
	}
	if n := strings.Count(string(all), "HTTP/1."); n != 1 || dp.hitCount() != 1 {
		t.Fatalf("%d replies, %d calls at the data plane; want 1 and 1:\n%s", n, dp.hitCount(), all)
	}
}

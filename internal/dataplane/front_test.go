package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	frontend "github.com/brisk-faas/brisk/internal/dataplane/front"
	"github.com/brisk-faas/brisk/internal/h1"
	"github.com/brisk-faas/brisk/internal/testutil"
)

// sawCall is what the mirror sandbox saw of a call.
type sawCall struct {
	Method, Path, RawQuery, Host, Body string
	Header                             http.Header
}

// mirror is a sandbox that answers by its path: the forms of reply a
// function can give. Every answer carries what it saw as JSON.
func mirror(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h := r.Header.Clone()
	h.Del("X-Call-Id") // made up per call unless the client gave one: compared apart
	saw, _ := json.Marshal(sawCall{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Host: r.Host, Body: string(b), Header: h})
	switch {
	case strings.HasSuffix(r.URL.Path, "/chunked"):
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(saw[:len(saw)/2])
		w.(http.Flusher).Flush()
		_, _ = w.Write(saw[len(saw)/2:])
		w.Header().Set("X-Sum", "42")
	case strings.HasSuffix(r.URL.Path, "/nocontent"):
		w.Header().Set("X-Saw", string(saw))
		w.WriteHeader(http.StatusNoContent)
	case strings.HasSuffix(r.URL.Path, "/hints"):
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(saw)
	case strings.HasSuffix(r.URL.Path, "/notype"):
		w.Header()["Content-Type"] = nil
		_, _ = w.Write(saw)
	case strings.HasSuffix(r.URL.Path, "/teapot"):
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Function", "brewing")
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write(saw)
	case strings.HasSuffix(r.URL.Path, "/bighead"):
		w.Header().Set("X-Big", strings.Repeat("b", 10<<10))
		_, _ = w.Write(saw)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(saw)
	}
}

// exchange is one request sent and what came back.
type exchange struct {
	code    int
	body    string
	header  http.Header
	trailer http.Header
}

func send(t *testing.T, base string, mk func(base string) *http.Request) exchange {
	t.Helper()
	req := mk(base)
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the reply: %v", req.Method, req.URL, err)
	}
	h := resp.Header.Clone()
	for _, k := range []string{"Date", "X-Brisk-Timing", "X-Start-Time"} {
		if _, ok := h[k]; !ok {
			t.Errorf("%s %s: reply has no %s", req.Method, req.URL, k)
		}
		delete(h, k)
	}
	return exchange{code: resp.StatusCode, body: string(b), header: h, trailer: resp.Trailer}
}

// The front end answers every call it serves itself as the net/http path
// does (the path behind it for whatever it hands over): the same status,
// body, headers and trailers reach the client, and the sandbox sees the
// same request.
func TestFrontEndAnswersAsTheNetHTTPPathDoes(t *testing.T) {
	d, front := newTestDP(t, nil)
	slow := httptest.NewServer(d.Handler())
	t.Cleanup(slow.Close)
	deploy(d, "f", newSandbox(t, mirror))

	req := func(method, path, body string, hdr ...string) func(string) *http.Request {
		return func(base string) *http.Request {
			var rd io.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			r, err := http.NewRequest(method, base+path, rd)
			if err != nil {
				t.Fatal(err)
			}
			r.Host = "dp.test:8080" // the same for both servers: it is X-Forwarded-Host
			for i := 0; i+1 < len(hdr); i += 2 {
				if hdr[i] == "Host" {
					r.Host = hdr[i+1]
					continue
				}
				r.Header.Add(hdr[i], hdr[i+1])
			}
			return r
		}
	}
	cases := map[string]func(string) *http.Request{
		"GET with a path and query":      req("GET", "/function/f/a/b?x=1&y=two", ""),
		"POST with a body":               req("POST", "/function/f", `{"ms":0}`, "Content-Type", "application/json"),
		"PUT without a body":             req("PUT", "/function/f/put", ""),
		"HEAD":                           req("HEAD", "/function/f/head", ""),
		"by Host":                        req("GET", "/some/path?q=1", "", "Host", "f.brisk.local:8080"),
		"by Host, upper case":            req("GET", "/", "", "Host", "F.example.com"),
		"forwarded chain":                req("GET", "/function/f", "", "X-Forwarded-For", "10.0.0.1", "X-Forwarded-For", "10.0.0.2, 10.0.0.3", "X-Forwarded-Host", "spoofed", "X-Forwarded-Proto", "gopher"),
		"hop-by-hop":                     req("GET", "/function/f", "", "Connection", "X-Hop, keep-alive", "X-Hop", "1", "Keep-Alive", "timeout=5", "Proxy-Authorization", "secret", "X-Kept", "2"),
		"Te trailers":                    req("GET", "/function/f", "", "Te", "deflate, trailers"),
		"client call id":                 req("GET", "/function/f", "", "X-Call-Id", "call-7"),
		"sandbox id is not the client's": req("GET", "/function/f", "", "X-Brisk-Sandbox", "sb-other"),
		"many headers":                   req("POST", "/function/f", "x", "A", "1", "B", "2", "a-b-c", "3", "Cookie", "k=v", "Accept", "*/*", "User-Agent", "test/1.0"),
		"chunked reply with trailer":     req("GET", "/function/f/chunked", ""),
		"204":                            req("GET", "/function/f/nocontent", ""),
		"early hints":                    req("GET", "/function/f/hints", ""),
		"no content type":                req("GET", "/function/f/notype", ""),
		"status and repeated headers":    req("GET", "/function/f/teapot", ""),
		"a reply head over 4 KiB":        req("GET", "/function/f/bighead", ""),
		"empty query":                    req("GET", "/function/f/q?", ""),
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range cases {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		mk := cases[name]
		got, want := send(t, front.URL, mk), send(t, slow.URL, mk)
		if got.code != want.code || got.body != want.body {
			t.Errorf("%s: front end %d %q, net/http %d %q", name, got.code, got.body, want.code, want.body)
		}
		if id := mk(front.URL).Header.Get("X-Call-Id"); id == "" {
			if len(got.header.Get("X-Call-Id")) != 32 || len(want.header.Get("X-Call-Id")) != 32 {
				t.Errorf("%s: call ids %q, %q, want 32 hex digits", name, got.header.Get("X-Call-Id"), want.header.Get("X-Call-Id"))
			}
			delete(got.header, "X-Call-Id")
			delete(want.header, "X-Call-Id")
		}
		if fmt.Sprint(got.header) != fmt.Sprint(want.header) {
			t.Errorf("%s: reply headers\nfront end %v\nnet/http  %v", name, got.header, want.header)
		}
		if fmt.Sprint(got.trailer) != fmt.Sprint(want.trailer) {
			t.Errorf("%s: trailers: front end %v, net/http %v", name, got.trailer, want.trailer)
		}
	}
	// The sandbox's view, through the headers of the /nocontent reply and
	// the bodies above, matched; make sure it is the view wanted.
	var saw sawCall
	r := send(t, front.URL, req("GET", "/function/f/x?a=1", "", "X-Forwarded-For", "10.0.0.1", "Connection", "X-Hop", "X-Hop", "1"))
	if err := json.Unmarshal([]byte(r.body), &saw); err != nil {
		t.Fatal(err)
	}
	if saw.Path != "/x" || saw.RawQuery != "a=1" || saw.Header.Get("X-Forwarded-For") != "10.0.0.1, 127.0.0.1" ||
		saw.Header.Get("X-Brisk-Sandbox") != "sb-1" || saw.Header.Get("X-Hop") != "" || saw.Header.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("sandbox saw %+v", saw)
	}
	if n := promtest.ToFloat64(d.prom.handedOff); n != 0 {
		t.Errorf("%g connections handed off; every call here is the front end's", n)
	}
}

// What the front end does not serve itself is handed, on its connection,
// to the net/http server, which serves it.
func TestFrontEndHandsOverWhatItDoesNotServe(t *testing.T) {
	d, front := newTestDP(t, nil)
	deploy(d, "f", newSandbox(t, echo))
	addr := strings.TrimPrefix(front.URL, "http://")
	big := strings.Repeat("v", 5<<10)
	cases := []struct {
		name, raw, want string
	}{
		{"HTTP/1.0", "GET /function/f HTTP/1.0\r\nHost: x\r\n\r\n", "HTTP/1.0 200 OK"},
		{"chunked body", "POST /function/f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "HTTP/1.1 200 OK"},
		{"Expect 100-continue", "POST /function/f HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", "HTTP/1.1 100 Continue"},
		{"head over 4 KiB", "GET /function/f HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\nConnection: close\r\n\r\n", "HTTP/1.1 200 OK"},
		{"bare LF", "GET /function/f HTTP/1.1\nHost: x\nConnection: close\n\n", "HTTP/1.1 200 OK"},
		{"escaped path", "GET /function/f/a%20b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", `"Path":"/a b"`},
		{"healthz", "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", "ok"},
		{"metrics", "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", "brisk_dataplane_connections_accepted_total"},
		{"unknown function", "GET /function/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", `function \"nope\" not found`},
		{"upgrade", "GET /function/f HTTP/1.1\r\nHost: x\r\nUpgrade: foo\r\nConnection: Upgrade, close\r\n\r\n", "HTTP/1.1 200 OK"},
		{"bad header name", "GET /function/f HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n", "HTTP/1.1 400 Bad Request"},
		{"two Content-Lengths", "POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "HTTP/1.1 400 Bad Request"},
		{"no Host", "GET /function/f HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request"},
		{"body over the limit", "POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", "HTTP/1.1 413 Request Entity Too Large"},
	}
	for i, tc := range cases {
		got := testutil.RawExchange(t, addr, tc.raw)
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want it to contain %q", tc.name, got, tc.want)
		}
		if n := promtest.ToFloat64(d.prom.handedOff); n != float64(i+1) {
			t.Errorf("%s: %g connections handed off after %d cases", tc.name, n, i+1)
		}
	}
}

// Requests sent back to back on one connection (pipelined) are answered
// in order; the connection then carries more.
func TestFrontEndPipelinedRequests(t *testing.T) {
	d, front := newTestDP(t, nil)
	deploy(d, "f", newSandbox(t, echo))
	c, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	read := func(wantPath string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var s seen
		if err := json.Unmarshal(b, &s); err != nil || resp.StatusCode != 200 || s.Path != wantPath {
			t.Fatalf("reply %d %q (%v), want the call to %s", resp.StatusCode, b, err, wantPath)
		}
	}
	if _, err := io.WriteString(c, "GET /function/f/1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /function/f/2 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /function/f/3 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	read("/1")
	read("/2")
	read("/3")
	if _, err := io.WriteString(c, "GET /function/f/4 HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	read("/4")
	if n := promtest.ToFloat64(d.prom.handedOff); n != 0 {
		t.Fatalf("%g hand-offs", n)
	}
}

// A client that asks for the connection to close gets Connection: close and
// a closed connection after its reply.
func TestFrontEndConnectionClose(t *testing.T) {
	d, front := newTestDP(t, nil)
	deploy(d, "f", newSandbox(t, echo))
	got := testutil.RawExchange(t, strings.TrimPrefix(front.URL, "http://"), "GET /function/f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
	if err != nil {
		t.Fatalf("%q: %v", got, err)
	}
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("reply %d, close %v: %q", resp.StatusCode, resp.Close, got)
	}
}

// Connections are closed when they outstay their timeouts: a new one that
// sends nothing (the header timeout), one that sends half a head, and one
// left idle after a call (the idle timeout).
func TestFrontEndTimeouts(t *testing.T) {
	const limit = 100 * time.Millisecond
	d, front := newTestDP(t, func(c *Config) { c.ReadHeaderTimeout, c.IdleTimeout = limit, 2*limit })
	deploy(d, "f", newSandbox(t, echo))
	addr := strings.TrimPrefix(front.URL, "http://")
	for _, tc := range []struct {
		name, raw, want string
		after           time.Duration
	}{
		{"silent", "", "", limit},
		{"half a head", "GET /function/f HTTP/1.1\r\nHo", "", limit},
		{"idle after a call", "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200 OK", 2 * limit},
	} {
		start := time.Now()
		got := testutil.RawExchange(t, addr, tc.raw) // returns when the data plane closes
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: got %q", tc.name, got)
		}
		if el := time.Since(start); el < tc.after {
			t.Errorf("%s: closed after %s, before its timeout %s", tc.name, el, tc.after)
		}
	}
}

// A reply head a client could misread is refused (502), not relayed.
func TestFrontEndRefusesMalformedReplies(t *testing.T) {
	d, front := newTestDP(t, nil)
	for i, reply := range []string{
		"HTTP/1.1 200 OK\r\nX-Bad: a\x01b\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 O\x7fK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"HTTP/1.1 200 OK\r\n Folded: x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 2x0 OK\r\n\r\n",
	} {
		name := fmt.Sprintf("f%d", i)
		sb := newOneShotSandbox(t, false, func(int) bool { return true })
		sb.replyWith = reply
		deploy(d, name, sb.addr)
		wantError(t, get(t, front.URL+"/function/"+name), http.StatusBadGateway, "malformed reply")
	}
}

// Shutting down finishes the calls in flight — their replies say
// Connection: close — and refuses new connections.
func TestFrontEndShutdownFinishesCalls(t *testing.T) {
	d, err := New(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long")},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", g.addr)}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-d.Ready()
	idle, err := net.Dial("tcp", d.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	res := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Get("http://" + d.Addr() + "/function/long")
		if err != nil {
			t.Error(err)
			close(res)
			return
		}
		res <- resp
	}()
	recv(t, g.arrived, "the call to reach the sandbox")
	cancel()
	waitFor(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", d.Addr())
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	_ = idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection during shutdown: read %d, %v; want it closed", n, err)
	}
	g.release <- struct{}{}
	resp := recv(t, res, "the call")
	if resp == nil {
		t.FailNow()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.HasPrefix(b, []byte("done")) || !resp.Close {
		t.Fatalf("call during shutdown: %d %q, Connection: close %v", resp.StatusCode, b, resp.Close)
	}
	if err := recv(t, done, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// FuzzFrontEndHead feeds arbitrary request heads to the front end's parse
// and route: what it takes must be a request net/http takes too, routed to
// the same function. (h1's fuzz targets hold the parse itself to net/http's.)
func FuzzFrontEndHead(f *testing.F) {
	for _, s := range []string{
		"GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /function/f/a?b=c HTTP/1.1\r\nHost: f.example.com\r\nContent-Length: 2\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: f:80\r\nTe: trailers\r\nX-Call-Id: 1\r\nX-Forwarded-For: a\r\n\r\n",
		"GET /function/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"\r\nGET / HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	d, err := New(Config{})
	if err != nil {
		f.Fatal(err)
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")}})
	f.Fuzz(func(t *testing.T, b []byte) {
		end, _ := h1.HeadEnd(b, 0)
		if end <= 0 {
			return
		}
		c := &frontConn{d: d, head: b[:end]}
		fn := c.parse()
		if fn == nil {
			return
		}
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:end])))
		if err != nil {
			t.Fatalf("front end took %q, net/http refuses it: %v", b[:end], err)
		}
		if rt := d.resolve(r); rt.fn != fn {
			t.Fatalf("front end routes %q to %v, net/http's path to %v", b[:end], fn, rt.fn)
		}
		if r.ContentLength != c.req.length && !(r.ContentLength == 0 && c.req.length == 0) {
			t.Fatalf("%q: length %d, net/http %d", b[:end], c.req.length, r.ContentLength)
		}
	})
}

// A client that calls again as soon as it has its reply finds the slot it
// used free: the slot is released before the reply's end reaches the
// client (a queued call would ask the control plane for a sandbox more).
// The calls outlast frontend.WatchAfter, so each has a client watch to stop first.
func TestFrontEndFreesTheSlotBeforeTheReplyEnds(t *testing.T) {
	d, front := newTestDP(t, nil)
	sandbox := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(frontend.WatchAfter + 2*frontend.ReapEvery)
		_, _ = io.WriteString(w, "ok")
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("one")}, // concurrency 1
		Added:     []*briskv1.Endpoint{ep("one", "sb-1", sandbox)}})
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 8 {
		resp, err := client.Post(front.URL+"/function/one", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if timing := resp.Header.Get("X-Brisk-Timing"); resp.StatusCode != 200 || !strings.HasPrefix(timing, "queue_us=0,") {
			t.Fatalf("call %d: %d, timing %q: it waited for the slot the call before it held", i, resp.StatusCode, timing)
		}
	}
	if n := d.lookup("one").stats.current(); n != 0 {
		t.Fatalf("load %d after the calls", n)
	}
}

// Beyond MaxConnections open at once (handed-off ones included), a new
// connection is closed as it is accepted; once one closes, another fits.
func TestFrontEndMaxConnections(t *testing.T) {
	d, front := newTestDP(t, func(c *Config) { c.MaxConnections = 2 })
	deploy(d, "f", newSandbox(t, echo))
	addr := strings.TrimPrefix(front.URL, "http://")
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	call := func(c net.Conn, path string) (int, error) {
		if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return 0, err
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	fast, handed := dial(), dial()
	if code, err := call(fast, "/function/f"); code != 200 {
		t.Fatalf("first connection: %d %v", code, err)
	}
	if code, err := call(handed, "/healthz"); code != 200 { // served by net/http
		t.Fatalf("second connection: %d %v", code, err)
	}
	if code, err := call(dial(), "/function/f"); err == nil {
		t.Fatalf("a third connection was served (%d) with a limit of 2", code)
	}
	waitFor(t, "the refusal counted", func() bool { return promtest.ToFloat64(d.prom.refused) == 1 })
	handed.Close() // net/http notices, closes its side, and the count drops
	waitFor(t, "a connection to fit again", func() bool {
		code, err := call(dial(), "/function/f")
		return err == nil && code == 200
	})
}

// heldConn holds its first write until released: a client slow to take
// the reply's last bytes.
type heldConn struct {
	net.Conn
	once             sync.Once
	writing, release chan struct{}
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.once.Do(func() { close(c.writing); <-c.release })
	return c.Conn.Write(p)
}

type heldListener struct {
	net.Listener
	conns chan *heldConn
}

func (l *heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	hc := &heldConn{Conn: c, writing: make(chan struct{}), release: make(chan struct{})}
	l.conns <- hc
	return hc, nil
}

// A graceful shutdown does not cut off the end of a reply still going out
// to its client (the slot is already free then).
func TestFrontEndShutdownKeepsTheEndOfAReply(t *testing.T) {
	d, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	deploy(d, "f", newSandbox(t, echo))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl := &heldListener{Listener: ln, conns: make(chan *heldConn, 1)}
	f := d.newFrontEnd(d.newServer())
	go func() { _ = f.Serve(hl) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	hc := recv(t, hl.conns, "the connection")
	recv(t, hc.writing, "the reply's flush") // all of it fits in the buffer: this is its end
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- f.Shutdown(ctx)
	}()
	waitFor(t, "the shutdown to begin", f.Closing)
	f.Sweep() // what the shutdown does to idle connections, once more
	close(hc.release)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the reply was cut off by the shutdown: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"Path":"/"`) {
		t.Fatalf("reply %d %q", resp.StatusCode, b)
	}
	if err := recv(t, done, "the shutdown"); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// A graceful shutdown waits for calls it handed to net/http; a request
// still being read when it began that net/http would have to take (which
// net/http, shutting down, would drop unanswered) gets a clear 503.
func TestFrontEndShutdownFinishesHandedOffCalls(t *testing.T) {
	d, front := newTestDP(t, nil)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long", func(s *briskv1.FunctionSpec) { s.Concurrency = 2 })},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", g.addr)}})
	addr := strings.TrimPrefix(front.URL, "http://")
	chunked := "POST /function/long HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"
	running, err := net.Dial("tcp", addr) // a handed-off call, running at the shutdown
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	if _, err := io.WriteString(running, chunked); err != nil {
		t.Fatal(err)
	}
	recv(t, g.arrived, "the handed-off call at the sandbox")
	reading, err := net.Dial("tcp", addr) // half a head at the shutdown
	if err != nil {
		t.Fatal(err)
	}
	defer reading.Close()
	if _, err := io.WriteString(reading, chunked[:20]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second connection to be read", func() bool {
		return front.front.Count(frontend.StRead) > 0
	})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- front.front.Shutdown(ctx)
	}()
	waitFor(t, "the shutdown to begin", front.front.Closing)
	if _, err := io.WriteString(reading, chunked[20:]); err != nil {
		t.Fatal(err)
	}
	_ = reading.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(reading), nil)
	if err != nil {
		t.Fatalf("a request net/http must take, completed during the shutdown: %v", err)
	}
	wantError(t, result{code: resp.StatusCode, header: resp.Header, body: string(must(io.ReadAll(resp.Body)))}, http.StatusServiceUnavailable, "shutting down")
	if !resp.Close {
		t.Fatal("the refusal does not close the connection")
	}
	g.release <- struct{}{}
	_ = running.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(running), nil)
	if err != nil {
		t.Fatalf("a handed-off call running at the shutdown: %v", err)
	}
	if b := must(io.ReadAll(resp.Body)); resp.StatusCode != 200 || !strings.HasPrefix(string(b), "done") {
		t.Fatalf("a handed-off call running at the shutdown: %d %q", resp.StatusCode, b)
	}
	if err := recv(t, done, "the shutdown"); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// A function's chunked reply reaches the client in the data plane's own
// framing: size lines written anew, trailers only as valid header lines
// and never the data plane's own headers.
func TestFrontEndReframesChunkedReplies(t *testing.T) {
	d, front := newTestDP(t, nil)
	addr := strings.TrimPrefix(front.URL, "http://")
	sb := newOneShotSandbox(t, false, func(int) bool { return true })
	sb.replyWith = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5;x Q\x00\r\nhello\r\n" + "6;ext=1\r\n world\r\n" +
		"0\r\nX-Call-Id: spoof\r\nConnection: close\r\nX-Ok: yes\r\n\r\n"
	deploy(d, "f", sb.addr)
	got := testutil.RawExchange(t, addr, "GET /function/f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	for _, bad := range []string{"x Q", "\x00", "ext=", "spoof"} {
		if strings.Contains(got, bad) {
			t.Errorf("the client got %q from the function's framing: %q", bad, got)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
	if err != nil {
		t.Fatalf("%q: %v", got, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "hello world" || resp.Trailer.Get("X-Ok") != "yes" || resp.Trailer.Get("X-Call-Id") != "" {
		t.Fatalf("body %q (%v), trailers %v", b, err, resp.Trailer)
	}

	bad := newOneShotSandbox(t, false, func(int) bool { return true })
	bad.replyWith = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nBad Name\x01: x\r\n\r\n"
	deploy(d, "g", bad.addr)
	got = testutil.RawExchange(t, addr, "GET /function/g HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if strings.Contains(got, "Bad Name") || strings.HasSuffix(got, "0\r\n\r\n") {
		t.Fatalf("a malformed trailer reached the client, or the reply looked whole: %q", got)
	}
}

package dataplane

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// countingSandbox is an httptest sandbox that counts the connections it
// accepted and closed.
type countingSandbox struct {
	addr           string
	opened, closed atomic.Int64
}

func newCountingSandbox(t *testing.T, h http.HandlerFunc) *countingSandbox {
	t.Helper()
	cs := &countingSandbox{}
	s := httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			cs.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			cs.closed.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	cs.addr = strings.TrimPrefix(s.URL, "http://")
	return cs
}

func deploy(d *DataPlane, name, addr string) {
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec(name)},
		Added:     []*briskv1.Endpoint{ep(name, "sb-1", addr)}})
}

// A keep-alive connection the sandbox closed while it sat idle (a function
// server's idle timeout) is noticed on its next use: the call goes again on
// a new connection, once, with its body intact.
func TestClosedIdleConnectionIsReplaced(t *testing.T) {
	d, srv := newTestDP(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns, calls atomic.Int64
	var mu sync.Mutex
	var bodies []string
	go func() { // one reply per connection, announced as keep-alive, then close
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				b, _ := io.ReadAll(req.Body)
				calls.Add(1)
				mu.Lock()
				bodies = append(bodies, string(b))
				mu.Unlock()
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}()
		}
	}()
	deploy(d, "f", ln.Addr().String())
	for i, body := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
		resp, err := http.Post(srv.URL+"/function/f", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("call %d: %d %q", i, resp.StatusCode, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(bodies, " "); got != `{"n":1} {"n":2} {"n":3}` || calls.Load() != 3 {
		t.Fatalf("sandbox ran %d calls with bodies %s, want each of the 3 once", calls.Load(), got)
	}
	if conns.Load() < 3 {
		t.Fatalf("%d connections for 3 calls on a sandbox that closes each", conns.Load())
	}
}

// A reply of unknown length streams: the client gets the first piece while
// the function still runs, and the sandbox's trailers after the body.
func TestChunkedReplyStreamsWithTrailers(t *testing.T) {
	d, srv := newTestDP(t, nil)
	next := make(chan struct{})
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Result")
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-next
		_, _ = io.WriteString(w, "second\n")
		w.Header().Set("X-Result", "done")
	})
	deploy(d, "stream", addr)
	resp, err := http.Get(srv.URL + "/function/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first piece %q, %v", line, err)
	}
	close(next) // the sandbox finishes only after the client saw the first piece
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "second\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	if got := resp.Trailer.Get("X-Result"); got != "done" {
		t.Fatalf("trailer X-Result %q, want done (trailers %v)", got, resp.Trailer)
	}
}

// Replies without a body (HEAD, 204, 304) leave the connection reusable.
func TestBodilessRepliesKeepTheConnection(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sb := newCountingSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/none":
			w.WriteHeader(http.StatusNoContent)
		case "/same":
			w.WriteHeader(http.StatusNotModified)
		default:
			w.Header().Set("Content-Length", "5")
			_, _ = io.WriteString(w, "hello")
		}
	})
	deploy(d, "f", sb.addr)
	check := func(method, path string, code int, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+"/function/f"+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != code || string(b) != body {
			t.Fatalf("%s %s: %d %q, want %d %q", method, path, resp.StatusCode, b, code, body)
		}
		if method == http.MethodHead && resp.ContentLength != 5 {
			t.Fatalf("HEAD: Content-Length %d, want the sandbox's 5", resp.ContentLength)
		}
	}
	check(http.MethodHead, "/", 200, "")
	check(http.MethodGet, "/none", 204, "")
	check(http.MethodGet, "/same", 304, "")
	check(http.MethodGet, "/", 200, "hello")
	if n := sb.opened.Load(); n != 1 {
		t.Fatalf("sandbox saw %d connections for 4 sequential calls, want 1", n)
	}
}

// Request bodies of every framing arrive whole: unknown length (sent on
// chunked), and known lengths above the replay buffer.
func TestRequestBodiesArriveWhole(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	})
	deploy(d, "f", addr)
	big := bytes.Repeat([]byte("0123456789abcdef"), 20_000) // 320 KB
	for _, tc := range []struct {
		name string
		body io.Reader
		want []byte
	}{
		{"unknown length", io.MultiReader(strings.NewReader("abc"), strings.NewReader("def")), []byte("abcdef")},
		{"large", bytes.NewReader(big), big},
		{"large, unknown length", io.MultiReader(bytes.NewReader(big)), big},
	} {
		resp, err := http.Post(srv.URL+"/function/f", "application/octet-stream", tc.body)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(b, tc.want) {
			t.Fatalf("%s: %d, %d bytes back, want %d", tc.name, resp.StatusCode, len(b), len(tc.want))
		}
	}
}

// A reply framed by the connection's close (no length, HTTP/1.0 style) is
// passed on whole, and its connection is not reused.
func TestReplyUntilClose(t *testing.T) {
	d, srv := newTestDP(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
				}
			}()
		}
	}()
	deploy(d, "f", ln.Addr().String())
	for i := 0; i < 2; i++ {
		if r := get(t, srv.URL+"/function/f"); r.err != nil || r.code != 200 || r.body != "all of it" {
			t.Fatalf("call %d: %v %d %q", i, r.err, r.code, r.body)
		}
	}
}

// Connection-scoped headers stay on their hop, in both directions.
func TestHopByHopHeadersStayOnTheirHop(t *testing.T) {
	d, srv := newTestDP(t, nil)
	var got http.Header
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Function", "yes")
	})
	deploy(d, "f", addr)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/function/f", nil)
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("Proxy-Authorization", "secret")
	req.Header.Set("X-Kept", "2")
	r := do(t, req)
	if r.code != 200 {
		t.Fatalf("status %d", r.code)
	}
	for _, k := range []string{"X-Hop", "Proxy-Authorization"} {
		if v, ok := got[k]; ok {
			t.Errorf("sandbox got hop-by-hop header %s: %v", k, v)
		}
	}
	if got.Get("X-Kept") != "2" {
		t.Errorf("sandbox lost X-Kept: %v", got)
	}
	if r.header.Get("Keep-Alive") != "" || r.header.Get("X-Function") != "yes" {
		t.Errorf("reply headers %v: want X-Function and no Keep-Alive", r.header)
	}
}

// Sandboxes at one address (the emulated runtime's) share its idle
// connections, which are closed once no sandbox at the address is left.
func TestConnectionsArePerAddressAndLeaveWithTheLastSandbox(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sb := newCountingSandbox(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f"), fnSpec("g")},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr), ep("g", "sb-2", sb.addr)}})
	for _, fn := range []string{"f", "g", "f", "g"} {
		if r := get(t, srv.URL+"/function/"+fn); r.code != 200 {
			t.Fatalf("%s: status %d", fn, r.code)
		}
	}
	if sb.opened.Load() != 1 || sb.closed.Load() != 0 {
		t.Fatalf("4 sequential calls to 2 sandboxes at one address: opened %d closed %d, want 1 kept open", sb.opened.Load(), sb.closed.Load())
	}
	d.Apply(&briskv1.EndpointBatch{Removed: []string{"sb-1"}})
	if r := get(t, srv.URL+"/function/g"); r.code != 200 || sb.opened.Load() != 1 || sb.closed.Load() != 0 {
		t.Fatalf("after one of two sandboxes left: status %d, opened %d closed %d, want the connection kept", r.code, sb.opened.Load(), sb.closed.Load())
	}
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"g"}})
	waitFor(t, "the idle connection closed", func() bool { return sb.closed.Load() == 1 })
	if n := len(d.pools); n != 0 {
		t.Fatalf("%d pools left with no sandbox", n)
	}
}

// A function's series appear with its first endpoint or call, not at
// registration (thousands of registrations a second), and leave with it.
func TestFunctionSeriesComeWithUse(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("idle"), fnSpec("used")}})
	series := func(fn string) int { return strings.Count(get(t, srv.URL+"/metrics").body, `function="`+fn+`"`) }
	if n := series("idle") + series("used"); n != 0 {
		t.Fatalf("%d series for functions never called and without endpoints", n)
	}
	d.Apply(&briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("used", "sb-1", addr)}})
	if m := get(t, srv.URL+"/metrics").body; !strings.Contains(m, `brisk_dataplane_endpoints{function="used"} 1`) {
		t.Fatalf("no endpoints gauge after the first endpoint:\n%s", m)
	}
	if r := get(t, srv.URL+"/function/used"); r.code != 200 {
		t.Fatalf("call: %d", r.code)
	}
	if m := get(t, srv.URL+"/metrics").body; !strings.Contains(m, `brisk_dataplane_requests_total{code="200",function="used"} 1`) {
		t.Fatalf("no request counter after a call:\n%s", m)
	}
	if n := series("idle"); n != 0 {
		t.Fatalf("%d series for the idle function", n)
	}
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"used"}})
	if n := series("used"); n != 0 {
		t.Fatalf("%d series left for the deleted function", n)
	}
}

package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/internal/testutil"
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

// oneShotSandbox answers HTTP/1.1 on raw connections: serve is called per
// request with the connection's request count and says whether to reply
// (keep-alive) or to close without one (a crash mid-call); after a reply
// with closeAfter set it closes the connection (an idle timeout that
// struck at once). Every request's body is recorded.
type oneShotSandbox struct {
	addr       string
	conns      atomic.Int64
	mu         sync.Mutex
	bodies     []string
	closed     chan struct{} // one value per connection the sandbox closed
	closeAfter bool
	reply      func(nth int) bool
	replyWith  string // the raw reply; "" is a 200 with "ok"; set before the first call
}

func newOneShotSandbox(t *testing.T, closeAfter bool, reply func(nth int) bool) *oneShotSandbox {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &oneShotSandbox{addr: ln.Addr().String(), closed: make(chan struct{}, 100), closeAfter: closeAfter, reply: reply}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			go s.serve(c)
		}
	}()
	return s
}

func (s *oneShotSandbox) serve(c net.Conn) {
	defer func() { c.Close(); s.closed <- struct{}{} }()
	br := bufio.NewReader(c)
	for nth := 1; ; nth++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(req.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, req.Method+" "+string(b))
		s.mu.Unlock()
		if !s.reply(nth) {
			return
		}
		reply := s.replyWith
		if reply == "" {
			reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		}
		if _, err := io.WriteString(c, reply); err != nil || s.closeAfter {
			return
		}
	}
}

func (s *oneShotSandbox) seen() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.bodies, " | ")
}

func post(t *testing.T, url, body string) result {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	return do(t, req)
}

// A keep-alive connection the sandbox closed while it sat idle (its
// server's idle timeout) is found closed before use: the call goes on a new
// connection, once, with its body intact.
func TestClosedIdleConnectionIsNotUsed(t *testing.T) {
	defer func(v time.Duration) { proxy.CheckIdleAfter = v }(proxy.CheckIdleAfter)
	proxy.CheckIdleAfter = 0 // probe every reuse: the close comes at once here
	d, srv := newTestDP(t, nil)
	sb := newOneShotSandbox(t, true, func(int) bool { return true })
	deploy(d, "f", sb.addr)
	for i, body := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
		if r := post(t, srv.URL+"/function/f", body); r.code != 200 || r.body != "ok" {
			t.Fatalf("call %d: %d %q", i, r.code, r.body)
		}
		recv(t, sb.closed, "the sandbox closing the connection")
	}
	if got := sb.seen(); got != `POST {"n":1} | POST {"n":2} | POST {"n":3}` {
		t.Fatalf("sandbox ran %s, want each call once", got)
	}
	if n := sb.conns.Load(); n != 3 {
		t.Fatalf("%d connections for 3 calls on a sandbox that closes each, want 3", n)
	}
}

// A sandbox that closes the connection after reading a call, without a
// reply (it crashed mid-call), may have run it: a POST is not sent again
// (502), a GET is (http.Transport's rule).
func TestCallCutOffMidwayIsReplayedOnlyIfIdempotent(t *testing.T) {
	d, srv := newTestDP(t, nil)
	// Each connection answers its first call and drops its second.
	sb := newOneShotSandbox(t, false, func(nth int) bool { return nth == 1 })
	deploy(d, "f", sb.addr)
	if r := post(t, srv.URL+"/function/f", "a"); r.code != 200 {
		t.Fatalf("first call: %d %s", r.code, r.body)
	}
	wantError(t, post(t, srv.URL+"/function/f", "b"), 502, "sandbox sb-1")
	if got := sb.seen(); got != "POST a | POST b" {
		t.Fatalf("sandbox saw %s, want the cut-off POST once", got)
	}
	if r := post(t, srv.URL+"/function/f", "c"); r.code != 200 { // a new connection
		t.Fatalf("third call: %d %s", r.code, r.body)
	}
	if r := get(t, srv.URL+"/function/f"); r.code != 200 || r.body != "ok" {
		t.Fatalf("GET cut off on a reused connection: %d %q, want it sent again", r.code, r.body)
	}
	if got := sb.seen(); got != "POST a | POST b | POST c | GET  | GET " {
		t.Fatalf("sandbox saw %s", got)
	}
}

// A sandbox address that passes from one function to another within one
// batch keeps a working connection pool (it is not closed in between).
func TestAddressPassingBetweenFunctionsInABatch(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("a"), fnSpec("b")},
		Added:     []*briskv1.Endpoint{ep("a", "sb-a0", addr)}})
	from, to := "a", "b"
	for i := 1; i <= 20; i++ { // map order varies: either publish may run first
		d.Apply(&briskv1.EndpointBatch{
			Removed: []string{fmt.Sprintf("sb-%s%d", from, i-1)},
			Added:   []*briskv1.Endpoint{ep(to, fmt.Sprintf("sb-%s%d", to, i), addr)}})
		if r := get(t, srv.URL+"/function/"+to); r.code != 200 {
			t.Fatalf("move %d to %s: %d %s", i, to, r.code, r.body)
		}
		from, to = to, from
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
	testutil.ServeConns(t, ln, func(c net.Conn) {
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
		}
	})
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

// A function may answer before it has read a large body (a 413 of its own,
// a 401): the client gets that answer, not a 502 for the body it could not
// finish sending.
func TestEarlyReplyToAStreamedBody(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sandbox := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = io.WriteString(w, "too big for me")
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("picky"), fnSpec("streamer", func(s *briskv1.FunctionSpec) { s.StreamRequests = true })},
		Added:     []*briskv1.Endpoint{ep("picky", "sb-1", sandbox), ep("streamer", "sb-2", sandbox)}})
	// A raw client reads the reply while it sends: Go's client may report
	// its own failed write first when the server stops reading (a race in
	// the client, not in what the data plane sends). A function that
	// streams its requests answers before the body has even ended; one
	// that does not gets the whole body first (read before the call), and
	// its answer still reaches the client.
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		fn      string
		chunked bool
	}{{"picky", false}, {"picky", true}, {"streamer", false}, {"streamer", true}} {
		chunked := tc.chunked
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		head := "POST /function/" + tc.fn + " HTTP/1.1\r\nHost: x\r\nContent-Length: 5242880\r\n\r\n"
		piece := bytes.Repeat([]byte("x"), 64<<10)
		var end []byte
		if chunked {
			head = "POST /function/" + tc.fn + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
			piece = append([]byte("10000\r\n"), append(piece, "\r\n"...)...)
			if tc.fn == "picky" {
				end = []byte("0\r\n\r\n")
			}
		}
		go func() {
			if _, err := io.WriteString(c, head); err != nil {
				return
			}
			for range 80 { // 5 MiB, unless the data plane stops taking it
				if _, err := c.Write(piece); err != nil {
					return
				}
			}
			_, _ = c.Write(end)
		}()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s, chunked %v: %v", tc.fn, chunked, err)
		}
		b, err := io.ReadAll(resp.Body)
		c.Close()
		if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge || string(b) != "too big for me" {
			t.Fatalf("%s, chunked %v: %d %q %v, want the function's own 413", tc.fn, chunked, resp.StatusCode, b, err)
		}
	}
	if r := get(t, srv.URL+"/function/picky"); r.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("next call: %d %q", r.code, r.body)
	}
}

// A client and a function that streams requests (StreamRequests) can talk
// over one call: each piece of a streamed body reaches the function, and
// its answer to it comes back, before the client sends the next.
func TestFullDuplexCall(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sandbox := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		br := bufio.NewReader(r.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = io.WriteString(w, "echo "+line)
			_ = rc.Flush()
		}
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("chat", func(s *briskv1.FunctionSpec) { s.StreamRequests = true })},
		Added:     []*briskv1.Endpoint{ep("chat", "sb-1", sandbox)}})
	pr, pw := io.Pipe()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/chat", pr)
	replies := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(replies)
			return
		}
		replies <- resp
	}()
	if _, err := io.WriteString(pw, "one\n"); err != nil {
		t.Fatal(err)
	}
	resp := recv(t, replies, "the reply's head")
	if resp == nil {
		t.FailNow()
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for _, word := range []string{"one", "two", "three"} {
		if word != "one" {
			if _, err := io.WriteString(pw, word+"\n"); err != nil {
				t.Fatal(err)
			}
		}
		line := make(chan string, 1)
		go func() { l, _ := br.ReadString('\n'); line <- l }()
		if got := recv(t, line, "the answer to "+word); got != "echo "+word+"\n" {
			t.Fatalf("answer %q, want echo %s", got, word)
		}
	}
	pw.Close()
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("after the body ended: %q", rest)
	}
}

// A function's 103 Early Hints reach the client before its final reply,
// with their own headers only.
func TestEarlyHintsArePassedOn(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sandbox := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</app.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "page")
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("web")},
		Added:     []*briskv1.Endpoint{ep("web", "sb-1", sandbox)}})
	var hints []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, fmt.Sprintf("%d %s", code, h.Get("Link")))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, srv.URL+"/function/web", nil)
	r := do(t, req)
	if r.code != 200 || r.body != "page" || r.header.Get("Link") != "" {
		t.Fatalf("final reply %d %q, Link %q", r.code, r.body, r.header.Get("Link"))
	}
	if got := strings.Join(hints, "|"); got != "103 </app.css>; rel=preload" {
		t.Fatalf("interim replies %q, want one 103 with the Link", got)
	}
}

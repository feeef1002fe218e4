package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// Regression tests for issue 21's attacks on the data path: slow uploads,
// malformed chunking, Content-Length with Transfer-Encoding, and replies
// that break off.

// lengthSandbox answers each call with the number of body bytes it read,
// and counts calls by path.
type lengthSandbox struct {
	addr  string
	mu    sync.Mutex
	paths map[string]int
}

func newLengthSandbox(t *testing.T) *lengthSandbox {
	s := &lengthSandbox{paths: map[string]int{}}
	s.addr = newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.paths[r.URL.Path]++
		s.mu.Unlock()
		_, _ = io.WriteString(w, strconv.FormatInt(n, 10))
	})
	return s
}

func (s *lengthSandbox) calls(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paths[path]
}

func (s *lengthSandbox) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range s.paths {
		n += k
	}
	return n
}

// stalledUpload opens a connection that sends a request head and the start
// of its body, then nothing more.
func stalledUpload(t *testing.T, base, head string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

// Slow uploads cost connections, not the sandbox: with one slot and two
// clients trickling bodies (one large with a length, one chunked), a normal
// call still gets the slot at once, and the sandbox sees no stalled call.
func TestSlowUploadsDoNotHoldTheSlot(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sb := newLengthSandbox(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 3000 })},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})
	fn := d.lookup("f")
	stalledUpload(t, srv.URL, "POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("a", 10))
	stalledUpload(t, srv.URL, "POST /function/f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
	waitFor(t, "both uploads read ahead of their calls", func() bool { return d.bodiesReading.Load() == 2 })

	for i := 0; i < 3; i++ {
		r := get(t, srv.URL+"/function/f")
		if r.err != nil || r.code != 200 {
			t.Fatalf("call %d beside two stalled uploads: %d %q %v", i, r.code, r.body, r.err)
		}
	}
	if n := sb.total(); n != 3 {
		t.Fatalf("the sandbox saw %d calls, want only the 3 normal ones", n)
	}
	if n := fn.set.Load().Endpoints[0].tracker.InFlight(); n != 0 {
		t.Fatalf("%d slots held while uploads stall", n)
	}
}

// A body larger than the buffer streams, but must keep up the minimum
// rate: one that stalls gets 408 body-too-slow; one that keeps up arrives
// whole.
func TestStreamedBodyMinimumRate(t *testing.T) {
	d, srv := newTestDP(t, func(c *Config) { c.BodyBufferBytes = 1024; c.MinBodyRate = 1024 })
	sb := newLengthSandbox(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/f", strings.NewReader(strings.Repeat("b", 100_000)))
	if r := do(t, req); r.code != 200 || r.body != "100000" {
		t.Fatalf("a fast 100 kB body: %d %q", r.code, r.body)
	}

	c := stalledUpload(t, srv.URL, "POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("a", 2000))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	r := result{code: resp.StatusCode, body: string(b), header: resp.Header}
	wantReason(t, r, http.StatusRequestTimeout, "body-too-slow", "minimum rate")
	if d.errorCount(reasonBodyTooSlow) != 1 {
		t.Fatalf("body-too-slow counted %v times", d.errorCount(reasonBodyTooSlow))
	}
}

// countResponses counts the HTTP responses in a raw reply stream.
func countResponses(raw string) int { return strings.Count(raw, "HTTP/1.1 ") }

// An invalid chunk size gets one answer, a brisk 400, and the connection
// closes: the bytes after it are never read as another request.
func TestInvalidChunkSizeGetsOneAnswer(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sb := newLengthSandbox(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})
	raw := testutil.RawExchange(t, strings.TrimPrefix(srv.URL, "http://"),
		"POST /function/f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"+
			"GET /function/f/next HTTP/1.1\r\nHost: x\r\n\r\n")
	if n := countResponses(raw); n != 1 {
		t.Fatalf("%d responses, want 1:\n%s", n, raw)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || resp.Header.Get("X-Brisk-Error") != "bad-request" || !resp.Close {
		t.Fatalf("status %d, X-Brisk-Error %q, close %v; want 400 bad-request and close", resp.StatusCode, resp.Header.Get("X-Brisk-Error"), resp.Close)
	}
	if n := sb.calls("/next"); n != 0 {
		t.Fatalf("the bytes after the bad chunk ran as a request (%d calls)", n)
	}
}

// A request with both Content-Length and Transfer-Encoding is served by its
// chunked framing and the connection closes after the reply, so what a
// front proxy counted into the body never runs as a request of its own —
// also when it is not the connection's first request.
func TestContentLengthWithChunkedClosesAfterReply(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sb := newLengthSandbox(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})
	smuggled := "GET /function/f/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	attack := "POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(5+len(smuggled)) +
		"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct{ name, raw string }{
		{"first request", attack},
		{"after a normal request", "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n" + attack},
		{"after a handed-off request", "POST /function/f HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx" + attack},
	} {
		raw := testutil.RawExchange(t, addr, tc.raw)
		want := strings.Count(tc.raw, "HTTP/1.1\r\n") - 1 // all but the smuggled one
		if n := countResponses(raw) - strings.Count(raw, "HTTP/1.1 100 Continue"); n != want {
			t.Errorf("%s: %d responses, want %d:\n%s", tc.name, n, want, raw)
		}
	}
	if n := sb.calls("/smuggled"); n != 0 {
		t.Fatalf("the smuggled request ran %d times", n)
	}
}

// brokenSandbox answers every request with reply, then closes.
func brokenSandbox(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) {
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, reply)
	})
	return ln.Addr().String()
}

// A sandbox that sends a short body or dies after its head gets the client
// a 502 that says so, on both paths — not an empty reply.
func TestBrokenReplyGets502(t *testing.T) {
	d, srv := newTestDP(t, nil)
	short := brokenSandbox(t, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
	headOnly := brokenSandbox(t, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("short"), fnSpec("head")},
		Added:     []*briskv1.Endpoint{ep("short", "sb-s", short), ep("head", "sb-h", headOnly)}})
	var calls atomic.Int32
	for _, name := range []string{"short", "head"} {
		calls.Add(2)
		wantReason(t, get(t, srv.URL+"/function/"+name), 502, "sandbox-failed", "reply broken off")
		wantReason(t, chunkedGet(t, srv.URL+"/function/"+name), 502, "sandbox-failed", "reply broken off")
	}
	if got := d.errorCount(reasonSandboxFailed); got != float64(calls.Load()) {
		t.Fatalf("sandbox-failed counted %v, want %d", got, calls.Load())
	}
}

// With the buffer budget spent, a body streams (and arrives whole); what a
// call took of the budget comes back when it ends.
func TestBodyBudget(t *testing.T) {
	for _, total := range []int64{1, 1 << 20} {
		d, srv := newTestDP(t, func(c *Config) { c.BodyBufferTotal = total })
		sb := newLengthSandbox(t)
		d.Apply(&briskv1.EndpointBatch{Snapshot: true,
			Functions: []*briskv1.FunctionSpec{fnSpec("f")},
			Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})
		for _, chunked := range []bool{false, true} {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/f", strings.NewReader(strings.Repeat("b", 300_000)))
			if chunked {
				req.ContentLength = -1
			}
			if r := do(t, req); r.code != 200 || r.body != "300000" {
				t.Fatalf("budget %d, chunked %v: %d %q", total, chunked, r.code, r.body)
			}
			waitFor(t, "the budget back whole", func() bool { return d.bodyBudget.left.Load() == total })
		}
	}
}

// A streamed body cannot bank rate credit with a burst and then stall:
// after bodyStall without a byte the call ends with 408 and the slot is
// free for the next call.
func TestStreamedBodyStallEnds(t *testing.T) {
	defer func(s time.Duration) { bodyStall = s }(bodyStall)
	bodyStall = 300 * time.Millisecond
	d, srv := newTestDP(t, func(c *Config) { c.BodyBufferTotal = 1; c.MinBodyRate = 1024 })
	sb := newLengthSandbox(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 20_000 })},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})
	// 30 kB at once: 30 s of credit at 1 KiB/s; then nothing.
	c := stalledUpload(t, srv.URL, "POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("a", 30000))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the stalled upload got no answer: %v", err)
	}
	if resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("X-Brisk-Error") != "body-too-slow" {
		t.Fatalf("stalled upload: %d %s", resp.StatusCode, resp.Header.Get("X-Brisk-Error"))
	}
	if r := get(t, srv.URL+"/function/f"); r.code != 200 {
		t.Fatalf("the next call: %d %s", r.code, r.body)
	}
}

// Bytes a sandbox sends past a reply's end are not the next caller's
// reply: the connection holding them is closed, not pooled (on both paths,
// and after a HEAD reply followed by a body).
func TestStrayReplyBytesNeverReachTheNextCaller(t *testing.T) {
	d, srv := newTestDP(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var sloppy atomic.Bool
	sloppy.Store(true)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					switch {
					case req.Method == http.MethodHead: // a body where none may be
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nnot-for-you")
					case sloppy.Swap(false): // one sloppy reply: a whole reply more than its length
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nnot-for-you")
					default:
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(req.URL.Path), req.URL.Path)
					}
				}
			}()
		}
	}()
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added: []*briskv1.Endpoint{ep("f", "sb-1", ln.Addr().String())}})
	call := func(method, p string, chunked bool) result {
		req, _ := http.NewRequest(method, srv.URL+"/function/f"+p, strings.NewReader("x"))
		if chunked {
			req.ContentLength = -1
		}
		return do(t, req)
	}
	for _, chunked := range []bool{false, true} {
		sloppy.Store(true)
		call(http.MethodPost, "/first", chunked)
		for _, p := range []string{"/second", "/third"} {
			if r := call(http.MethodPost, p, chunked); r.body != p {
				t.Errorf("chunked %v: caller of %s got %d %q", chunked, p, r.code, r.body)
			}
		}
		if r := call(http.MethodHead, "/head", chunked); r.code != 200 {
			t.Errorf("chunked %v: HEAD: %d", chunked, r.code)
		}
		for _, p := range []string{"/after-head", "/after-that"} {
			if r := call(http.MethodPost, p, chunked); r.body != p {
				t.Errorf("chunked %v: after a HEAD answered with a body, caller of %s got %d %q", chunked, p, r.code, r.body)
			}
		}
	}
}

// A client's request trailer that may not be a trailer (Content-Length) is
// the client's error: 400 bad-request, and the sandbox is not called.
func TestForbiddenRequestTrailerIsABadRequest(t *testing.T) {
	d, srv := newTestDP(t, nil)
	sb := newLengthSandbox(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added: []*briskv1.Endpoint{ep("f", "sb-1", sb.addr)}})
	c := stalledUpload(t, srv.URL, "POST /function/f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nContent-Length: 9\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || resp.Header.Get("X-Brisk-Error") != "bad-request" || sb.total() != 0 {
		t.Errorf("forbidden request trailer: %d %s (sandbox calls %d)", resp.StatusCode, resp.Header.Get("X-Brisk-Error"), sb.total())
	}
}

// A function that sends interim replies without end gets a 502, not a
// flood through to its client.
func TestInterimReplyFloodIsRefused(t *testing.T) {
	d, srv := newTestDP(t, nil)
	flood := brokenSandbox(t, strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", 40)+"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
	fine := brokenSandbox(t, strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", 3)+"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("flood"), fnSpec("fine")},
		Added:     []*briskv1.Endpoint{ep("flood", "sb-f", flood), ep("fine", "sb-o", fine)}})
	for _, call := range []func(string) result{func(u string) result { return get(t, u) }, func(u string) result { return chunkedGet(t, u) }} {
		wantReason(t, call(srv.URL+"/function/flood"), 502, "sandbox-failed", "too many interim")
		if r := call(srv.URL + "/function/fine"); r.code != 200 || r.body != "ok" {
			t.Fatalf("a few interim replies: %d %q", r.code, r.body)
		}
	}
}

// An HTTP/1.0 request with Transfer-Encoding on a kept-alive connection:
// net/http ignores the header, so the chunked body used to be read as the
// next request (a desync, issue 36). Its framing is faulty (RFC 9112
// section 6.1): 400, and the connection closes after it.
func TestHTTP10TransferEncodingIsRefused(t *testing.T) {
	_, srv := newTestDP(t, nil)
	c := stalledUpload(t, srv.URL, "POST /function/f HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"2e\r\nGET /function/f HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading until the close: %v (read %q)", err, all)
	}
	if got := string(all); !strings.HasPrefix(got, "HTTP/1.1 400 ") || strings.Count(got, "HTTP/1.1 ") != 1 || !strings.Contains(got, "RFC 9112") {
		t.Fatalf("reply %q: want one 400 naming the faulty framing, then the close", got)
	}
}

package dataplane

import (
	"bufio"
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
	if n := fn.set.Load().eps[0].tracker.InFlight(); n != 0 {
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
	raw := rawCall(t, strings.TrimPrefix(srv.URL, "http://"),
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
		raw := rawCall(t, addr, tc.raw)
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
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, reply)
			}()
		}
	}()
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

package dataplane

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Attacks on the front end's submit (fastasync.go), and what it must keep of net/http's.

// frontAsyncSeen is what a function saw of a call.
type frontAsyncSeen struct {
	Method, Path, Query, Host, Body string
	Header                          http.Header
}

// frontAsyncEnv: an async data plane with function "echo" (public) and
// "priv" (token), both recording what the function saw by X-Call-Id.
type frontAsyncEnv struct {
	*asyncEnv
	addr string
	tok  string
	mu   sync.Mutex
	got  map[string]frontAsyncSeen
}

func newFrontAsyncEnv(t *testing.T) *frontAsyncEnv {
	e := &frontAsyncEnv{asyncEnv: newAsyncEnv(t, nil, async.Config{}), got: map[string]frontAsyncSeen{}}
	sb := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		for _, k := range []string{"X-Call-Id", "X-Start-Time", "Content-Length", "Traceparent"} {
			delete(h, k)
		}
		e.mu.Lock()
		e.got[r.Header.Get("X-Call-Id")] = frontAsyncSeen{r.Method, r.URL.RawPath + "|" + r.URL.Path, r.URL.RawQuery, r.Host, string(b), h}
		e.mu.Unlock()
		_, _ = io.WriteString(w, "sync-reply:"+string(b))
	})
	tk, g := newToken(t, []string{auth.ScopeInvoke}, []string{"priv"})
	e.tok = "Bearer " + tk
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("echo", func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthPublic }),
			fnSpec("priv", func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthToken }),
		},
		Added: []*briskv1.Endpoint{ep("echo", "sb-1", sb), ep("priv", "sb-2", sb)},
		Auth:  &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{g}}})
	e.addr = strings.TrimPrefix(e.ts.URL, "http://")
	return e
}

func (e *frontAsyncEnv) seen(t *testing.T, id string) frontAsyncSeen {
	t.Helper()
	var s frontAsyncSeen
	waitFor(t, "call "+id+" run", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		var ok bool
		s, ok = e.got[id]
		return ok
	})
	return s
}

// A HEAD submit: the front end's 202 carries the JSON body although the
// reply to a HEAD has none (RFC 9110 9.3.2); net/http's path sends none.
// On a kept-alive connection the body is read as the start of the next
// reply: the client's next call gets garbage (a desync; behind a proxy
// that shares upstream connections, another client's reply is shifted).
func TestAsyncFrontHeadSubmitSendsNoBody(t *testing.T) {
	e := newFrontAsyncEnv(t)
	for _, tc := range []struct{ name, head string }{
		{"front end", "HEAD /async-function/echo HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"net/http", "HEAD /async-function/echo/%61 HTTP/1.1\r\nHost: x\r\n\r\n"}, // '%': handed off
		{"net/http, refused token", "HEAD /async-function/priv/%61 HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"front end, refused token", "HEAD /async-function/priv HTTP/1.1\r\nHost: x\r\n\r\n"},
		// Before this change too: the front end's sync call, refused.
		{"front end sync call, refused token (pre-existing)", "HEAD /function/priv HTTP/1.1\r\nHost: x\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(c, tc.head+"GET /function/echo HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			r1, err := http.ReadResponse(br, &http.Request{Method: http.MethodHead})
			if err != nil {
				t.Fatal(err)
			}
			r1.Body.Close()
			r2, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("HEAD answered %d; the next reply on the connection does not parse: %v", r1.StatusCode, err)
			}
			b, _ := io.ReadAll(r2.Body)
			if r2.StatusCode != http.StatusOK {
				t.Fatalf("HEAD answered %d; next reply %d %q", r1.StatusCode, r2.StatusCode, b)
			}
		})
	}
}

// Pipelined submits and a sync call after them on one connection: each
// stored call keeps its own body and headers (rq.body and c.head are
// reused by the next request): Submit copies the body into the NATS
// connection before it returns.
func TestAsyncFrontPipelinedSubmitsKeepTheirBodies(t *testing.T) {
	e := newFrontAsyncEnv(t)
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	bodies := []string{strings.Repeat("A", 5000), "short-b", strings.Repeat("C", 60<<10)}
	var req strings.Builder
	for i, b := range bodies {
		req.WriteString("POST /async-function/echo/p" + strconv.Itoa(i) + "?i=" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: x\r\nX-N: " + strconv.Itoa(i) + "\r\nContent-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n" + b)
	}
	sync := strings.Repeat("Z", 9000)
	req.WriteString("POST /function/echo HTTP/1.1\r\nHost: x\r\nX-N: sync\r\nContent-Length: " + strconv.Itoa(len(sync)) + "\r\n\r\n" + sync)
	if _, err := io.WriteString(c, req.String()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var ids []string
	for range bodies {
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(r.Body)
		if r.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d", r.StatusCode)
		}
		ids = append(ids, r.Header.Get("X-Call-Id"))
	}
	r, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	if string(b) != "sync-reply:"+sync {
		t.Fatalf("sync call: %d, %d bytes", r.StatusCode, len(b))
	}
	for i, id := range ids {
		s := e.seen(t, id)
		if s.Body != bodies[i] || s.Header.Get("X-N") != strconv.Itoa(i) || s.Query != "i="+strconv.Itoa(i) || !strings.HasSuffix(s.Path, "/p"+strconv.Itoa(i)) {
			t.Errorf("call %d: function saw %s %q ?%q X-N=%q, body %d bytes (want %d)", i, s.Method, s.Path, s.Query, s.Header.Get("X-N"), len(s.Body), len(bodies[i]))
		}
	}
}

// Front end and net/http store the same call for odd but valid targets
// and headers the front end drops as hop-by-hop or its own. Expected to
// pass.
func TestAsyncFrontParityOddRequests(t *testing.T) {
	e := newFrontAsyncEnv(t)
	for _, head := range []string{
		"POST /async-function/echo/a\"b{c}|^`;x/../y//z?q=a\"b&&=|x HTTP/1.1\r\nHost: x\r\n",
		"POST /async-function/echo HTTP/1.1\r\nHost: h.example\r\nX-Forwarded-Host: evil\r\nX-Forwarded-Proto: gopher\r\nX-Brisk-Sandbox: sb-evil\r\n" +
			"Proxy-Authorization: Basic eA==\r\nTrailer: X-T\r\nKeep-Alive: 1\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\nX-Bin: \xff\xfe\x80ok\r\nX-Empty:\r\n" +
			"X-Start-Time: 1\r\nX-Brisk-Timing: q\r\nAuthorization: Bearer nottheplatforms\r\n",
		"POST /async-function/priv HTTP/1.1\r\nHost: x\r\nAuthorization: " + e.tok + "\r\nConnection: X-Drop\r\nX-Drop: 1\r\n",
	} {
		var seen [2]frontAsyncSeen
		for i, chunked := range []bool{false, true} {
			body := "Content-Length: 3\r\n\r\nabc"
			if chunked {
				body = "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
			}
			resp, b := rawCall(t, e.ts.URL, head+body)
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("%q chunked=%v: %d %s", head, chunked, resp.StatusCode, b)
			}
			seen[i] = e.seen(t, resp.Header.Get("X-Call-Id"))
		}
		a, _ := json.Marshal(seen[0])
		b, _ := json.Marshal(seen[1])
		if string(a) != string(b) {
			t.Errorf("%q: function saw\n  %s (front end)\n  %s (net/http)", head, a, b)
		}
	}
}

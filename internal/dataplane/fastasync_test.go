package dataplane

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
)

// The front end's submit (a body of known length) and net/http's (a
// chunked body) store the same call: the function sees the same method,
// path, query, headers and body, and the clients get the same 202.
func TestAsyncFrontEndSubmitsAsNetHTTPDoes(t *testing.T) {
	e := newAsyncEnv(t, nil, async.Config{})
	type dump struct {
		Method, Path, Query, Host, Body string
		Header                          http.Header
	}
	var mu sync.Mutex
	got := map[string]dump{}
	sb := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		for _, k := range []string{"X-Call-Id", "X-Start-Time", "Content-Length", "Traceparent"} {
			delete(h, k)
		}
		mu.Lock()
		got[r.Header.Get("X-Call-Id")] = dump{r.Method, r.URL.RawPath + "|" + r.URL.Path, r.URL.RawQuery, r.Host, string(b), h}
		mu.Unlock()
	})
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("echo")}, Added: []*briskv1.Endpoint{ep("echo", "sb-1", sb)}})
	addr := strings.TrimPrefix(e.ts.URL, "http://")
	for _, head := range []string{
		"POST /async-function/echo HTTP/1.1\r\nHost: x\r\n",
		"PUT /async-function/echo.default/a/b/c?x=1&y=z HTTP/1.1\r\nHost: api.example:8080\r\nX-Multi: 1\r\nx-multi: 2\r\n" +
			"Authorization: Basic dXNlcjpwYXNz\r\nUser-Agent: t/1\r\nConnection: keep-alive, X-Hop\r\nX-Hop: gone\r\nKeep-Alive: timeout=5\r\n" +
			"X-Forwarded-For: 10.0.0.1\r\nIdempotency-Key: k1\r\nContent-Type: text/plain; charset=utf-8\r\nTe: trailers\r\n",
		"DELETE /async-function/echo/ HTTP/1.1\r\nHost: x\r\nX-Call-Id: ",
	} {
		var dumps [2]dump
		var replies [2]*http.Response
		var bodies [2]string
		for i, chunked := range []bool{false, true} {
			h := head
			if strings.HasSuffix(h, "X-Call-Id: ") {
				h += map[bool]string{false: "fixed-1", true: "chunked-1"}[chunked] + "\r\n"
			}
			body := "Content-Length: 7\r\n\r\npayload"
			if chunked { // net/http's path
				body = "Transfer-Encoding: chunked\r\n\r\n7\r\npayload\r\n0\r\n\r\n"
			}
			resp, b := rawCall(t, "http://"+addr, h+body)
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("%q (chunked %v): %d %s", head, chunked, resp.StatusCode, b)
			}
			id := resp.Header.Get("X-Call-Id")
			awaitCall(t, e.ts.URL, id, async.StatusSucceeded)
			mu.Lock()
			dumps[i] = got[id]
			mu.Unlock()
			replies[i], bodies[i] = resp, strings.ReplaceAll(b, id, "ID")
			if loc := resp.Header.Get("Location"); loc != "/v1/calls/"+id {
				t.Errorf("%q (chunked %v): Location %q", head, chunked, loc)
			}
		}
		a, _ := json.Marshal(dumps[0])
		b, _ := json.Marshal(dumps[1])
		if string(a) != string(b) || dumps[0].Body != "payload" {
			t.Errorf("%q: the function saw\n  %s (front end)\n  %s (net/http)", head, a, b)
		}
		names := func(r *http.Response) []string {
			var n []string
			for k := range r.Header {
				if k != "Connection" {
					n = append(n, k)
				}
			}
			slices.Sort(n)
			return n
		}
		if !slices.Equal(names(replies[0]), names(replies[1])) || bodies[0] != bodies[1] {
			t.Errorf("%q: replies differ:\n  %v %q\n  %v %q", head, replies[0].Header, bodies[0], replies[1].Header, bodies[1])
		}
	}
}

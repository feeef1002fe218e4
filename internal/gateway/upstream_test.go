package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// handlerDP stands in for a data plane with its own handler for function
// calls; it answers the gateway's health probes itself.
func handlerDP(t *testing.T, h http.HandlerFunc) *fakeDP {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" && r.Host == "localhost" {
			_, _ = io.WriteString(w, "ok\n")
			return
		}
		h(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &fakeDP{name: "handler", addr: ln.Addr().String(), srv: srv}
}

// rawDP stands in for a data plane that writes its replies itself: serve
// gets each function call (its body read) with the number of calls its
// connection carried before, and writes the reply; it returns false to
// close the connection.
func rawDP(t *testing.T, serve func(bw *bufio.Writer, r *http.Request, prior int) bool) *fakeDP {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				br, bw := bufio.NewReader(c), bufio.NewWriter(c)
				for calls := 0; ; {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					if r.URL.Path == "/healthz" && r.Host == "localhost" {
						bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
					} else if !serve(bw, r, calls) {
						_ = bw.Flush()
						return
					} else {
						calls++
					}
					if bw.Flush() != nil {
						return
					}
				}
			})
		}
	})
	return &fakeDP{name: "raw", addr: ln.Addr().String()}
}

func metricsOf(t *testing.T, g *Gateway) string {
	t.Helper()
	return call(t, http.MethodGet, "http://"+g.Addr()+"/metrics", "", "").raw
}

// A request whose data plane refuses the connection goes to the next one
// with its body, whether read before the call or streamed.
func TestFailoverWithBody(t *testing.T) {
	a, b := newFakeDP(t, "a"), newFakeDP(t, "b")
	a.stop()
	bodies := map[string]func() io.Reader{
		"small": func() io.Reader { return strings.NewReader("small body") },
		"chunked": func() io.Reader { // no length: streamed as chunks
			pr, pw := io.Pipe()
			go func() {
				_, _ = io.WriteString(pw, "chunked ")
				_, _ = io.WriteString(pw, "body")
				_ = pw.Close()
			}()
			return pr
		},
	}
	for kind, body := range bodies {
		g := runGateway(t, time.Hour, a, b) // a is up until a call fails to connect
		fn := nameOn(t, g, a.addr)
		resp, err := http.Post("http://"+g.Addr()+"/function/"+fn, "text/plain", body())
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"Body":"`+kind+` body"`) || resp.Header.Get("X-Brisk-Dataplane") != b.addr {
			t.Fatalf("%s body after failover: %d via %q: %s", kind, resp.StatusCode, resp.Header.Get("X-Brisk-Dataplane"), raw)
		}
		if m := metricsOf(t, g); !strings.Contains(m, fmt.Sprintf(`brisk_gateway_connect_failures_total{dataplane=%q} 1`, a.addr)) {
			t.Errorf("%s: connect failure not counted:\n%s", kind, m)
		}
	}
}

// A keep-alive connection the data plane closes on the next call (its idle
// timeout racing the call): a GET goes once more on a fresh connection; a
// POST that was sent may have run, so it is a 502.
func TestPooledConnectionClosedByDataPlane(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	dp := rawDP(t, func(bw *bufio.Writer, r *http.Request, prior int) bool {
		mu.Lock()
		seen = append(seen, r.Method)
		mu.Unlock()
		if prior == 1 {
			return false // the second call on a connection: close without a reply
		}
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	g := runGateway(t, time.Hour, dp)
	url := "http://" + g.Addr() + "/function/f"
	calls := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}

	for i, want := range []int{http.StatusOK, http.StatusOK} {
		if r := call(t, http.MethodGet, url, "", ""); r.code != want || r.raw != "ok" {
			t.Fatalf("GET %d: %d %q, want %d", i, r.code, r.raw, want)
		}
	}
	// The second GET met the closed connection and was sent again.
	if got := calls(); len(got) != 3 {
		t.Fatalf("data plane saw %v, want 3 GETs", got)
	}
	// The connection of that retry is pooled, and the data plane closes it
	// on this POST, after reading it.
	r := call(t, http.MethodPost, url, "", "once")
	if r.code != http.StatusBadGateway || !strings.Contains(r.raw, reasonDataPlaneFailed) || r.dataplane != dp.addr {
		t.Fatalf("POST on a connection closed after it was sent: %d via %q %s, want 502 %s", r.code, r.dataplane, r.raw, reasonDataPlaneFailed)
	}
	if got := calls(); len(got) != 4 || got[3] != http.MethodPost {
		t.Fatalf("data plane saw %v, want the POST once", got)
	}
}

// A chunked reply goes out as its pieces come, and its trailers follow.
func TestChunkedReplyWithTrailersRelayed(t *testing.T) {
	release := make(chan struct{})
	dp := handlerDP(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Checksum")
		_, _ = io.WriteString(w, "first,")
		http.NewResponseController(w).Flush()
		<-release
		_, _ = io.WriteString(w, "second")
		w.Header().Set("X-Checksum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
	})
	g := runGateway(t, time.Hour, dp)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Addr()+"/function/f", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("first,"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first," {
		close(release)
		t.Fatalf("first piece before the rest was written: %q %v", first, err)
	}
	close(release)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "second" {
		t.Fatalf("rest: %q %v", rest, err)
	}
	if resp.ContentLength != -1 || resp.Header.Get("X-Brisk-Dataplane") != dp.addr {
		t.Errorf("length %d, X-Brisk-Dataplane %q", resp.ContentLength, resp.Header.Get("X-Brisk-Dataplane"))
	}
	if got, late := resp.Trailer.Get("X-Checksum"), resp.Trailer.Get("X-Late"); got != "abc" || late != "undeclared" {
		t.Errorf("trailers %v, want X-Checksum: abc and X-Late: undeclared", resp.Trailer)
	}
}

// A reply the data plane breaks off shows as a broken reply, not a hang nor
// a complete one, and counts as a 502.
func TestReplyCutOffMidBody(t *testing.T) {
	dp := rawDP(t, func(bw *bufio.Writer, r *http.Request, _ int) bool {
		if r.URL.Path == "/function/f/chunked" {
			bw.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		} else {
			bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this")
		}
		return false
	})
	g := runGateway(t, time.Hour, dp)
	client := &http.Client{Timeout: 10 * time.Second}
	// A small reply of known length is read whole before its status goes
	// out: its break gets a 502 that says so.
	resp, err := client.Get("http://" + g.Addr() + "/function/f")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 502 || resp.Header.Get("X-Brisk-Error") != reasonDataPlaneFailed || !strings.Contains(string(b), "reply broken off") {
		t.Fatalf("short reply: %d %q %q; want 502 dataplane-failed, reply broken off", resp.StatusCode, resp.Header.Get("X-Brisk-Error"), b)
	}
	// A streamed one has sent its status already: the client sees it cut.
	resp, err = client.Get("http://" + g.Addr() + "/function/f/chunked")
	if err == nil {
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil || strings.Contains(err.Error(), "Client.Timeout") {
		t.Fatalf("chunked: read %q, err %v; want the reply cut off", b, err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(metricsOf(t, g), fmt.Sprintf(`brisk_gateway_requests_total{code="502",dataplane=%q} 2`, dp.addr))
	}, "two 502s counted")
}

// Interim replies reach the client before the final one.
func TestInterimRepliesRelayed(t *testing.T) {
	dp := handlerDP(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "done")
	})
	g := runGateway(t, time.Hour, dp)
	var got []string
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		got = append(got, fmt.Sprintf("%d %s", code, h.Get("Link")))
		return nil
	}}
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, "http://"+g.Addr()+"/function/f", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "done" || resp.Header.Get("Link") != "" {
		t.Fatalf("final reply: %d %q Link %q", resp.StatusCode, b, resp.Header.Get("Link"))
	}
	if len(got) != 1 || got[0] != "103 </style.css>; rel=preload" {
		t.Fatalf("interim replies %q, want one 103 with its Link", got)
	}
}

// A client that leaves mid-call closes the gateway's connection to the data
// plane (which ends the call there and frees its slot), and is counted as
// a 499.
func TestClientLeavingFreesUpstreamConnection(t *testing.T) {
	arrived, freed := make(chan struct{}), make(chan struct{})
	dp := handlerDP(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done() // the gateway closed the connection
		close(freed)
	})
	g := runGateway(t, time.Hour, dp)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Addr()+"/function/f", nil)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-arrived:
	case err := <-done:
		t.Fatalf("call ended before it reached the data plane: %v", err)
	}
	cancel()
	select {
	case <-freed:
	case <-time.After(10 * time.Second):
		t.Fatal("the data plane's connection stayed open after the client left")
	}
	<-done
	testutil.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(metricsOf(t, g), fmt.Sprintf(`brisk_gateway_requests_total{code="499",dataplane=%q} 1`, dp.addr))
	}, "the call counted as 499")
}

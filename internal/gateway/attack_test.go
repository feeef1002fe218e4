package gateway

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// A malformed chunked body is the client's error: one 400 (not a 502
// blaming the data plane), and the connection closes.
func TestInvalidChunkSizeIsTheClientsError(t *testing.T) {
	dp := newFakeDP(t, "dp-a")
	g := runGateway(t, time.Hour, dp)
	raw := testutil.RawExchange(t, g.Addr(), "POST /function/f HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"+
		"GET /function/f/next HTTP/1.1\r\nHost: x\r\n\r\n")
	if n := strings.Count(raw, "HTTP/1.1 "); n != 1 {
		t.Fatalf("%d responses, want 1:\n%s", n, raw)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(raw)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || resp.Header.Get("X-Brisk-Error") != "bad-request" {
		t.Fatalf("status %d X-Brisk-Error %q, want 400 bad-request:\n%s", resp.StatusCode, resp.Header.Get("X-Brisk-Error"), raw)
	}
}

// Content-Length beside Transfer-Encoding: the request is served by its
// chunked framing and the connection closes after the reply, so the bytes
// a front proxy counted into its body never run as a request.
func TestContentLengthWithChunkedClosesTheConnection(t *testing.T) {
	dp := newFakeDP(t, "dp-a")
	g := runGateway(t, time.Hour, dp)
	smuggled := "GET /function/f/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	raw := testutil.RawExchange(t, g.Addr(), "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n"+
		"POST /function/f HTTP/1.1\r\nHost: x\r\nContent-Length: "+strconv.Itoa(5+len(smuggled))+
		"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+smuggled)
	if n := strings.Count(raw, "HTTP/1.1 200"); n != 2 || strings.Contains(raw, "/smuggled") {
		t.Fatalf("want 2 answers and no smuggled call:\n%s", raw)
	}
	if n := dp.hitCount(); n != 2 {
		t.Fatalf("the data plane saw %d calls, want 2", n)
	}
}

// The gateway's /metrics asks for its metrics token when it has one, and
// otherwise answers only clients on this host.
func TestMetricsAccess(t *testing.T) {
	dp := newFakeDP(t, "dp-a")
	g := runGateway(t, time.Hour, dp)
	get := func(g *Gateway, authz string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+g.Addr()+"/metrics", nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(g, ""); code != 200 {
		t.Fatalf("loopback client, no token configured: %d", code)
	}
	r := &http.Request{RemoteAddr: "10.1.2.3:4444", Header: http.Header{}}
	if g.metricsAllowed(r) {
		t.Fatal("a remote client read /metrics without a token")
	}
	g.cfg.MetricsToken = "s3cret"
	if code := get(g, ""); code != http.StatusForbidden {
		t.Fatalf("without the token: %d, want 403", code)
	}
	if code := get(g, "Bearer wrong"); code != http.StatusForbidden {
		t.Fatalf("a wrong token: %d, want 403", code)
	}
	if code := get(g, "Bearer s3cret"); code != 200 {
		t.Fatalf("the token: %d, want 200", code)
	}
}

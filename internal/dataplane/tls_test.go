package dataplane

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/brisk-faas/brisk/internal/pki"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// testTLS makes a CA and a listener certificate from it for 127.0.0.1,
// and returns the server's TLS configuration and a client's trusting the CA.
func testTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	ca, err := pki.CreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dns, ips := pki.HostSANs("127.0.0.1:0", nil)
	cert, err := ca.IssueListener("test", dns, ips)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return pki.ListenerTLS(cert), &tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}}
}

func tlsClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

// Calls over HTTPS reach the function, on the front end's path and on the
// net/http server's (a chunked body), and HTTP/2 is not negotiated.
func TestTLSCalls(t *testing.T) {
	srvTLS, cliTLS := testTLS(t)
	d, front := newTestDP(t, func(c *Config) { c.TLS = srvTLS })
	deploy(d, "f", newSandbox(t, echo))
	cl := tlsClient(cliTLS)

	resp, err := cl.Get(front.URL + "/function/f/a?b=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("front-end path: %d %s %+v: %s", resp.StatusCode, resp.Proto, resp.TLS, b)
	}
	s := decodeSeen(t, result{code: 200, body: string(b)})
	if s.Path != "/a" || s.XFProto != "https" {
		t.Errorf("front-end path: the sandbox saw %+v", s)
	}
	if n := promtest.ToFloat64(d.prom.handedOff); n != 0 {
		t.Errorf("the plain GET was handed off (%g): want the front end's path", n)
	}

	// A body of unknown length goes chunked: the front end hands it over.
	pr, pw := io.Pipe()
	go func() { _, _ = io.WriteString(pw, "hello"); pw.Close() }()
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/function/f/chunked", pr)
	resp, err = cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chunked: %d: %s", resp.StatusCode, b)
	}
	if s := decodeSeen(t, result{code: 200, body: string(b)}); s.Path != "/chunked" || s.XFProto != "https" {
		t.Errorf("chunked: the sandbox saw %+v", s)
	}
	if got := promtest.ToFloat64(d.prom.handedOff); got < 1 {
		t.Errorf("the chunked call was not handed to net/http (%g hand-offs)", got)
	}
}

// h2c's prior-knowledge preface inside TLS is not HTTP/2: the net/http
// server behind the front end answers it as a bad HTTP/1.1 request.
func TestTLSNoH2C(t *testing.T) {
	srvTLS, cliTLS := testTLS(t)
	d, front := newTestDP(t, func(c *Config) { c.TLS = srvTLS })
	deploy(d, "f", newSandbox(t, echo))
	cfg := cliTLS.Clone()
	cfg.NextProtos = nil
	c, err := tls.Dial("tcp", strings.TrimPrefix(front.URL, "https://"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return // closed: not served either
	}
	if !strings.HasPrefix(line, "HTTP/1.1 4") && !strings.HasPrefix(line, "HTTP/1.1 5") {
		t.Fatalf("h2c preface over TLS answered %q", line)
	}
}

// Plain HTTP to the TLS port gets a 400 saying so, and the connection is
// closed at once.
func TestTLSPlainHTTPFails(t *testing.T) {
	srvTLS, _ := testTLS(t)
	_, front := newTestDP(t, func(c *Config) { c.TLS = srvTLS })
	start := time.Now()
	got := testutil.RawExchange(t, strings.TrimPrefix(front.URL, "https://"), "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.0 400 Bad Request") || !strings.Contains(got, "HTTPS server") {
		t.Errorf("plain HTTP got %q", got)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("closed after %s", el)
	}
}

// A client that opens TCP and never sends a ClientHello, or stops in the
// middle of one, is closed within the header timeout (the reaper's), and
// the connection is no longer counted.
func TestTLSHandshakeTimeout(t *testing.T) {
	const limit = 150 * time.Millisecond
	srvTLS, _ := testTLS(t)
	_, front := newTestDP(t, func(c *Config) { c.TLS = srvTLS; c.ReadHeaderTimeout = limit })
	addr := strings.TrimPrefix(front.URL, "https://")
	// The first bytes of a ClientHello record: a handshake record of 512 bytes.
	for _, tc := range []struct{ name, raw string }{{"silent", ""}, {"half a ClientHello", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"}} {
		start := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, tc.raw)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadAll(c)
		el := time.Since(start)
		c.Close()
		if err != nil {
			t.Fatalf("%s: not closed: %v", tc.name, err)
		}
		if el < limit || el > limit+2*time.Second {
			t.Errorf("%s: closed after %s; the header timeout is %s", tc.name, el, limit)
		}
	}
	waitFor(t, "the connections to be released", func() bool { return front.front.Open() == 0 })
}

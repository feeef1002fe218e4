package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/testutil"
)

// Over HTTPS the gateway relays calls (HTTP/1.1 only, X-Forwarded-Proto
// https, bodies of known and unknown length); plain HTTP to its port gets
// a 400.
func TestTLSRelays(t *testing.T) {
	ca, err := pki.CreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dns, ips := pki.HostSANs("127.0.0.1:0", nil)
	cert, err := ca.IssueListener("gateway", dns, ips)
	if err != nil {
		t.Fatal(err)
	}
	dp := handlerDP(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Saw-Proto", r.Header.Get("X-Forwarded-Proto"))
		_, _ = io.WriteString(w, r.URL.Path+" "+string(b))
	})
	g := runGatewayWith(t, func(c *Config) { c.TLS = pki.ListenerTLS(cert) }, 50*time.Millisecond, dp)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	testutil.Eventually(t, 10*time.Second, func() bool {
		resp, err := cl.Get("https://" + g.Addr() + "/function/f/x")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "a call over HTTPS to succeed")
	for _, body := range []io.Reader{strings.NewReader("known"), io.MultiReader(strings.NewReader("unknown"))} {
		resp, err := cl.Post("https://"+g.Addr()+"/function/f/x", "text/plain", body)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.ProtoMajor != 1 || resp.Header.Get("X-Saw-Proto") != "https" || !strings.HasPrefix(string(b), "/function/f/x ") {
			t.Errorf("%d %s, X-Forwarded-Proto %q: %q", resp.StatusCode, resp.Proto, resp.Header.Get("X-Saw-Proto"), b)
		}
	}
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.0 400 Bad Request") {
		t.Errorf("plain HTTP to the TLS port: %q", b)
	}
}

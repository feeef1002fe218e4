package e2e

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// brisk up --tls-generate serves the admin API and the invoke listener
// over HTTPS with certificates of the cluster CA; the CLI trusts the CA
// with --ca-cert or BRISK_CA_CERT, and fails without it.
func TestTLSListenersWithGeneratedCertificate(t *testing.T) {
	c := newCluster(t)
	// The CA exists before the first start, so the test can trust it.
	c.mustBrisk(t, "ca", "init", "--data-dir", c.dataDir)
	caFile := filepath.Join(c.dataDir, "ca.crt")
	c.useTLS(t, caFile)
	p := c.up(t, "--tls-generate")
	eventually(t, 10*time.Second, "the https URLs printed", func() bool {
		out := p.out.String()
		return strings.Contains(out, "admin https://"+c.admin) && strings.Contains(out, "invoke https://"+c.invokeAddr)
	})

	c.mustBrisk(t, "--ca-cert", caFile, "fn", "deploy", "hello", "--builtin", "trace")
	if out := c.mustBrisk(t, "--ca-cert", caFile, "invoke", "hello", "--data", `{"ms": 1}`); !strings.Contains(out, `"Status":"OK"`) {
		t.Fatalf("invoke over https: %s", out)
	}
	// The SDK, the same way.
	if inv := c.invoke(t, "hello", `{"ms": 1}`); inv.status != http.StatusOK {
		t.Fatalf("invoke over https from the SDK: %d %s", inv.status, inv.body)
	}
	if _, err := c.cl.List(context.Background()); err != nil {
		t.Fatalf("list over https from the SDK: %v", err)
	}

	// BRISK_CA_CERT instead of the flag.
	c.caEnv = []string{"BRISK_CA_CERT=" + caFile}
	if out := c.mustBrisk(t, "fn", "list"); !strings.Contains(out, "hello") {
		t.Fatalf("fn list with BRISK_CA_CERT: %s", out)
	}
	// Without the CA the certificate is not trusted.
	c.caEnv = nil
	if out, code := c.brisk(t, "fn", "list"); code == 0 || !strings.Contains(out, "certificate") {
		t.Fatalf("fn list without the CA: exit %d: %s", code, out)
	}
	// Plain HTTP to the TLS ports is refused with a 400.
	for _, addr := range []string{c.admin, c.invokeAddr} {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("plain HTTP to %s: %s", addr, resp.Status)
			}
		}
	}
}

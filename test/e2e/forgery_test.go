package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A web page cannot drive brisk through its user's browser, even without
// tokens (--insecure-no-auth): a cross-origin deploy (the attack: fetch
// with text/plain, which needs no preflight) is refused on the admin API
// and on the data plane's OpenFaaS API, as is a request addressed by a
// name that a page could rebind; the CLI's requests still work.
func TestBrowserForgeryRefused(t *testing.T) {
	c := newCluster(t)
	c.up(t, "--insecure-no-auth")
	deploy := `{"name":"planted","command":["/bin/sh","-c","id"]}`
	send := func(url, host, origin, ctype string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(deploy))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		req.Header.Set("Content-Type", ctype)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	admin, system := "http://"+c.admin+"/v1/functions", "http://"+c.invokeAddr+"/system/functions"
	for _, tc := range []struct {
		name, url, host, origin, ctype string
		want                           int
	}{
		{"admin: a page's text/plain", admin, "", "http://evil.example", "text/plain;charset=UTF-8", http.StatusForbidden},
		{"admin: text/plain without Origin", admin, "", "", "text/plain", http.StatusUnsupportedMediaType},
		{"admin: a rebound name", admin, "evil.example", "http://evil.example", "application/json", http.StatusForbidden},
		{"openfaas: a page's text/plain", system, "", "http://evil.example", "text/plain", http.StatusForbidden},
		{"openfaas: a rebound name", system, "evil.example", "", "application/json", http.StatusForbidden},
	} {
		if got, body := send(tc.url, tc.host, tc.origin, tc.ctype); got != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, got, body, tc.want)
		}
	}
	if out := c.mustBrisk(t, "fn", "list"); strings.Contains(out, "planted") {
		t.Fatalf("a forged request deployed a function:\n%s", out)
	}
	c.mustBrisk(t, "fn", "deploy", "mine", "--builtin", "trace")
}

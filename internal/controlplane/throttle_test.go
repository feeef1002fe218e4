package controlplane

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/controlplane/admin"
)

// Failed authentications are throttled per client address and token id
// (issue 36: failed tokens were not throttled): past 20, a guess at one
// token's secret is refused unchecked, while the other tokens used from
// that address, and other clients a follower replica forwards, go on.
func TestFailedAuthenticationsAreThrottled(t *testing.T) {
	e := newEnv(t, envOpts{config: func(c *Config) {
		c.TrustedProxies = []string{"10.0.0.9", "localhost"} // a replica by address, one by name (Kubernetes')
	}})
	tok, err := admin.ReadAdminToken(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	h := e.cp.admin.Handler()
	do := func(from, xff, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v1/functions", nil)
		req.RemoteAddr = from + ":40000"
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	guess := "brisk_0123456789abcdef_" + strings.Repeat("0", 32) // an id, a wrong secret
	for i := range 20 {
		if r := do("192.0.2.1", "", guess); r.Code != http.StatusUnauthorized || strings.Contains(r.Body.String(), "too many") {
			t.Fatalf("guess %d: %d %s, want a checked 401", i+1, r.Code, r.Body)
		}
	}
	r := do("192.0.2.1", "", guess)
	if r.Code != http.StatusUnauthorized || !strings.Contains(r.Body.String(), "too many failed authentications") || r.Header().Get("Retry-After") == "" {
		t.Fatalf("guess 21: %d %q Retry-After %q, want 401 refused unchecked with Retry-After", r.Code, r.Body, r.Header().Get("Retry-After"))
	}
	if r := do("192.0.2.1", "", tok); r.Code != http.StatusOK {
		t.Fatalf("another token from the guesser's address: %d %s", r.Code, r.Body)
	}
	if r := do("192.0.2.2", "", guess); strings.Contains(r.Body.String(), "too many") {
		t.Fatalf("another address is throttled: %s", r.Body)
	}
	// Behind a follower replica each client counts alone; a client that is
	// not a replica cannot pick its bucket with X-Forwarded-For.
	for i := range 20 {
		do("10.0.0.9", "198.51.100.1", guess)
		do("192.0.2.3", "198.51.100."+string(rune('a'+i)), guess)
	}
	if r := do("10.0.0.9", "198.51.100.2", guess); strings.Contains(r.Body.String(), "too many") {
		t.Fatalf("a second client behind the follower is throttled: %s", r.Body)
	}
	if r := do("10.0.0.9", "198.51.100.1", guess); !strings.Contains(r.Body.String(), "too many") {
		t.Fatalf("the guesser behind the follower is not throttled: %s", r.Body)
	}
	for range 21 {
		do("127.0.0.1", "198.51.100.7", guess)
	}
	if r := do("127.0.0.1", "198.51.100.8", guess); strings.Contains(r.Body.String(), "too many") {
		t.Fatalf("a second client behind the replica named localhost is throttled: %s", r.Body)
	}
	if r := do("192.0.2.3", "198.51.100.99", guess); !strings.Contains(r.Body.String(), "too many") {
		t.Fatalf("X-Forwarded-For from a non-replica evaded the throttle: %s", r.Body)
	}
}

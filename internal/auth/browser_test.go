package auth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestForged(t *testing.T) {
	for _, tc := range []struct {
		name, method, host, origin, ctype string
		hostCheck                         bool
		want                              int
	}{
		{"a client", "POST", "127.0.0.1:9090", "", "application/json", true, 0},
		{"no body type", "POST", "127.0.0.1:9090", "", "", true, 0},
		{"the dashboard itself", "POST", "127.0.0.1:9090", "http://127.0.0.1:9090", "application/json", true, 0},
		{"another origin", "POST", "127.0.0.1:9090", "http://evil.example", "application/json", false, http.StatusForbidden},
		{"another port", "GET", "127.0.0.1:9090", "http://127.0.0.1:8000", "", false, http.StatusForbidden},
		{"a sandboxed frame", "POST", "127.0.0.1:9090", "null", "", false, http.StatusForbidden},
		{"text/plain", "POST", "127.0.0.1:9090", "", "text/plain;charset=UTF-8", false, http.StatusUnsupportedMediaType},
		{"a form", "PUT", "127.0.0.1:9090", "", "application/x-www-form-urlencoded", false, http.StatusUnsupportedMediaType},
		{"multipart", "POST", "127.0.0.1:9090", "", "multipart/form-data; boundary=x", false, http.StatusUnsupportedMediaType},
		{"a GET's type does not matter", "GET", "127.0.0.1:9090", "", "text/plain", false, 0},
		{"a rebound name without tokens", "POST", "evil.example:9090", "http://evil.example:9090", "application/json", true, http.StatusForbidden},
		{"a name with tokens", "POST", "brisk.example:9090", "", "application/json", false, 0},
		{"localhost without tokens", "GET", "localhost:9090", "", "", true, 0},
		{"IPv6 without tokens", "GET", "[::1]:9090", "", "", true, 0},
	} {
		r := httptest.NewRequest(tc.method, "/v1/functions", strings.NewReader("{}"))
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.ctype != "" {
			r.Header.Set("Content-Type", tc.ctype)
		}
		if got, why := Forged(r, tc.hostCheck); got != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.name, got, why, tc.want)
		}
	}
}

package auth

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// Forged reports why r, a request to a management API (brisk's admin API,
// the OpenFaaS one), looks sent by a web page on behalf of a browser's
// user, and so is refused: a page of another origin (its Origin is not the
// request's own host), a body of a type a page may send without asking
// (CORS' "simple" types: text/plain, form data), or, when hostCheck is set
// (the API runs without tokens: nothing else stops a page), a Host that is
// a name other than localhost, which a page gets by rebinding its own name
// to the API's address. Clients that are not browsers send none of these.
// It returns the status to answer (403, or 415 for the type) and why, or
// 0 for a request to serve.
func Forged(r *http.Request, hostCheck bool) (int, string) {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if o == "null" || err != nil || !strings.EqualFold(u.Host, r.Host) {
			return http.StatusForbidden, fmt.Sprintf("cross-origin request refused (Origin %q, Host %q): web pages may not call this API", o, r.Host)
		}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if ct := r.Header.Get("Content-Type"); ct != "" {
			mt, _, err := mime.ParseMediaType(ct)
			if err != nil || mt == "text/plain" || mt == "application/x-www-form-urlencoded" || mt == "multipart/form-data" {
				return http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q refused: send JSON (application/json)", ct)
			}
		}
	}
	if hostCheck {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if _, err := netip.ParseAddr(host); err != nil && !strings.EqualFold(host, "localhost") {
			return http.StatusForbidden, fmt.Sprintf("Host %q refused: without tokens (--insecure-no-auth) this API answers only requests addressed to an IP address or localhost (a web page could rebind a name to it)", r.Host)
		}
	}
	return 0, ""
}

// RefuseForged wraps next: requests Forged refuses are answered by
// writeError with its status and reason.
func RefuseForged(next http.Handler, hostCheck bool, writeError func(w http.ResponseWriter, status int, msg string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, why := Forged(r, hostCheck); status != 0 {
			writeError(w, status, why)
			return
		}
		next.ServeHTTP(w, r)
	})
}

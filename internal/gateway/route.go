package gateway

import (
	"net/http"
	"strconv"
	"strings"
)

// The routing rules are the data plane's (internal/dataplane/proxy.go), so
// the gateway hashes on exactly the name the data plane will route by;
// TestRoutingAgreesWithDataPlane holds the two together.

const functionPrefix = "/function/"

// functionOf returns the function a request names: OpenFaaS-style
// /function/NAME[/rest] first, else the first label of the Host (Knative:
// NAME.namespace.example.com, NAME:8080). byPath says which rule applied.
func functionOf(r *http.Request) (name string, byPath bool) {
	if tail, ok := strings.CutPrefix(r.URL.Path, functionPrefix); ok {
		if i := strings.IndexByte(tail, '/'); i >= 0 {
			tail = tail[:i]
		}
		return tail, true
	}
	return hostLabel(r.Host), false
}

// hostLabel returns the first DNS label of a Host header, lower-cased.
func hostLabel(h string) string {
	if i := strings.IndexAny(h, ".:"); i >= 0 {
		h = h[:i]
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(h)
		}
	}
	return h
}

// namesFunction reports whether a Host label could be a function name rather
// than an IP address or localhost. The data plane asks this only to word its
// 404, since it knows its functions; the gateway does not, so it serves
// /healthz and /metrics itself, and answers 404, for requests whose Host
// fails this test.
func namesFunction(label string) bool {
	if label == "" || label == "localhost" || strings.HasPrefix(label, "[") {
		return false
	}
	_, err := strconv.Atoi(label)
	return err != nil
}

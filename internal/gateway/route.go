package gateway

import (
	"net/http"
	"strings"

	"github.com/brisk-faas/brisk/internal/naming"
)

// The routing rules are the data plane's (internal/dataplane/proxy.go), so
// the gateway hashes on exactly the name the data plane will route by;
// TestRoutingAgreesWithDataPlane holds the two together.

const functionPrefix = naming.FunctionPrefix

// functionOf returns the function a request names: OpenFaaS-style
// /function/NAME[/rest] first, else the first label of the Host (Knative:
// NAME.namespace.example.com, NAME:8080). byPath says which rule applied.
func functionOf(r *http.Request) (name string, byPath bool) {
	tail, ok := strings.CutPrefix(r.URL.Path, functionPrefix)
	if !ok {
		tail, ok = strings.CutPrefix(r.URL.Path, naming.AsyncPrefix)
	}
	if ok {
		if i := strings.IndexByte(tail, '/'); i >= 0 {
			tail = tail[:i]
		}
		return naming.PathName(tail), true
	}
	return naming.HostLabel(r.Host), false
}

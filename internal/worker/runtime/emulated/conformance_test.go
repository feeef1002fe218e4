package emulated

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The emulated runtime passes the conformance suite, within what it is:
// its sandboxes share the host's address (requests name theirs in
// HeaderSandbox), never end on their own (no failing function), and a
// Runtime lists only the sandboxes it created, so a "restarted" one finds
// none. What it holds is its host's sandbox table.
func TestConformance(t *testing.T) {
	var mu sync.Mutex
	hosts := map[string]*Host{} // by state directory: one host per runtime
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, stateDir string) runtime.Runtime {
			h := runHost(t)
			mu.Lock()
			hosts[stateDir] = h
			mu.Unlock()
			return h.Runtime("node-conformance", 0)
		},
		Function: func(*testing.T) *spec.Function { return fn },
		Leaks: func(t *testing.T, stateDir string) []string {
			mu.Lock()
			h := hosts[stateDir]
			mu.Unlock()
			var out []string
			h.sandboxes.Range(func(id, _ any) bool {
				if s := id.(string); strings.HasPrefix(s, runtimetest.IDPrefix) {
					out = append(out, "host table entry "+s)
				}
				return true
			})
			return out
		},
		Route:      func(req *http.Request, id string) { req.Header.Set(HeaderSandbox, id) },
		SharedAddr: true,
	})
}

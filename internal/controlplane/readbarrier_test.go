package controlplane

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/pkg/api"
)

// On a raft replica every registry read first confirms leadership: a
// replica that no longer leads answers 503 (retry), not its stale state;
// writes, /healthz and /metrics are not held back by the check.
func TestReadsConfirmLeadership(t *testing.T) {
	var verified atomic.Int32
	var leads atomic.Bool
	leads.Store(true)
	e := newEnv(t, envOpts{config: func(c *Config) {
		c.VerifyLeader = func() error {
			verified.Add(1)
			if !leads.Load() {
				return errors.New("node is not the leader")
			}
			return nil
		}
	}})
	tok, err := admin.ReadAdminToken(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	verified.Store(0)
	h := e.cp.admin.Handler()
	var notForwarded string
	do := func(method, path, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		notForwarded = rec.Header().Get(api.HeaderNotForwarded)
		return rec.Code
	}
	if code := do(http.MethodGet, "/v1/functions", ""); code != http.StatusOK || verified.Load() != 1 {
		t.Fatalf("a read while leading: %d, %d checks; want 200 after one", code, verified.Load())
	}
	leads.Store(false)
	for _, path := range []string{"/v1/functions", "/v1/status", "/v1/namespaces", "/v1/triggers"} {
		// Marked as acting on nothing: a client may try another replica.
		if code := do(http.MethodGet, path, ""); code != http.StatusServiceUnavailable || notForwarded == "" {
			t.Errorf("GET %s after leadership was lost: %d (%s %q), want 503 marked", path, code, api.HeaderNotForwarded, notForwarded)
		}
	}
	before := verified.Load()
	if code := do(http.MethodGet, "/healthz", ""); code != http.StatusOK || verified.Load() != before {
		t.Errorf("/healthz: %d, %d checks; want 200 without one", code, verified.Load()-before)
	}
	if code := do(http.MethodPost, "/v1/functions", `{"name":"w","builtin":"trace"}`); code == http.StatusServiceUnavailable || verified.Load() != before {
		t.Errorf("a write: %d, %d read checks; want it to go to the registry unchecked", code, verified.Load()-before)
	}
}

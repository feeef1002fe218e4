package controlplane

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/api"
)

// A namespace's egress policy is set through the admin API (checked; kept
// when a later update leaves it out; removed by {}), and every worker gets
// the complete set: at once on a change, and first thing in each session,
// before any create.
func TestNamespaceEgressReachesWorkers(t *testing.T) {
	e := newEnv(t, envOpts{})
	h := e.cp.admin.Handler()
	tok, err := admin.ReadAdminToken(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, body string) *httptest.ResponseRecorder {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, bad := range []string{
		`{"egress":{"allow":[{"cidr":"10.0.0.0/33"}]}}`,
		`{"egress":{"deny":[{"cidr":"fd00::/8"}]}}`,
		`{"egress":{"allow":[{"cidr":"10.0.0.0/8","ports":["0"]}]}}`,
		`{"egress":{"allow":[{"cidr":"10.0.0.0/8","ports":["90-80"]}]}}`,
		`{"egress":{"allow":[{"cidr":"10.0.0.0/8","protocol":"icmp","ports":["1"]}]}}`,
		`{"egress":{"allow":[{"cidr":"10.0.0.0/8","protocol":"tcp"}]}}`,
		`{"egress":{"allow":[{"cidr":"10.0.0.0/8","port":["80"]}]}}`,
	} {
		if rec := do(http.MethodPut, "/v1/namespaces/team", bad); rec.Code != http.StatusBadRequest {
			t.Errorf("PUT %s: %d %s, want 400", bad, rec.Code, rec.Body)
		}
	}
	rt := e.workers[e.nodeIDs[0]].rt
	egressEvents := func() []string {
		var out []string
		for _, ev := range rt.Events() {
			if ev.op == "egress" {
				out = append(out, ev.id)
			}
		}
		return out
	}
	if rec := do(http.MethodPut, "/v1/namespaces/team", `{"egress":{"allow":[{"cidr":"10.1.0.0/16","ports":["443"]}],"deny":[{"cidr":"10.1.2.3"}]}}`); rec.Code != http.StatusOK {
		t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
	}
	testutil.Eventually(t, wait, func() bool {
		ev := egressEvents()
		return len(ev) > 0 && ev[len(ev)-1] == "team:1/1"
	}, "the worker gets the policy")
	// A quota update without egress keeps it.
	if rec := do(http.MethodPut, "/v1/namespaces/team", `{"quota":{"max_functions":3}}`); rec.Code != http.StatusOK {
		t.Fatalf("PUT quota: %d %s", rec.Code, rec.Body)
	}
	rec := do(http.MethodGet, "/v1/namespaces/team", "")
	var v api.NamespaceView
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || len(v.Egress.Allow) != 1 || v.Egress.Deny[0].CIDR != "10.1.2.3" || v.Quota.MaxFunctions != 3 {
		t.Fatalf("GET after a quota update: %s (%v)", rec.Body, err)
	}

	// An egress-only update keeps the quota.
	if rec := do(http.MethodPut, "/v1/namespaces/team", `{"egress":{"deny":[{"cidr":"10.9.0.0/16"}]}}`); rec.Code != http.StatusOK {
		t.Fatalf("PUT egress: %d %s", rec.Code, rec.Body)
	}
	rec = do(http.MethodGet, "/v1/namespaces/team", "")
	v = api.NamespaceView{}
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || v.Quota.MaxFunctions != 3 || len(v.Egress.Deny) != 1 || len(v.Egress.Allow) != 0 {
		t.Fatalf("GET after an egress update: %s (%v)", rec.Body, err)
	}
	testutil.Eventually(t, wait, func() bool {
		ev := egressEvents()
		return len(ev) > 0 && ev[len(ev)-1] == "team:0/1"
	}, "the worker gets the new policy")

	// A restarted worker gets the set before the creates of its session.
	e.crashWorker(e.nodeIDs[0], false)
	e.restartWorker(e.nodeIDs[0])
	rt = e.workers[e.nodeIDs[0]].rt
	e.deploy("g", 1)
	e.awaitConverged("g", 1)
	evs := rt.Events()
	if len(evs) == 0 || evs[0].op != "egress" || evs[0].id != "team:0/1" {
		t.Fatalf("the restarted worker's runtime calls: %v, want the policies first", evs)
	}

	if rec := do(http.MethodPut, "/v1/namespaces/team", `{"egress":{}}`); rec.Code != http.StatusOK {
		t.Fatalf("PUT {}: %d %s", rec.Code, rec.Body)
	}
	testutil.Eventually(t, wait, func() bool {
		ev := egressEvents()
		return len(ev) > 0 && ev[len(ev)-1] == ""
	}, "the worker gets the policy's removal")
}

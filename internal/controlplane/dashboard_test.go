package controlplane

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/pkg/api"
)

func metric(fn string, requests int64, latency ...uint64) *briskv1.FunctionMetric {
	return &briskv1.FunctionMetric{Function: fn, Requests: requests, LatencyBuckets: latency}
}

func report(ms ...*briskv1.FunctionMetric) *briskv1.MetricsReport {
	return &briskv1.MetricsReport{DataPlaneId: "dp", Functions: ms}
}

// GET /v1/dashboard joins the table (nodes, functions, sandboxes by state)
// with the window's rates, latencies and failures, and needs a token; the
// page's files at /ui/ need none and carry strict headers.
func TestDashboardEndpoint(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.deploy("f", 2)
	ids := e.awaitConverged("f", 2)
	// A sandbox that dies on its own is a failure, with its node; its
	// replacement a third cold start.
	if err := e.workers["w0"].rt.evict(ids[0]); err != nil {
		t.Fatal(err)
	}
	e.awaitReplaced("f", ids[0])
	e.awaitConverged("f", 2)
	// One data plane's report: 20 calls, 10 of them ended within 1 ms
	// and 10 within 5 ms.
	e.cp.cluster.recordMetrics(report(metric("f", 20, 0, 10, 0, 10)))

	h := e.cp.admin.Handler()
	tok, err := admin.ReadAdminToken(e.dir)
	if err != nil || tok == "" {
		t.Fatalf("admin token: %q %v", tok, err)
	}
	get := func(path, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	rec := get("/v1/dashboard", tok)
	if rec.Code != http.StatusOK || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("GET /v1/dashboard: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	var v api.Dashboard
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.Sandboxes != (api.SandboxCounts{Ready: 2}) || len(v.Failures) != 1 {
		t.Fatalf("sandboxes %+v, failures %+v; want 2 ready, the eviction", v.Sandboxes, v.Failures)
	}
	if len(v.Nodes) != 1 || v.Nodes[0].Name != "w0" || v.Nodes[0].State != "ready" || v.Nodes[0].Sandboxes.Ready != 2 || v.Summary.NodesConnected != 1 {
		t.Fatalf("nodes %+v", v.Nodes)
	}
	if len(v.Functions) != 1 {
		t.Fatalf("functions %+v", v.Functions)
	}
	f := v.Functions[0]
	if f.Name != "f" || f.Namespace != "default" || f.Ready != 2 || f.Desired != 2 || f.Calls != 20 || f.CallsPerSecond <= 0 || f.Latency.Count != 20 {
		t.Fatalf("function %+v", f)
	}
	// The function's own status counts its calls (OpenFaaS's
	// invocationCount), in a get and a list.
	for _, path := range []string{"/v1/functions/f", "/v1/functions"} {
		rec := get(path, tok)
		var calls []uint64
		if path == "/v1/functions" {
			var vs []api.FunctionView
			_ = json.Unmarshal(rec.Body.Bytes(), &vs)
			for _, v := range vs {
				calls = append(calls, v.Status.Calls)
			}
		} else {
			var v api.FunctionView
			_ = json.Unmarshal(rec.Body.Bytes(), &v)
			calls = append(calls, v.Status.Calls)
		}
		if rec.Code != http.StatusOK || len(calls) != 1 || calls[0] != 20 {
			t.Errorf("GET %s: %d, calls %v; want 20", path, rec.Code, calls)
		}
	}
	if want := 0.001; !near(f.Latency.P50, want) || !near(f.Latency.P99, 0.0025+0.0025*9.8/10) {
		t.Fatalf("latency %+v, want p50 1 ms, p99 in (2.5 ms, 5 ms]", f.Latency)
	}
	if f.ColdStartsPerSecond <= 0 || v.Summary.ColdStartsTotal != 3 || v.Summary.CallsTotal != 20 {
		t.Fatalf("cold starts %v/s, %d in all (want 3: two, then the replacement); calls in all %d", f.ColdStartsPerSecond, v.Summary.ColdStartsTotal, v.Summary.CallsTotal)
	}
	if fl := v.Failures[0]; fl.Kind != "sandbox-failed" || fl.Function != "f" || fl.Node != "w0" || fl.Sandbox != ids[0] || !strings.Contains(fl.Reason, "out of memory") {
		t.Fatalf("failure %+v", fl)
	}
	if v.Summary.Functions != 1 || v.Summary.FunctionsFailing != 0 || v.WindowSeconds < 25 || v.WindowSeconds > 30 {
		t.Fatalf("summary %+v, window %v", v.Summary, v.WindowSeconds)
	}
	if rec := get("/v1/dashboard?limit=0", tok); rec.Code != http.StatusBadRequest {
		t.Fatalf("limit 0: %d", rec.Code)
	}

	// Without a token: the data is refused, the page is not.
	if rec := get("/v1/dashboard", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/dashboard without a token: %d", rec.Code)
	}
	for _, p := range []string{"/ui/../v1/dashboard", "/ui/%2e%2e/v1/dashboard", "/ui/..%2fv1/dashboard"} {
		if rec := get(p, ""); rec.Code == http.StatusOK {
			t.Fatalf("GET %s without a token: 200\n%s", p, rec.Body)
		}
	}
	// Paths that only clean to /ui are not the page: they get the token
	// check every route gets, before any handler reads a body.
	for _, p := range []string{"/v1/functions/..%2F..%2Fui", "/v1/secrets/..%2F..%2Fui/x"} {
		if rec := get(p, ""); rec.Code != http.StatusUnauthorized || rec.Header().Get("WWW-Authenticate") == "" {
			t.Fatalf("GET %s without a token: %d (WWW-Authenticate %q), want the outer 401", p, rec.Code, rec.Header().Get("WWW-Authenticate"))
		}
	}
	if rec := get("/ui", ""); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/ui/" {
		t.Fatalf("GET /ui: %d to %q, want a redirect to /ui/", rec.Code, rec.Header().Get("Location"))
	}
	for path, want := range map[string]string{"/ui/": "text/html", "/ui/app.js": "text/javascript", "/ui/style.css": "text/css"} {
		rec := get(path, "")
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), want) {
			t.Fatalf("GET %s: %d %q", path, rec.Code, rec.Header().Get("Content-Type"))
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || rec.Header().Get("X-Content-Type-Options") != "nosniff" || rec.Header().Get("Cache-Control") == "" {
			t.Fatalf("GET %s: headers %v", path, rec.Header())
		}
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("If-None-Match", rec.Header().Get("ETag"))
		again := httptest.NewRecorder()
		h.ServeHTTP(again, req)
		if again.Code != http.StatusNotModified {
			t.Fatalf("GET %s with its ETag: %d, want 304", path, again.Code)
		}
	}
	if rec := get("/ui/nope.js", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("GET /ui/nope.js: %d", rec.Code)
	}
	if body := get("/ui/", "").Body.String(); !strings.Contains(body, `id="functions-table"`) || strings.Contains(body, "<script>") {
		t.Fatal("the page has no functions table, or inline script")
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

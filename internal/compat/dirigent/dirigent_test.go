package dirigent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// admin records what the handler asks of brisk's admin API.
type admin struct {
	existing map[string]bool
	created  []*spec.Function
	updated  []string
	addrs    []string
}

func (a *admin) CreateFunction(r *http.Request, body []byte) (int, []byte) {
	f, err := spec.Decode(body)
	if err != nil {
		return http.StatusBadRequest, []byte(err.Error())
	}
	if a.existing[f.Name] {
		return http.StatusConflict, []byte(`{"error":"exists"}`)
	}
	a.created = append(a.created, f)
	return http.StatusCreated, body
}

func (a *admin) UpdateFunction(r *http.Request, name string, body []byte) (int, []byte) {
	a.updated = append(a.updated, name)
	return http.StatusOK, body
}

func (a *admin) GetFunction(r *http.Request, name string) (int, []byte) {
	if a.existing[name] {
		return http.StatusOK, []byte(`{}`)
	}
	return http.StatusNotFound, []byte(`{"error":"not found"}`)
}

func (a *admin) DataPlaneAddrs() ([]string, error) { return a.addrs, nil }

func post(h http.Handler, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// The loader's registration form becomes a spec: its image runs as the
// trace function unless told to keep it, its scaling bounds and requests
// carry over, a keep-alive makes it ttl, and the answer is exactly 200 with
// the data planes.
func TestRegistration(t *testing.T) {
	a := &admin{existing: map[string]bool{"old": true}, addrs: []string{"127.0.0.1:8080", "127.0.0.1:8081"}}
	h := Handler(a, Config{KeepAlive: 5 * time.Second})
	rec := post(h, url.Values{"name": {"f1"}, "image": {"example/empty:latest"}, "port_forwarding": {"80"},
		"scaling_upper_bound": {"3"}, "scaling_lower_bound": {"1"}, "requested_cpu": {"100"}, "requested_memory": {"64"},
		"env_vars": {"A=1 B=2"}})
	if rec.Code != http.StatusOK || rec.Body.String() != "127.0.0.1:8080;127.0.0.1:8081" {
		t.Fatalf("register: %d %q", rec.Code, rec.Body.String())
	}
	f := a.created[0]
	if f.Builtin != "trace" || f.Image != "" || f.Port != 0 || f.Scaling.Max != 3 || f.Scaling.Min != 1 ||
		f.Resources.MilliCPU != 100 || f.Resources.MemoryMB != 64 || f.Limits.MemoryMB != 64*10+64 || f.Env["A"] != "1" || f.Env["B"] != "2" ||
		f.Scaling.KeepAlivePolicy != spec.KeepAliveTTL || time.Duration(f.Scaling.StableWindow) != 5*time.Second || f.Auth != spec.AuthPublic {
		t.Fatalf("spec %+v", f)
	}
	// Registered before: the form replaces it.
	if rec := post(h, url.Values{"name": {"old"}}); rec.Code != http.StatusOK || len(a.updated) != 1 || a.updated[0] != "old" {
		t.Fatalf("re-registration: %d, updates %v", rec.Code, a.updated)
	}
	// Keep deploys the image itself.
	if rec := post(Handler(a, Config{Images: ImagesKeep}), url.Values{"name": {"f2"}, "image": {"example/app:1"}}); rec.Code != http.StatusOK {
		t.Fatalf("keep: %d %s", rec.Code, rec.Body)
	}
	if f := a.created[len(a.created)-1]; f.Image != "example/app:1" || f.Builtin != "" {
		t.Fatalf("keep: spec %+v", f)
	}
	for _, bad := range []url.Values{{}, {"name": {"x"}, "requested_cpu": {"-1"}}, {"name": {"x"}, "scaling_upper_bound": {"many"}}} {
		rec := post(h, bad)
		var e map[string]string
		if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil || !strings.Contains(e["error"], "registration form") {
			t.Errorf("%v: %d %s", bad, rec.Code, rec.Body)
		}
	}
	// No data plane yet: the loader must not count it registered.
	a.addrs = nil
	if rec := post(h, url.Values{"name": {"f3"}}); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("no data planes: %d", rec.Code)
	}
}

// TestRegisteredCallsWaitAsDirigents: Dirigent's data plane holds a call
// waiting for a cold start until its client gives up, so a registered
// function's calls wait as long as the operator lets any call wait; with
// no cap given, brisk's default applies.
func TestRegisteredCallsWaitAsDirigents(t *testing.T) {
	a := &admin{addrs: []string{"127.0.0.1:8080"}}
	if rec := post(Handler(a, Config{MaxQueueTimeout: 15 * time.Minute}), url.Values{"name": {"f"}}); rec.Code != http.StatusOK {
		t.Fatalf("register: %d %s", rec.Code, rec.Body)
	}
	if got := time.Duration(a.created[0].Queue.Timeout); got != 15*time.Minute {
		t.Fatalf("queue timeout %v, want the cap 15m", got)
	}
	if rec := post(Handler(a, Config{}), url.Values{"name": {"g"}}); rec.Code != http.StatusOK {
		t.Fatalf("register: %d %s", rec.Code, rec.Body)
	}
	if got := a.created[1].Queue.Timeout; got != 0 {
		t.Fatalf("queue timeout %v without a cap, want 0 (the default)", got)
	}
}

// TestRegisteredMemoryIsARequest: the loader registers a tenth of a
// function's peak memory and its calls ask for up to the peak, so the
// registered figure places the sandbox and the limit leaves room for the
// peak (a 7 MiB limit OOM-killed the loader's functions on the process
// runtime), within the operator's cap.
func TestRegisteredMemoryIsARequest(t *testing.T) {
	for _, c := range []struct {
		request, cap, limit int64
	}{
		{7, 0, 7*10 + 64},
		{7, 65536, 7*10 + 64},
		{2000, 0, 10240 + 64}, // the trace function's largest allocation
		{300, 1024, 1024},     // the cap
		{2000, 1024, 2000},    // never below the request (the cap check refuses it)
		{0, 0, 0},             // nothing registered: no limit either
	} {
		a := &admin{addrs: []string{"127.0.0.1:8080"}}
		form := url.Values{"name": {"f"}}
		if c.request > 0 {
			form.Set("requested_memory", strconv.FormatInt(c.request, 10))
		}
		if rec := post(Handler(a, Config{MaxMemoryMB: c.cap}), form); rec.Code != http.StatusOK {
			t.Fatalf("%+v: %d %s", c, rec.Code, rec.Body)
		}
		if f := a.created[0]; f.Resources.MemoryMB != c.request || f.Limits.MemoryMB != c.limit {
			t.Errorf("request %d, cap %d: resources %d, limit %d; want limit %d", c.request, c.cap, f.Resources.MemoryMB, f.Limits.MemoryMB, c.limit)
		}
	}
}

func TestCheckAndOtherPaths(t *testing.T) {
	h := Handler(&admin{existing: map[string]bool{"f": true}}, Config{})
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/check?name=f", http.StatusOK},
		{http.MethodGet, "/check?name=g", http.StatusNotFound},
		{http.MethodPost, "/workflow", http.StatusNotImplemented},
		{http.MethodGet, "/healthz", http.StatusOK},
		{http.MethodDelete, "/x", http.StatusMethodNotAllowed},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, rec.Code, tc.want)
		}
	}
}

package dataplane

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// The server's ReadTimeout bounds reading the request, not the function's
// run: net/http clears the read deadline once the body is consumed.
func TestLongFunctionOutlivesReadTimeout(t *testing.T) {
	const rt = 50 * time.Millisecond
	d := runDP(t, Config{ReadTimeout: rt})
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long")},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", g.addr)}})
	start := time.Now()
	res := goGet(t, "http://"+d.Addr()+"/function/long")
	recv(t, g.arrived, "arrival")
	waitFor(t, "ReadTimeout to pass", func() bool { return time.Since(start) > 3*rt })
	g.release <- struct{}{}
	if r := recv(t, res, "response"); r.err != nil || r.code != http.StatusOK {
		t.Fatalf("function longer than ReadTimeout: %v %d %s", r.err, r.code, r.body)
	}
}

func TestLongFunctionExtendsWriteDeadline(t *testing.T) {
	const writeTimeout = 50 * time.Millisecond
	d := runDP(t, Config{WriteTimeout: writeTimeout})
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long", func(s *briskv1.FunctionSpec) { s.TimeoutMs = 10_000 })},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", g.addr)}})
	start := time.Now()
	res := goGet(t, "http://"+d.Addr()+"/function/long")
	recv(t, g.arrived, "arrival")
	// Answer only after the server-wide write deadline has passed.
	waitFor(t, "server WriteTimeout to pass", func() bool { return time.Since(start) > 3*writeTimeout })
	g.release <- struct{}{}
	if r := recv(t, res, "response"); r.err != nil || r.code != http.StatusOK {
		t.Fatalf("function longer than WriteTimeout: %v %d %s", r.err, r.code, r.body)
	}
}

// A data plane that follows a control plane is not healthy before its first
// endpoint snapshot: a front door (brisk gateway) must not send it calls
// for functions it does not know yet.
func TestHealthzWaitsForTheFirstSnapshot(t *testing.T) {
	d, err := New(Config{ControlPlane: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	health := func() int {
		rec := httptest.NewRecorder()
		d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/healthz", nil))
		return rec.Code
	}
	if got := health(); got != http.StatusServiceUnavailable {
		t.Fatalf("healthz before any snapshot: %d, want 503", got)
	}
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{{Name: "f", Revision: 1, Concurrency: 1}}})
	if got := health(); got != http.StatusServiceUnavailable {
		t.Fatalf("healthz after a delta only: %d, want 503", got)
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true})
	if got := health(); got != http.StatusOK {
		t.Fatalf("healthz after the snapshot: %d, want 200", got)
	}
}

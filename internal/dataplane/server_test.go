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

// A call for a function the data plane does not know yet waits briefly for
// the control plane to send it (a client deploys and calls at once), and is
// served when it arrives; a function that never arrives is a 404.
func TestCallWaitsBrieflyForAFunctionJustRegistered(t *testing.T) {
	d, err := New(Config{ControlPlane: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true})
	sandbox := newSandbox(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hi")) })
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/function/late", nil))
		done <- rec
	}()
	waitFor(t, "the call to wait for its function", func() bool { return d.awaiting.Load() == 1 })
	// An unrelated batch first: the call keeps waiting.
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("other")}})
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("late")},
		Added: []*briskv1.Endpoint{ep("late", "sb-1", sandbox)}})
	if rec := recv(t, done, "the call"); rec.Code != http.StatusOK || rec.Body.String() != "hi" {
		t.Fatalf("call for a function registered a moment later: %d %q", rec.Code, rec.Body.String())
	}
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/function/never", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("call for an unknown function: %d, want 404", rec.Code)
	}
}

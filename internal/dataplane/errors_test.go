package dataplane

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	btestutil "github.com/brisk-faas/brisk/internal/testutil"
)

// wantReason checks a brisk-generated error and its reason code, in the
// X-Brisk-Error header and the JSON body.
func wantReason(t testing.TB, r result, code int, reason, substr string) {
	t.Helper()
	wantError(t, r, code, substr)
	if got := r.header.Get("X-Brisk-Error"); got != reason {
		t.Fatalf("X-Brisk-Error %q, want %q (body %s)", got, reason, r.body)
	}
	var body struct{ Reason string }
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.Reason != reason {
		t.Fatalf("body reason %q, want %q (body %s)", body.Reason, reason, r.body)
	}
}

// chunkedGet sends a GET whose body is chunked: the front end hands such a
// request to the net/http path, so the same error goes through both paths.
func chunkedGet(t testing.TB, url string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1 // chunked
	return do(t, req)
}

func (d *DataPlane) errorCount(r errReason) float64 {
	return testutil.ToFloat64(d.prom.errors[r])
}

// Every error the platform generates says why, on both paths, and is
// counted by reason; a function's own error carries no reason.
func TestErrorReasons(t *testing.T) {
	d, srv := newTestDP(t, func(c *Config) { c.MaxBodyBytes = 1024 })
	g := newGate(t)
	own := newSandbox(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "mine", http.StatusBadGateway) })
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("busy", func(s *briskv1.FunctionSpec) { s.QueueDepth = 1; s.QueueTimeoutMs = 60_000 }),
			fnSpec("idle", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 50 }),
			fnSpec("own"),
		},
		Added: []*briskv1.Endpoint{ep("busy", "sb-1", g.addr), ep("own", "sb-o", own)}})

	for _, path := range []struct {
		name string
		call func(url string) result
	}{
		{"front", func(url string) result { return get(t, url) }},
		{"nethttp", func(url string) result { return chunkedGet(t, url) }},
	} {
		t.Run(path.name, func(t *testing.T) {
			// A sandbox that refuses connections (each path its own: a
			// refusing endpoint leaves the rotation).
			d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("broken-"+path.name, shortQueue)},
				Added: []*briskv1.Endpoint{ep("broken-"+path.name, "sb-x-"+path.name, "127.0.0.1:1")}})
			wantReason(t, path.call(srv.URL+"/function/nope"), 404, "no-function", `"nope" not found`)
			wantReason(t, path.call(srv.URL+"/function/idle"), 504, "queue-timeout", "waiting for a sandbox")
			wantReason(t, path.call(srv.URL+"/function/broken-"+path.name), 502, "sandbox-failed", "sandbox sb-x")
			r := path.call(srv.URL + "/function/own")
			if r.code != 502 || r.header.Get("X-Brisk-Error") != "" || !strings.Contains(r.body, "mine") {
				t.Fatalf("the function's own 502: %d %q X-Brisk-Error %q", r.code, r.body, r.header.Get("X-Brisk-Error"))
			}

			first := goGet(t, srv.URL+"/function/busy")
			recv(t, g.arrived, "first arrival")
			second := goGet(t, srv.URL+"/function/busy")
			waitFor(t, "second queued", func() bool { return d.queued("busy") == 1 })
			wantReason(t, path.call(srv.URL+"/function/busy"), 503, "queue-full", "queue full")
			g.release <- struct{}{}
			g.release <- struct{}{}
			for _, ch := range []<-chan result{first, second} {
				if r := recv(t, ch, "response"); r.code != 200 {
					t.Fatalf("%d %s", r.code, r.body)
				}
			}
		})
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/own", strings.NewReader(strings.Repeat("x", 2048)))
	wantReason(t, do(t, req), 413, "body-too-large", "")

	for r, want := range map[errReason]float64{reasonNoFunction: 2, reasonQueueTimeout: 2, reasonQueueFull: 2, reasonBodyTooLarge: 1} {
		if got := d.errorCount(r); got != want {
			t.Errorf("brisk_dataplane_errors_total{reason=%q} = %v, want %v", r, got, want)
		}
	}
	if got := d.errorCount(reasonSandboxFailed); got < 2 {
		t.Errorf("sandbox-failed counted %v times, want ≥ 2", got)
	}
}

// A function the control plane cannot place, or whose sandboxes keep
// failing, times out with that reason and the control plane's message; once
// the condition clears, a timeout is a plain queue timeout again.
func TestConditionExplainsQueueTimeout(t *testing.T) {
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("big", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 20 }),
			fnSpec("crashy", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 20 }),
			fnSpec("capped", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 20 }),
		},
		Conditions: []*briskv1.FunctionCondition{
			{Function: "big", Reason: "no-capacity", Message: "no node has room for a sandbox (cpu 64000m)"},
			{Function: "crashy", Reason: "function-failing", Message: "3 sandbox starts failed in a row, the last: exec: no such file"},
			{Function: "capped", Reason: "quota-exceeded", Message: `namespace "team" holds 2 sandboxes, its quota max_sandboxes`},
		}})
	wantReason(t, get(t, srv.URL+"/function/capped"), 504, "quota-exceeded", "its quota")
	wantReason(t, get(t, srv.URL+"/function/big"), 504, "no-capacity", "no node has room")
	wantReason(t, chunkedGet(t, srv.URL+"/function/crashy"), 504, "function-failing", "no such file")

	d.Apply(&briskv1.EndpointBatch{Conditions: []*briskv1.FunctionCondition{{Function: "big"}}})
	wantReason(t, get(t, srv.URL+"/function/big"), 504, "queue-timeout", "waiting for a sandbox")
	wantReason(t, get(t, srv.URL+"/function/crashy"), 504, "function-failing", "")

	// A snapshot without conditions clears them all.
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{
		fnSpec("crashy", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 20 })}})
	wantReason(t, get(t, srv.URL+"/function/crashy"), 504, "queue-timeout", "")
}

// A function whose sandboxes keep failing to start (the control plane's
// fail_fast) answers at once: calls already waiting get 503 with the
// cause, and so do new ones, instead of each waiting the queue timeout;
// while it still has a sandbox, calls go to it.
func TestFailingFunctionAnswersAtOnce(t *testing.T) {
	d, srv := newTestDP(t, nil)
	slow := func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 60_000 }
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("crashy", slow)}})
	waiting := goGet(t, srv.URL+"/function/crashy")
	btestutil.Eventually(t, 10*time.Second, func() bool { return d.lookup("crashy").q.Len() == 1 }, "the call never queued")
	// Failing, but not yet fail-fast: the call keeps waiting.
	d.Apply(&briskv1.EndpointBatch{Conditions: []*briskv1.FunctionCondition{
		{Function: "crashy", Reason: "function-failing", Message: "1 sandbox starts failed in a row, the last: exec: no such file"}}})
	if n := d.lookup("crashy").q.Len(); n != 1 {
		t.Fatalf("a first failure answered the waiting call (waiting %d)", n)
	}
	d.Apply(&briskv1.EndpointBatch{Conditions: []*briskv1.FunctionCondition{
		{Function: "crashy", Reason: "function-failing", Message: "3 sandbox starts failed in a row, the last: exec: no such file", FailFast: true}}})
	select {
	case r := <-waiting:
		wantReason(t, r, 503, "function-failing", "no such file")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting call was not answered when the function started failing")
	}
	wantReason(t, get(t, srv.URL+"/function/crashy"), 503, "function-failing", "cannot start a sandbox")
	if got := d.errorCount(reasonFunctionFailing); got != 2 {
		t.Fatalf("function-failing counted %v times, want 2", got)
	}

	// With a sandbox (an older revision's, say), calls are served.
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("crashy", "sb-old", addr)}})
	if r := get(t, srv.URL+"/function/crashy"); r.code != 200 {
		t.Fatalf("a failing function with a sandbox: %d %s", r.code, r.body)
	}
	// Cleared: calls wait for a sandbox again.
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{
		fnSpec("crashy", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 20 })}})
	wantReason(t, get(t, srv.URL+"/function/crashy"), 504, "queue-timeout", "waiting for a sandbox")
}

// A function that finds no node with room and no idle sandbox to take
// (the control plane's no-capacity with fail_fast) answers 503 at once,
// naming the node and the resource, instead of letting each call wait out
// its queue timeout; without fail_fast its calls still wait.
func TestNoRoomAnswersAtOnce(t *testing.T) {
	d, srv := newTestDP(t, nil)
	slow := func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 60_000 }
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("late", slow)}})
	waiting := goGet(t, srv.URL+"/function/late")
	btestutil.Eventually(t, 10*time.Second, func() bool { return d.lookup("late").q.Len() == 1 }, "the call never queued")
	msg := "no node has room for a sandbox of 250m CPU and 128 MiB, and no idle sandbox to evict for it (node n0: CPU 2000m of 2000m requested)"
	d.Apply(&briskv1.EndpointBatch{Conditions: []*briskv1.FunctionCondition{{Function: "late", Reason: "no-capacity", Message: msg}}})
	if n := d.lookup("late").q.Len(); n != 1 {
		t.Fatalf("no-capacity without fail_fast answered the waiting call (waiting %d)", n)
	}
	d.Apply(&briskv1.EndpointBatch{Conditions: []*briskv1.FunctionCondition{{Function: "late", Reason: "no-capacity", Message: msg, FailFast: true}}})
	select {
	case r := <-waiting:
		wantReason(t, r, 503, "no-capacity", "node n0: CPU 2000m of 2000m")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting call was not answered when the control plane found no room")
	}
	wantReason(t, get(t, srv.URL+"/function/late"), 503, "no-capacity", "no room for a sandbox")
	if got := d.errorCount(reasonNoCapacity); got != 2 {
		t.Fatalf("no-capacity counted %v times, want 2", got)
	}
}

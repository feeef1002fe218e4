package dataplane

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
)

// newAsyncDP is a data plane with an async queue on an embedded NATS
// server, its consumer running (newAsyncEnv with the defaults).
func newAsyncDP(t *testing.T) (*DataPlane, *testServer) {
	t.Helper()
	e := newAsyncEnv(t, nil, async.Config{})
	return e.d, e.ts
}

func submitAsync(t *testing.T, method, url string, hdr http.Header, body string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return do(t, req)
}

func callRecord(t *testing.T, base, id string) (async.Record, int) {
	t.Helper()
	r := get(t, base+"/v1/calls/"+id)
	var rec async.Record
	if r.code == http.StatusOK {
		if err := json.Unmarshal([]byte(r.body), &rec); err != nil {
			t.Fatalf("record %q: %v", r.body, err)
		}
	}
	return rec, r.code
}

func awaitCall(t *testing.T, base, id string, want async.Status) async.Record {
	t.Helper()
	var rec async.Record
	waitFor(t, "call "+id+" "+string(want), func() bool {
		rec, _ = callRecord(t, base, id)
		return rec.Status == want
	})
	return rec
}

func TestAsyncSubmitRunsThroughTheDataPlane(t *testing.T) {
	d, ts := newAsyncDP(t)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", addr)}})

	r := submitAsync(t, "POST", ts.URL+"/async-function/hello/sub/path?x=1", http.Header{"X-Call-Id": {"my-call-1"}}, "payload")
	if r.code != http.StatusAccepted || r.header.Get("X-Call-Id") != "my-call-1" || r.header.Get("Location") != "/v1/calls/my-call-1" {
		t.Fatalf("submit: %d %v %s", r.code, r.header, r.body)
	}
	rec := awaitCall(t, ts.URL, "my-call-1", async.StatusSucceeded)
	var s seen
	if err := json.Unmarshal(rec.Result.Body, &s); err != nil {
		t.Fatalf("result body %q: %v", rec.Result.Body, err)
	}
	if s.Path != "/sub/path" || s.RawQuery != "x=1" || s.CallID != "my-call-1" || s.Sandbox != "sb-1" || s.XFF == "" {
		t.Fatalf("the function saw %+v", s)
	}
	if rec.Result.Status != 200 || rec.Attempts != 1 || rec.Function != "hello" {
		t.Fatalf("record %+v", rec)
	}

	// Prefer: respond-async on the ordinary path (Knative's async component).
	r = submitAsync(t, "POST", ts.URL+"/function/hello/k", http.Header{"Prefer": {"respond-async, wait=10"}}, "")
	if r.code != http.StatusAccepted {
		t.Fatalf("Prefer: respond-async: %d %s", r.code, r.body)
	}
	// A fresh id: the 202's body names it, and its queued record or its
	// final one is there at once.
	var accepted struct {
		CallID           string `json:"call_id"`
		Status, Location string
	}
	if err := json.Unmarshal([]byte(r.body), &accepted); err != nil || accepted.CallID != r.header.Get("X-Call-Id") || accepted.CallID == "" ||
		accepted.Status != "queued" || accepted.Location != "/v1/calls/"+accepted.CallID {
		t.Fatalf("202 body %q (%v)", r.body, err)
	}
	if gr := get(t, ts.URL+"/v1/calls/"+accepted.CallID); gr.code != 200 {
		t.Fatalf("the accepted call: %d %s", gr.code, gr.body)
	}
	rec = awaitCall(t, ts.URL, r.header.Get("X-Call-Id"), async.StatusSucceeded)
	if err := json.Unmarshal(rec.Result.Body, &s); err != nil || s.Path != "/k" {
		t.Fatalf("Prefer call saw %+v (%v)", s, err)
	}

	// Listing finds both.
	lr := get(t, ts.URL+"/v1/calls?function=hello&status=succeeded")
	var list struct{ Calls []async.Record }
	if err := json.Unmarshal([]byte(lr.body), &list); err != nil || len(list.Calls) != 2 {
		t.Fatalf("list: %d %s (%v)", lr.code, lr.body, err)
	}
}

func TestAsyncRefusalsBeforeAccepting(t *testing.T) {
	d, ts := newAsyncDP(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}})

	wantError(t, submitAsync(t, "POST", ts.URL+"/async-function/nope", nil, "x"), http.StatusNotFound, "not found")
	wantError(t, submitAsync(t, "POST", ts.URL+"/async-function/hello", nil, strings.Repeat("x", 7<<20)), http.StatusRequestEntityTooLarge, "larger than")
	wantError(t, submitAsync(t, "POST", ts.URL+"/async-function/hello", http.Header{"X-Call-Id": {"bad id!"}}, ""), http.StatusBadRequest, "id")
	wantError(t, submitAsync(t, "POST", ts.URL+"/async-function/hello", http.Header{"X-Callback-Url": {"ftp://x"}}, ""), http.StatusBadRequest, "X-Callback-Url")
	wantError(t, get(t, ts.URL+"/v1/calls/unknown"), http.StatusNotFound, "no such call")

	d.applyAuth(&briskv1.AuthConfig{Enabled: true})
	wantError(t, submitAsync(t, "POST", ts.URL+"/async-function/hello", nil, ""), http.StatusUnauthorized, "hello")
	wantError(t, get(t, ts.URL+"/v1/calls"), http.StatusUnauthorized, "")
}

func TestAsyncDisabled(t *testing.T) {
	d, ts := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}})
	wantError(t, submitAsync(t, "POST", ts.URL+"/async-function/hello", nil, ""), http.StatusNotImplemented, "not enabled")
}

// Synchronous calls go ahead of asynchronous ones in a function's queue.
func TestAsyncWaitsBehindSyncCalls(t *testing.T) {
	d, ts := newAsyncDP(t)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("slow")}, Added: []*briskv1.Endpoint{ep("slow", "sb-1", g.addr)}})

	first := goGet(t, ts.URL+"/function/slow")
	recv(t, g.arrived, "first sync call")
	r := submitAsync(t, "POST", ts.URL+"/async-function/slow", http.Header{"X-Call-Id": {"async-1"}}, "")
	if r.code != http.StatusAccepted {
		t.Fatalf("submit %d %s", r.code, r.body)
	}
	waitFor(t, "the async call to queue", func() bool { return d.queued("slow") == 1 })
	req, _ := http.NewRequest("GET", ts.URL+"/function/slow", nil)
	req.Header.Set("X-Call-Id", "sync-2")
	second := make(chan result, 1)
	go func() { second <- do(t, req) }()
	waitFor(t, "the second sync call to queue", func() bool { return d.queued("slow") == 2 })

	g.release <- struct{}{}
	if got := recv(t, first, "first reply"); got.code != 200 {
		t.Fatalf("first: %d", got.code)
	}
	if id := recv(t, g.arrived, "next arrival"); id != "sync-2" {
		t.Fatalf("after the slot freed, %q ran; the synchronous call must go first", id)
	}
	g.release <- struct{}{}
	recv(t, second, "second reply")
	if id := recv(t, g.arrived, "async arrival"); id != "async-1" {
		t.Fatalf("then %q ran, want async-1", id)
	}
	g.release <- struct{}{}
	awaitCall(t, ts.URL, "async-1", async.StatusSucceeded)
}

// A function that keeps failing is retried with back-off and ends dead; a
// retry by hand runs it again.
func TestAsyncRetriesThenDead(t *testing.T) {
	d, ts := newAsyncDP(t)
	var fail = make(chan bool, 1)
	fail <- true
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		f := <-fail
		fail <- f
		if f {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("flaky", func(s *briskv1.FunctionSpec) {
		s.Async = &briskv1.AsyncPolicy{MaxAttempts: 3, BackoffMs: 10, BackoffMaxMs: 50, RetryFunctionErrors: true}
	})}, Added: []*briskv1.Endpoint{ep("flaky", "sb-1", addr)}})
	r := submitAsync(t, "POST", ts.URL+"/async-function/flaky", http.Header{"X-Call-Id": {"f-1"}}, "")
	if r.code != http.StatusAccepted {
		t.Fatal(r.code, r.body)
	}
	rec := awaitCall(t, ts.URL, "f-1", async.StatusDead)
	if rec.Attempts != 3 || rec.Result.Status != 500 || rec.Result.PlatformError != "" {
		t.Fatalf("dead record %+v", rec)
	}
	<-fail
	fail <- false
	rr := submitAsync(t, "POST", ts.URL+"/v1/calls/f-1/retry", nil, "")
	if rr.code != http.StatusAccepted {
		t.Fatalf("retry: %d %s", rr.code, rr.body)
	}
	rec = awaitCall(t, ts.URL, "f-1", async.StatusSucceeded)
	if string(rec.Result.Body) != "ok" {
		t.Fatalf("after retry: %+v", rec)
	}
}

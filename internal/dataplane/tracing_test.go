package dataplane

import (
	"io"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// A traced cold call is one server span, child of the caller's traceparent,
// with the queue, the cold start it waited for (placement, creation and
// readiness, as long as the control plane and worker measured them) and
// the first byte under it; the function gets the data plane's span as its
// parent.
func TestTracedColdCall(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	d, srv := newTestDP(t, func(c *Config) { c.Tracer = tp.Tracer("test") })
	gotParent := make(chan string, 1)
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		gotParent <- r.Header.Get("Traceparent")
		io.WriteString(w, "ok")
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")}})

	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/f", nil)
	req.Header.Set("Traceparent", caller)
	done := callInBackground(t, req)
	waitFor(t, "the call queued", func() bool { return d.queued("f") == 1 })
	e := ep("f", "sb-1", addr)
	e.ReadyAfterUs, e.StartUs, e.CreateUs = 9000, 3000, 5000 // link 4 ms, creation 3 ms, readiness 2 ms
	d.Apply(&briskv1.EndpointBatch{Added: []*briskv1.Endpoint{e}})
	resp := <-done
	if resp == nil || resp.StatusCode != 200 {
		t.Fatalf("call: %v", resp)
	}
	parent := <-gotParent
	if len(parent) != len(caller) || parent[3:35] != caller[3:35] || parent[36:52] == caller[36:52] {
		t.Fatalf("the function's traceparent %q: want the caller's trace with the data plane's span", parent)
	}
	tp.ForceFlush(t.Context())
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	inv := spans["invoke f"]
	if inv == nil {
		t.Fatalf("no invoke span; spans: %v", names(rec.Ended()))
	}
	if inv.Parent().SpanID().String() != caller[36:52] || inv.SpanContext().TraceID().String() != caller[3:35] || parent[36:52] != inv.SpanContext().SpanID().String() {
		t.Fatalf("invoke span %v, parent %v", inv.SpanContext(), inv.Parent())
	}
	for _, name := range []string{"queue", "cold start", "placement", "creation", "readiness", "first byte"} {
		if spans[name] == nil {
			t.Fatalf("no %q span; spans: %v", name, names(rec.Ended()))
		}
	}
	for name, want := range map[string]string{"queue": "invoke f", "cold start": "invoke f", "first byte": "invoke f",
		"placement": "cold start", "creation": "cold start", "readiness": "cold start"} {
		if spans[name].Parent().SpanID() != spans[want].SpanContext().SpanID() {
			t.Errorf("%q is not a child of %q", name, want)
		}
	}
	dur := func(name string) int64 { s := spans[name]; return s.EndTime().Sub(s.StartTime()).Microseconds() }
	if dur("cold start") != 9000 || dur("creation") != 3000 || dur("readiness") != 2000 || dur("placement") != 2000 {
		t.Fatalf("cold start %d µs, placement %d, creation %d, readiness %d: want 9000, 2000, 3000, 2000",
			dur("cold start"), dur("placement"), dur("creation"), dur("readiness"))
	}
	cold := false
	for _, a := range inv.Attributes() {
		if a.Key == "faas.coldstart" {
			cold = a.Value.AsBool()
		}
	}
	if !cold {
		t.Fatal("invoke span does not say the call was cold")
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

// A traced call refused before it reaches a sandbox (no token) still ends
// its span with the status it got.
func TestTracedRefusedCallHasStatus(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	d, srv := newTestDP(t, func(c *Config) { c.Tracer = tp.Tracer("test") })
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added: []*briskv1.Endpoint{ep("f", "sb-1", newSandbox(t, echo))}})
	d.authOn.Store(true)
	resp, err := http.Post(srv.URL+"/function/f", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	tp.ForceFlush(t.Context())
	for _, s := range rec.Ended() {
		if s.Name() != "invoke f" {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "http.response.status_code" && a.Value.AsInt64() == 401 {
				return
			}
		}
		t.Fatalf("invoke span attributes %v: no status 401", s.Attributes())
	}
	t.Fatalf("no invoke span: %v", names(rec.Ended()))
}

package dataplane

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// The metric filter (docs/reliability.md, case 22): with no history an
// emergency call counts toward regular scaling; sporadic calls (gaps far
// longer than the keep-alive) never do; a sustained rise (gaps shorter than
// the keep-alive) does; gaps older than an hour are forgotten.
func TestMetricFilter(t *testing.T) {
	keepAlive := 90 * time.Second
	t0 := time.Unix(1_000_000, 0)

	var empty iatTracker
	if !empty.counts(keepAlive, 50, t0) {
		t.Error("no history: the call must count")
	}

	var sporadic, busy iatTracker
	now := t0
	for range 10 {
		sporadic.observe(now)
		busy.observe(now)
		now = now.Add(5 * time.Minute)
	}
	if sporadic.counts(keepAlive, 50, now) {
		t.Error("calls 5 minutes apart counted toward a 90 s keep-alive")
	}

	// The same history, then busy: the most recent gaps are 1 s.
	for range 20 {
		busy.observe(now)
		now = now.Add(time.Second)
	}
	if !busy.counts(keepAlive, 50, now) {
		t.Error("a sustained rise (1 s gaps) did not count")
	}
	// p90 still sees the sporadic gaps among the last 29.
	if busy.counts(keepAlive, 90, now) {
		t.Error("p90 ignored the 5-minute gaps")
	}

	// An hour later with no calls, the history has expired.
	if !sporadic.counts(keepAlive, 50, now.Add(2*time.Hour)) {
		t.Error("gaps older than an hour still decide")
	}
}

func TestIATTrackerKeepsTheLastGaps(t *testing.T) {
	var tr iatTracker
	now := time.Unix(0, 0)
	for i := range iatKeep + 50 {
		tr.observe(now)
		now = now.Add(time.Duration(i%3+1) * time.Second)
	}
	if tr.n != iatKeep {
		t.Errorf("kept %d gaps, want the last %d", tr.n, iatKeep)
	}
}

// scriptedWorker is a worker's gRPC Emergency endpoint whose answer a test
// chooses: the failure injection for the data plane's side of the track.
type scriptedWorker struct {
	briskv1.UnimplementedWorkerServer
	calls  atomic.Int32
	answer func(*briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error)
}

func (s *scriptedWorker) Emergency(_ context.Context, r *briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
	s.calls.Add(1)
	return s.answer(r)
}

func startScriptedWorker(t *testing.T, answer func(*briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error)) (*scriptedWorker, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &scriptedWorker{answer: answer}
	srv := grpc.NewServer()
	briskv1.RegisterWorkerServer(srv, w)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return w, ln.Addr().String()
}

func dualSpec(name string) *briskv1.FunctionSpec {
	return fnSpec(name, func(s *briskv1.FunctionSpec) {
		s.ScalingMode, s.KeepAliveMs, s.QueueTimeoutMs, s.TimeoutMs = "dual", 90_000, 300, 2_000
	})
}

// A served emergency call carries the worker's reply and says so.
func TestEmergencyCallServed(t *testing.T) {
	w, addr := startScriptedWorker(t, func(r *briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
		return &briskv1.EmergencyReply{Status: 201, Body: []byte(r.GetMethod() + " " + r.GetPath()), SandboxId: "ei-x-1", StartUs: 7000,
			Headers: []*briskv1.Header{{Name: "X-From", Value: "sandbox"}}}, nil
	})
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{dualSpec("f")},
		EmergencySet: true, EmergencyWorkers: []*briskv1.EmergencyWorker{{NodeId: "n1", Address: addr, Free: 2}}})
	res := get(t, srv.URL+"/function/f/p?q=1")
	if res.err != nil || res.code != 201 || res.body != "GET /p?q=1" || res.header.Get("X-Brisk-Track") != "emergency" ||
		res.header.Get("X-From") != "sandbox" || res.header.Get("X-Brisk-Sandbox") != "ei-x-1" {
		t.Fatalf("reply %d %q %v (%v)", res.code, res.body, res.header, res.err)
	}
	if w.calls.Load() != 1 {
		t.Errorf("worker called %d times", w.calls.Load())
	}
	// Its latency reaches the control plane in the next report, whether
	// or not the call counted toward the function's load.
	if m := metricFor(d.collect(time.Now(), time.Second), "f"); len(m.GetLatencyBuckets()) == 0 {
		t.Errorf("the next report's entry for f: %+v, want the call's latency", m)
	}
}

// Every worker refuses (slots full): the call is not lost, it queues for a
// regular sandbox as in async mode and gets the queue's bounded answer
// (case 21); each worker was asked once.
func TestEmergencyRefusedEverywhereFallsBackToTheQueue(t *testing.T) {
	full := func(*briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
		return nil, status.Error(codes.ResourceExhausted, "all slots in use")
	}
	w1, a1 := startScriptedWorker(t, full)
	w2, a2 := startScriptedWorker(t, full)
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{dualSpec("f")}, EmergencySet: true,
		EmergencyWorkers: []*briskv1.EmergencyWorker{{NodeId: "n1", Address: a1, Free: 1}, {NodeId: "n2", Address: a2, Free: 1}}})
	res := get(t, srv.URL+"/function/f")
	if res.code != http.StatusGatewayTimeout || res.header.Get("X-Brisk-Error") != "queue-timeout" {
		t.Fatalf("reply %d %q %v", res.code, res.body, res.header)
	}
	if w1.calls.Load() != 1 || w2.calls.Load() != 1 {
		t.Errorf("workers asked %d and %d times, want once each", w1.calls.Load(), w2.calls.Load())
	}
	// Refusals are remembered for a second: the next call goes straight to
	// the queue.
	_ = get(t, srv.URL+"/function/f")
	if w1.calls.Load() != 1 || w2.calls.Load() != 1 {
		t.Errorf("refusing workers asked again within their back-off: %d, %d", w1.calls.Load(), w2.calls.Load())
	}
}

// The worker fails after the call reached the sandbox (it died mid-call):
// the caller gets an error within the deadline and the call is not tried
// on another worker (at most once: case 19).
func TestEmergencyFailureAfterSendIsNotRetried(t *testing.T) {
	w1, a1 := startScriptedWorker(t, func(*briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
		return nil, status.Error(codes.Aborted, "sandbox died")
	})
	w2, a2 := startScriptedWorker(t, func(*briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
		return &briskv1.EmergencyReply{Status: 200}, nil
	})
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{dualSpec("f")}, EmergencySet: true,
		EmergencyWorkers: []*briskv1.EmergencyWorker{{NodeId: "n1", Address: a1, Free: 1}, {NodeId: "n2", Address: a2, Free: 1}}})
	var failed result
	for range 4 { // round-robin: some call lands on n1 first
		if failed = get(t, srv.URL+"/function/f"); failed.code != 200 {
			break
		}
	}
	if failed.code != http.StatusBadGateway || failed.header.Get("X-Brisk-Error") != "sandbox-failed" || !strings.Contains(failed.body, "sandbox died") {
		t.Fatalf("reply %d %q", failed.code, failed.body)
	}
	if n1, n2 := w1.calls.Load(), w2.calls.Load(); n1 != 1 || n1+n2 > 4 {
		t.Errorf("calls: n1 %d, n2 %d; the failed call must not be retried elsewhere", n1, n2)
	}
}

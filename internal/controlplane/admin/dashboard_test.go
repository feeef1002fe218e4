package admin

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/pkg/api"
)

// t0 starts a dashboard slot, so that the tests know which slot a time
// falls in.
var t0 = time.Unix(1_700_000_000, 0)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func metric(fn string, requests int64, latency ...uint64) *briskv1.FunctionMetric {
	return &briskv1.FunctionMetric{Function: fn, Requests: requests, LatencyBuckets: latency}
}

func report(ms ...*briskv1.FunctionMetric) *briskv1.MetricsReport {
	return &briskv1.MetricsReport{DataPlaneId: "dp", Functions: ms}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// Calls and cold starts per second are the window's counts over the span
// it covers: from the start while the first window fills, then the last
// 25-30 s; idle functions drop out, urgent reports count nothing.
func TestDashboardRates(t *testing.T) {
	if t0.UnixNano()%int64(dashSlot) != 0 {
		t.Fatal("t0 must start a slot")
	}
	d := knownDash()
	for s := 1; s <= 10; s++ {
		d.Report(at(float64(s)), report(metric("a", 10), metric("b", 5), metric("idle", 0)))
	}
	d.Report(at(10), &briskv1.MetricsReport{Urgent: true, Functions: []*briskv1.FunctionMetric{metric("a", 1000)}})
	for range 3 {
		d.Created(at(2), "a")
	}
	snap := d.snapshot(at(10))
	if snap.span != 10*time.Second {
		t.Fatalf("span %s, want 10s (since the start)", snap.span)
	}
	if a := snap.fns["a"]; !near(a.callsPerSec, 10) || a.calls != 100 || !near(a.creationPerSec, 0.3) || a.creations != 3 {
		t.Fatalf("a: %+v, want 100 calls, 10/s, 3 creations, 0.3/s", a)
	}
	if b := snap.fns["b"]; !near(b.callsPerSec, 5) || b.creations != 0 {
		t.Fatalf("b: %+v, want 5 calls/s", b)
	}
	if _, ok := snap.fns["idle"]; ok {
		t.Fatal("a function with no calls has figures")
	}
	if !near(snap.total.callsPerSec, 15) || !near(snap.total.creationPerSec, 0.3) || snap.callsTotal != 150 || snap.creationsTotal != 3 {
		t.Fatalf("total %+v (calls %d, creations %d), want 15 calls/s, 0.3 creations/s, 150 and 3 in all", snap.total, snap.callsTotal, snap.creationsTotal)
	}

	// A minute later the window is empty, the totals stay, and the next
	// report sweeps the idle windows away.
	snap = d.snapshot(at(70))
	if snap.total.callsPerSec != 0 || len(snap.fns) != 0 || snap.callsTotal != 150 {
		t.Fatalf("a minute later: %+v, %d functions, %d calls in all; want an empty window", snap.total, len(snap.fns), snap.callsTotal)
	}
	d.Report(at(70), report(metric("c", 1)))
	if len(d.fns) != 1 {
		t.Fatalf("%d function windows kept, want only c's", len(d.fns))
	}

	// A full window: the current slot's 4.5 s and the 5 whole ones before.
	d = knownDash()
	for s := 100.5; s < 160; s++ {
		d.Report(at(s), report(metric("a", 2)))
	}
	snap = d.snapshot(at(159.5))
	wantSpan := 29500 * time.Millisecond // from 130 s
	if snap.span != wantSpan {
		t.Fatalf("span %s, want %s", snap.span, wantSpan)
	}
	if a := snap.fns["a"]; a.calls != 60 || !near(a.callsPerSec, 60/29.5) {
		t.Fatalf("full window: %+v, want 60 calls (130.5..159.5 s), %.3f/s", a, 60/29.5)
	}
	// The first report after a start is not a burst: a second at least.
	d = knownDash()
	d.Report(at(0.1), report(metric("a", 3)))
	if snap := d.snapshot(at(0.1)); !near(snap.total.callsPerSec, 3) {
		t.Fatalf("just after the start: %v calls/s, want 3 (over a second)", snap.total.callsPerSec)
	}
}

// Percentiles interpolate within the bucket they fall in, as Prometheus'
// histogram_quantile does, over the buckets of every report in the window.
func TestDashboardLatencyPercentiles(t *testing.T) {
	var b [nLatency]uint64
	b[2] = 50          // 1-2.5 ms
	b[6] = 40          // 25-50 ms
	b[nLatency-1] = 10 // above 300 s
	for _, c := range []struct{ q, want float64 }{
		{0.1, 0.001 + 0.0015*10/50}, // rank 10 of the 50 in (1 ms, 2.5 ms]
		{0.5, 0.0025},               // the 50th: the top of that bucket
		{0.6, 0.025 + 0.025*10/40},  // rank 60: the 10th of the 40 in (25 ms, 50 ms]
		{0.9, 0.05},
		{0.99, 300}, // in the unbounded bucket: the highest bound
	} {
		if got := quantile(c.q, &b, 100); !near(got, c.want) {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
	var first [nLatency]uint64
	first[0] = 4 // all at most 0.5 ms
	if got := quantile(0.5, &first, 4); !near(got, 0.00025) {
		t.Errorf("median of the first bucket = %v, want 0.25 ms (from 0)", got)
	}
	if got := latencyOf(&[nLatency]uint64{}); got != (api.LatencySummary{}) {
		t.Errorf("no calls: %+v, want zeros", got)
	}

	// Two data planes' reports merge; a report may leave trailing buckets
	// out, or (a newer data plane) carry more than there are.
	d := knownDash()
	d.Report(at(1), report(metric("f", 50, 0, 0, 50)))
	d.Report(at(2), report(metric("f", 50, 0, 0, 0, 0, 0, 0, 40)))
	long := make([]uint64, nLatency+3)
	long[nLatency+2] = 10
	d.Report(at(3), report(metric("g", 10, long...)))
	snap := d.snapshot(at(3))
	want := api.LatencySummary{Count: 90, P50: 0.001 + 0.0015*45/50, P90: 0.025 + 0.025*31/40, P99: 0.025 + 0.025*39.1/40}
	if got := snap.fns["f"].latency; got.Count != want.Count || !near(got.P50, want.P50) || !near(got.P90, want.P90) || !near(got.P99, want.P99) {
		t.Fatalf("f's latency %+v, want %+v", got, want)
	}
	if got := snap.fns["g"].latency; got.Count != 10 || got.P50 != 300 {
		t.Fatalf("g's latency %+v, want 10 calls in the last bucket", got)
	}
	if got := snap.total.latency; got.Count != 100 || !near(got.P99, 300) {
		t.Fatalf("total latency %+v, want 100 calls, p99 in the last bucket", got)
	}
}

// The recent failures keep the last maxDashFailures, newest first; a
// condition is recorded when a function enters it, not at each new
// message.
func TestDashboardFailureRing(t *testing.T) {
	d := knownDash()
	for i := range maxDashFailures + 10 {
		d.Failed(at(float64(i)), reconciler.SandboxFailed{Function: "f", ID: fmt.Sprintf("sb-%d", i), Node: "n1", State: "failed", Reason: fmt.Sprintf("boom %d", i)})
	}
	// Failures count in the window too: the window ending at 59 s holds
	// those of 30-59 s.
	if got := d.snapshot(at(59)).total.failures; got != 30 {
		t.Fatalf("%d failures in the window ending at 59 s, want 30", got)
	}
	d.Failed(at(100), reconciler.SandboxFailed{Function: "g", ID: "x", Node: "n2", State: "exited"})
	snap := d.snapshot(at(100))
	if len(snap.failures) != maxDashFailures {
		t.Fatalf("%d failures kept, want %d", len(snap.failures), maxDashFailures)
	}
	if f := snap.failures[0]; f.Function != "g" || f.Node != "n2" || f.Kind != "sandbox-failed" || f.Reason != "sandbox ended: exited" || !f.Time.Equal(at(100)) {
		t.Fatalf("newest failure %+v", f)
	}
	if f := snap.failures[1]; f.Sandbox != fmt.Sprintf("sb-%d", maxDashFailures+9) || f.Reason != fmt.Sprintf("boom %d", maxDashFailures+9) {
		t.Fatalf("second newest %+v", f)
	}
	if f := snap.failures[maxDashFailures-1]; f.Sandbox != "sb-11" {
		t.Fatalf("oldest kept %+v, want sb-11 (the first 11 dropped)", f)
	}
	if snap.total.failures != 1 || snap.fns["g"].failures != 1 {
		t.Fatalf("window ending at 100 s: %d failures, g's %d; want g's one", snap.total.failures, snap.fns["g"].failures)
	}

	d = knownDash()
	d.Condition(at(1), "f", reconciler.CondFunctionFailing, "1 sandbox starts failed in a row")
	d.Condition(at(2), "f", reconciler.CondFunctionFailing, "2 sandbox starts failed in a row")
	d.Condition(at(3), "f", "", "")
	d.Condition(at(4), "f", reconciler.CondNoCapacity, "no node has room")
	d.Condition(at(5), "f", reconciler.CondFunctionFailing, "1 sandbox starts failed in a row, the last: exec: no such file")
	d.Forget("f")
	snap = d.snapshot(at(5))
	var got []string
	for _, f := range snap.failures {
		got = append(got, f.Kind+": "+f.Reason)
	}
	want := []string{"function-failing: 1 sandbox starts failed in a row, the last: exec: no such file", "no-capacity: no node has room", "function-failing: 1 sandbox starts failed in a row"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("condition changes %q, want %q", got, want)
	}
	if len(d.conds) != 0 {
		t.Fatal("a deleted function's condition is kept")
	}
	var none *DashStats // a bare cluster's: everything is a no-op
	none.Report(t0, report(metric("a", 1)))
	none.Created(t0, "a")
	if s := none.snapshot(t0); len(s.failures) != 0 || s.total.calls != 0 {
		t.Fatal("a nil DashStats reports something")
	}
}

// knownDash is a DashStats at t0 with the tests' functions registered.
func knownDash() *DashStats {
	d := NewDashStats(t0)
	for _, fn := range []string{"a", "b", "c", "f", "g", "idle"} {
		d.Register(fn)
	}
	return d
}

// A data plane's report names only count for registered functions: made-up
// names get no window (no memory a data plane can grow), and a deleted
// function's reports stop counting.
func TestDashboardIgnoresUnknownFunctions(t *testing.T) {
	d := knownDash()
	var ms []*briskv1.FunctionMetric
	for i := range 10000 {
		ms = append(ms, metric(fmt.Sprintf("made-up-%d", i), 1))
	}
	d.Report(at(1), report(append(ms, metric("a", 2))...))
	if len(d.fns) != 1 || d.calls != 2 {
		t.Fatalf("%d windows, %d calls after a report of 10,000 unknown functions: want a's alone", len(d.fns), d.calls)
	}
	d.Forget("a")
	d.Report(at(2), report(metric("a", 5)))
	if len(d.fns) != 0 || d.calls != 2 {
		t.Fatalf("a deleted function's report counted: %d windows, %d calls", len(d.fns), d.calls)
	}
}

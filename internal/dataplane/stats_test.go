package dataplane

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

func TestLoadStatsTimeWeighted(t *testing.T) {
	var s loadStats
	s.reset(0)
	// Interval [0, 100): one request over [10, 60), another over [50, 100+).
	s.arrive(10)
	s.arrive(50)
	s.depart(60)
	avg, req, report := s.cut(100, 0)
	// (50 + 50) load·ns over 100 ns.
	if !report || req != 2 || math.Abs(avg-1.0) > 1e-9 {
		t.Fatalf("interval 1: avg %v requests %d report %v; want 1.0, 2, true", avg, req, report)
	}
	// [100, 200): the second request is still in flight for the whole interval.
	avg, req, report = s.cut(200, 0)
	if !report || req != 0 || avg != 1 {
		t.Fatalf("interval 2: avg %v requests %d report %v; want 1, 0, true", avg, req, report)
	}
	s.depart(250)
	avg, _, report = s.cut(300, 0)
	if !report || avg != 0.5 {
		t.Fatalf("interval 3: avg %v report %v; want 0.5, true", avg, report)
	}
	// One zero interval is reported, then silence until activity.
	if avg, req, report = s.cut(400, 0); !report || avg != 0 || req != 0 {
		t.Fatalf("first idle interval: %v %d %v; want reported zero", avg, req, report)
	}
	if _, _, report = s.cut(500, 0); report {
		t.Fatal("second idle interval reported")
	}
	s.arrive(550)
	s.depart(560)
	if avg, req, report = s.cut(600, 0); !report || req != 1 || math.Abs(avg-0.1) > 1e-9 {
		t.Fatalf("after activity: %v %d %v; want 0.1, 1, true", avg, req, report)
	}
}

func TestLoadStatsNewFunctionIsQuiet(t *testing.T) {
	var s loadStats
	s.reset(0)
	if _, _, report := s.cut(100, 0); report {
		t.Fatal("a function that never saw a request reported")
	}
}

func TestUrgentReportsCoalesce(t *testing.T) {
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("a"), fnSpec("b")}})
	const n = 5
	// The first of a's calls can be called off, to change a's counts later.
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	first, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/function/a", nil)
	if err != nil {
		t.Fatal(err)
	}
	go do(t, first)
	waitFor(t, "a's first call queued", func() bool { return d.queued("a") == 1 })
	for range n - 1 {
		goGet(t, srv.URL+"/function/a")
	}
	goGet(t, srv.URL+"/function/b")
	waitFor(t, "all queued", func() bool { return d.queued("a") == n && d.queued("b") == 1 })
	// Six triggers rang the doorbell once and listed each function once.
	if len(d.urgentBell) != 1 {
		t.Fatalf("doorbell holds %d rings", len(d.urgentBell))
	}
	rep := d.collectUrgent(time.Now())
	if !rep.GetUrgent() || len(rep.GetFunctions()) != 2 {
		t.Fatalf("urgent report %+v", rep)
	}
	if m := metricFor(rep, "a"); m.GetQueued() != n || !m.GetNoCapacity() || m.GetAvgConcurrency() != n {
		t.Errorf("a: %+v", m)
	}
	if rep := d.collectUrgent(time.Now()); len(rep.GetFunctions()) != 0 {
		t.Errorf("second collection without new triggers reported %+v", rep)
	}
	// A new arrival re-arms its function.
	goGet(t, srv.URL+"/function/b")
	waitFor(t, "b queued again", func() bool { return d.queued("b") == 2 })
	rep = d.collectUrgent(time.Now())
	if m := metricFor(rep, "b"); m.GetQueued() != 2 {
		t.Errorf("b after a new arrival: %+v", m)
	}
	// a, whose calls still wait as its urgent report said, is left out:
	// the control plane takes it as last reported.
	if m := metricFor(rep, "a"); m != nil {
		t.Errorf("a, unchanged, in b's urgent report: %+v", m)
	}
	// One of a's callers leaves: the next urgent report (another of b's
	// calls) lists a with its new count, not as waiting with no capacity.
	leave()
	waitFor(t, "a's first caller gone", func() bool { return d.queued("a") == n-1 })
	goGet(t, srv.URL+"/function/b")
	waitFor(t, "b queued a third call", func() bool { return d.queued("b") == 3 })
	rep = d.collectUrgent(time.Now())
	if m := metricFor(rep, "a"); m.GetQueued() != n-1 || m.GetNoCapacity() {
		t.Errorf("a in b's urgent report after a caller left: %+v, want queued %d, not no-capacity", m, n-1)
	}
	// A new control-plane session (a restart, a new leader) knows nothing:
	// the next urgent report lists a again, unchanged as it is.
	d.forgetSent()
	goGet(t, srv.URL+"/function/b")
	waitFor(t, "b queued a fourth call", func() bool { return d.queued("b") == 4 })
	rep = d.collectUrgent(time.Now())
	if m := metricFor(rep, "a"); m.GetQueued() != n-1 {
		t.Errorf("a in the first urgent report of a new session: %+v, want queued %d", m, n-1)
	}
	// Release the waiters so the servers can close.
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"a", "b"}})
}

// TestReportsVisitOnlyActiveFunctions: the periodic and urgent reports
// walk the functions with load to report, not the whole table: an idle
// function is on no list, an active one is until it reported its first
// idle interval, and a new arrival lists it again.
func TestReportsVisitOnlyActiveFunctions(t *testing.T) {
	d, srv := newTestDP(t, nil)
	fns := []*briskv1.FunctionSpec{fnSpec("busy"), fnSpec("brief", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 1 })}
	for i := range 500 {
		fns = append(fns, fnSpec(fmt.Sprintf("idle-%d", i)))
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: fns})
	names := func(rep *briskv1.MetricsReport) []string {
		var out []string
		for _, m := range rep.GetFunctions() {
			out = append(out, m.GetFunction())
		}
		slices.Sort(out)
		return out
	}
	active := func() int {
		d.activeMu.Lock()
		defer d.activeMu.Unlock()
		return len(d.active)
	}
	if got := names(d.collect(time.Now(), time.Second)); len(got) != 0 || active() != 0 {
		t.Fatalf("no calls yet: report %v, %d active; want none", got, active())
	}
	goGet(t, srv.URL+"/function/busy")                            // waits: no sandbox
	recv(t, goGet(t, srv.URL+"/function/brief"), "brief's reply") // times out in its queue at once
	waitFor(t, "busy queued", func() bool { return d.queued("busy") == 1 })
	if got := names(d.collect(time.Now(), time.Second)); !slices.Equal(got, []string{"brief", "busy"}) || active() != 2 {
		t.Fatalf("after calls: report %v, %d active; want [brief busy], 2", got, active())
	}
	// brief's first idle interval is reported, then it leaves the list;
	// busy's call still waits.
	if got := names(d.collect(time.Now(), time.Second)); !slices.Equal(got, []string{"brief", "busy"}) || active() != 1 {
		t.Fatalf("brief's idle interval: report %v, %d active; want [brief busy], 1", got, active())
	}
	if got := names(d.collect(time.Now(), time.Second)); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("then: report %v, want [busy]", got)
	}
	recv(t, goGet(t, srv.URL+"/function/brief"), "brief's second reply")
	if got := names(d.collect(time.Now(), time.Second)); !slices.Equal(got, []string{"brief", "busy"}) {
		t.Fatalf("brief called again: report %v, want [brief busy]", got)
	}
	// A deleted function leaves the list (its waiter is failed).
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"busy"}})
	if got := names(d.collect(time.Now(), time.Second)); slices.Contains(got, "busy") {
		t.Fatalf("after busy's deletion: report %v lists it", got)
	}
	d.collect(time.Now(), time.Second) // brief's idle interval
	if n := active(); n != 0 {
		t.Fatalf("%d functions still active, want 0", n)
	}
}

// A quiet function is not cut while quiet (it is on no report's list), so
// its interval started long ago; its first average after waking is over the
// reporting interval, as when every function was cut every interval, not
// over the whole quiet spell.
func TestLoadAfterQuietSpellIsOverTheInterval(t *testing.T) {
	var s loadStats
	s.reset(0)
	const interval = 1000
	// An hour of nothing, then one call in flight for half the last
	// interval.
	now := int64(3600 * interval)
	if !s.arrive(now - interval/2) {
		t.Fatal("an arrival at a quiet function did not wake it")
	}
	s.depart(now)
	avg, req, report := s.cut(now, interval)
	if !report || req != 1 || math.Abs(avg-0.5) > 1e-9 {
		t.Fatalf("after the quiet spell: avg %v requests %d report %v; want 0.5, 1, true", avg, req, report)
	}
}

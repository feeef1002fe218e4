package dataplane

import (
	"math"
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
	avg, req, report := s.cut(100)
	// (50 + 50) load·ns over 100 ns.
	if !report || req != 2 || math.Abs(avg-1.0) > 1e-9 {
		t.Fatalf("interval 1: avg %v requests %d report %v; want 1.0, 2, true", avg, req, report)
	}
	// [100, 200): the second request is still in flight for the whole interval.
	avg, req, report = s.cut(200)
	if !report || req != 0 || avg != 1 {
		t.Fatalf("interval 2: avg %v requests %d report %v; want 1, 0, true", avg, req, report)
	}
	s.depart(250)
	avg, _, report = s.cut(300)
	if !report || avg != 0.5 {
		t.Fatalf("interval 3: avg %v report %v; want 0.5, true", avg, report)
	}
	// One zero interval is reported, then silence until activity.
	if avg, req, report = s.cut(400); !report || avg != 0 || req != 0 {
		t.Fatalf("first idle interval: %v %d %v; want reported zero", avg, req, report)
	}
	if _, _, report = s.cut(500); report {
		t.Fatal("second idle interval reported")
	}
	s.arrive(550)
	s.depart(560)
	if avg, req, report = s.cut(600); !report || req != 1 || math.Abs(avg-0.1) > 1e-9 {
		t.Fatalf("after activity: %v %d %v; want 0.1, 1, true", avg, req, report)
	}
}

func TestLoadStatsNewFunctionIsQuiet(t *testing.T) {
	var s loadStats
	s.reset(0)
	if _, _, report := s.cut(100); report {
		t.Fatal("a function that never saw a request reported")
	}
}

func TestUrgentReportsCoalesce(t *testing.T) {
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("a"), fnSpec("b")}})
	const n = 5
	for range n {
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
	// a, whose calls still wait but whose urgent report went earlier, is
	// listed with its counts: the control plane takes an urgent report as
	// every busy function of its data plane.
	if m := metricFor(rep, "a"); m.GetQueued() != n || m.GetNoCapacity() {
		t.Errorf("a in b's urgent report: %+v, want queued %d, not no-capacity", m, n)
	}
	// Release the waiters so the servers can close.
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"a", "b"}})
}

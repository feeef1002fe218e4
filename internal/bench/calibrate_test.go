package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// TestCalibrate places each record by its invocation's scheduled offset
// (time scale applied), keeps its response beyond runtime and queueing,
// takes the measured phase's cold waits' median, and refuses records of
// another schedule.
func TestCalibrate(t *testing.T) {
	cfg := ReplayConfig{TraceDir: moduleRoot(t) + "/traces/azure_500", Minutes: 2, Warmup: 1, TimeScale: 0.25, Seed: 42,
		IAT: "exponential", Granularity: "minute", MaxRuntime: 2 * time.Second}
	s, err := cfg.Schedule()
	if err != nil {
		t.Fatal(err)
	}
	// Three measured invocations scheduled in one window.
	var three []*workload.Invocation
	for i := range s.Invocations {
		inv := &s.Invocations[i]
		w := workload.ScaleOffset(inv.Offset, cfg.TimeScale) / CalibrationWindow
		if s.Phase(inv) != 2 || len(three) > 0 && workload.ScaleOffset(three[0].Offset, cfg.TimeScale)/CalibrationWindow != w {
			three = three[:0]
		}
		if s.Phase(inv) == 2 {
			if three = append(three, inv); len(three) == 3 {
				break
			}
		}
	}
	if len(three) != 3 {
		t.Fatal("no window with three measured invocations")
	}
	off := workload.ScaleOffset(three[0].Offset, cfg.TimeScale)
	rec := func(inv *workload.Invocation, cold bool, respUs, queueUs int64) workload.Record {
		start := time.Unix(1_700_000_000, 0).Add(workload.ScaleOffset(inv.Offset, cfg.TimeScale))
		return workload.Record{Phase: s.Phase(inv), StartTime: start.UnixMicro() + 300, LatenessUs: 300, Function: workload.FunctionName(s.Functions[inv.Func].Row), InvocationID: s.InvocationID(inv),
			Status: 200, RequestedUs: 1000, ResponseUs: respUs, QueueUs: queueUs, Cold: cold}
	}
	first := &s.Invocations[0]
	recs := []workload.Record{rec(three[0], true, 1000+70_000+5_000, 70_000), rec(three[1], true, 1000+50_000+3_000, 50_000),
		rec(three[2], true, 1000+90_000, 90_000), rec(first, false, 1000+800, 0)}
	c, err := Calibrate(cfg, recs)
	if err != nil {
		t.Fatal(err)
	}
	if c.Calls != 4 || c.ColdCalls != 3 || c.ColdWait != 70*time.Millisecond {
		t.Fatalf("calls %d, cold %d, cold wait %s: want 4, 3, 70ms", c.Calls, c.ColdCalls, c.ColdWait)
	}
	got := c.Overhead.Windows[off/CalibrationWindow]
	want := []time.Duration{5 * time.Millisecond, 3 * time.Millisecond, 0}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("window of offset %s: %v, want %v", off, got, want)
	}
	if w := c.Overhead.Windows[0]; len(w) != 1 || w[0] != 800*time.Microsecond {
		t.Fatalf("first window: %v, want [800µs]", w)
	}
	foreign := append(recs, workload.Record{Function: "trace-func-999999", InvocationID: "min0.inv0", Status: 200})
	if _, err := Calibrate(cfg, foreign); err == nil || !strings.Contains(err.Error(), "not in this schedule") {
		t.Fatalf("a record of another schedule: %v, want refused", err)
	}
	// Another time scale: the same invocations, sent at other offsets.
	bad := func(what, want string, edit func(r []workload.Record) []workload.Record) {
		t.Helper()
		if _, err := Calibrate(cfg, edit(append([]workload.Record(nil), recs...))); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want refused (%q)", what, err, want)
		}
	}
	bad("a record sent 2 s off its schedule", "off this schedule", func(r []workload.Record) []workload.Record { r[0].StartTime += 2_000_000; return r })
	bad("a record 584 years off (µs that would wrap as a Duration)", "off this schedule", func(r []workload.Record) []workload.Record {
		r[0].StartTime += 18446744073709552
		return r
	})
	bad("a response of 1e16 µs", "outside", func(r []workload.Record) []workload.Record { r[0].ResponseUs = 1e16; return r })
	bad("a negative queue wait", "outside", func(r []workload.Record) []workload.Record { r[1].QueueUs = -5_000_000; return r })
	bad("the file twice", "twice", func(r []workload.Record) []workload.Record { return append(r, r...) })
	bad("most calls failed", "completed", func(r []workload.Record) []workload.Record {
		for i := range r[:3] {
			r[i].Status = 503
		}
		return r
	})
}

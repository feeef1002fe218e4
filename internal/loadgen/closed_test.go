package loadgen

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// countingInvoker answers every call, tracking how many are in flight at
// once; a call for function "slow" takes a millisecond.
type countingInvoker struct {
	inflight, peak atomic.Int64
	calls          atomic.Int64
}

func (c *countingInvoker) Invoke(_ context.Context, call *Call) Reply {
	n := c.inflight.Add(1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
	c.calls.Add(1)
	time.Sleep(200 * time.Microsecond)
	c.inflight.Add(-1)
	return Reply{Status: 200, Function: call.Function, Response: 200 * time.Microsecond}
}

func TestClosedLoopKeepsItsCallersBusyAndNoMore(t *testing.T) {
	inv := &countingInvoker{}
	cl := &ClosedLoop{Invoker: inv, Callers: 4, Warmup: 50 * time.Millisecond, Duration: 200 * time.Millisecond, Functions: []string{"a", "b", "c"}, RuntimeMs: 3}
	recs, err := cl.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p := inv.peak.Load(); p != 4 {
		t.Fatalf("peak %d calls in flight, want the 4 callers", p)
	}
	if int64(len(recs)) != inv.calls.Load() || cl.Issued() != inv.calls.Load() || cl.Done() != inv.calls.Load() {
		t.Fatalf("%d records, %d issued, %d done for %d calls", len(recs), cl.Issued(), cl.Done(), inv.calls.Load())
	}
	warm, fns := 0, map[string]int{}
	for i, r := range recs {
		if r.Phase == 1 {
			warm++
			if i >= 1 && recs[i-1].Phase == 2 {
				t.Fatalf("record %d: warm-up after measured calls", i)
			}
			continue
		}
		if !r.OK() || r.RequestedUs != 3000 || r.StartTime == 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
		fns[r.Function]++
	}
	measured := len(recs) - warm
	if warm == 0 || measured == 0 {
		t.Fatalf("%d warm-up and %d measured calls, want both", warm, measured)
	}
	// Round-robin over all calls: each function gets a third, give or take
	// the warm-up's share.
	for _, f := range []string{"a", "b", "c"} {
		if n := fns[f]; n < measured/3-warm-1 || n > measured/3+warm+1 {
			t.Fatalf("function %s got %d of %d measured calls", f, n, measured)
		}
	}
	if s := workload.Summarize(recs); s.Completed != measured || s.ThroughputRPS <= 0 {
		t.Fatalf("summary %+v", s)
	}
}

func TestClosedLoopStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cl := &ClosedLoop{Invoker: &countingInvoker{}, Callers: 2, Duration: time.Hour, Functions: []string{"a"}}
	recs, err := cl.Run(ctx)
	if err == nil || len(recs) != 0 {
		t.Fatalf("cancelled loop: %d records, err %v", len(recs), err)
	}
	if _, err := (&ClosedLoop{Invoker: &countingInvoker{}, Duration: time.Second, Functions: []string{"a"}}).Run(context.Background()); err == nil {
		t.Fatal("a loop without callers ran")
	}
}

// stuckInvoker never answers calls to "stuck" until their context ends.
type stuckInvoker struct{ countingInvoker }

func (s *stuckInvoker) Invoke(ctx context.Context, call *Call) Reply {
	if call.Function == "stuck" {
		<-ctx.Done()
		return Reply{Err: ctx.Err()}
	}
	return s.countingInvoker.Invoke(ctx, call)
}

// A call that never returns holds the run for the grace period only; it is
// recorded as failed, and the other callers' calls as they came.
func TestClosedLoopBoundsCallsThatNeverReturn(t *testing.T) {
	cl := &ClosedLoop{Invoker: &stuckInvoker{}, Callers: 3, Duration: 100 * time.Millisecond, Grace: 50 * time.Millisecond, Functions: []string{"stuck", "ok"}}
	done := make(chan []workload.Record, 1)
	go func() {
		recs, err := cl.Run(context.Background())
		if err != nil {
			t.Error(err)
		}
		done <- recs
	}()
	var recs []workload.Record
	select {
	case recs = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a closed loop with a call that never returns did not end")
	}
	stuck, ok := 0, 0
	for _, r := range recs {
		switch {
		case r.Function == "stuck" && r.ConnTimeout && !r.OK():
			stuck++
		case r.Function == "ok" && r.OK():
			ok++
		default:
			t.Fatalf("record %+v", r)
		}
	}
	if stuck == 0 || stuck > 3 || ok == 0 {
		t.Fatalf("%d stuck and %d answered calls", stuck, ok)
	}
}

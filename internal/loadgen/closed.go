package loadgen

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// ClosedLoop sends calls closed-loop: each of Callers goroutines sends its
// next call as soon as the reply to its last one arrives, for Warmup
// (phase 1) and then Duration (phase 2). It measures a system's capacity —
// its saturation throughput — with a bounded number of calls in flight,
// where an open-loop generator pushed past a system's knee measures its
// collapse under a growing backlog as well.
type ClosedLoop struct {
	Invoker  Invoker
	Callers  int
	Warmup   time.Duration
	Duration time.Duration
	// Functions are called round-robin over all callers' calls.
	Functions []string
	// RuntimeMs is the runtime each call asks the function for.
	RuntimeMs int
	// Grace is how long calls still open when the measured phase ends are
	// awaited; then they are cancelled and recorded as connection
	// timeouts. 0: DefaultGrace.
	Grace time.Duration

	issued, done atomic.Int64
}

// Issued is the number of calls sent so far.
func (cl *ClosedLoop) Issued() int64 { return cl.issued.Load() }

// Done is the number of calls finished so far.
func (cl *ClosedLoop) Done() int64 { return cl.done.Load() }

// Run runs the loop and returns one record per call, phase-1 calls first.
// A call is sent only while its phase lasts; calls in flight when the
// measured phase ends are awaited for the grace period at most. It returns
// early with ctx's error.
func (cl *ClosedLoop) Run(ctx context.Context) ([]workload.Record, error) {
	if cl.Invoker == nil || cl.Callers <= 0 || cl.Duration <= 0 || len(cl.Functions) == 0 {
		return nil, errors.New("closed loop: needs an invoker, callers, a duration and functions")
	}
	start := time.Now()
	measureAt := start.Add(cl.Warmup)
	end := measureAt.Add(cl.Duration)
	// A call that never returns must not hold the run: calls run under a
	// context that ends a grace period after the last may be sent.
	callCtx, cancel := context.WithDeadline(ctx, end.Add(cmp.Or(cl.Grace, DefaultGrace)))
	defer cancel()
	var next atomic.Int64
	perCaller := make([][]workload.Record, cl.Callers)
	var wg sync.WaitGroup
	for k := range cl.Callers {
		wg.Go(func() {
			recs := make([]workload.Record, 0, 1024)
			for ctx.Err() == nil {
				now := time.Now()
				if !now.Before(end) {
					break
				}
				i := next.Add(1) - 1
				c := Call{Function: cl.Functions[int(i%int64(len(cl.Functions)))], RuntimeMs: cl.RuntimeMs, Phase: 2}
				if now.Before(measureAt) {
					c.Phase = 1
				}
				c.ID = "sec" + strconv.Itoa(int(now.Sub(start)/time.Second)) + ".inv" + strconv.FormatInt(i, 10)
				cl.issued.Add(1)
				rep := cl.Invoker.Invoke(callCtx, &c)
				sent := now
				if !rep.Sent.IsZero() {
					sent = rep.Sent
				}
				r := workload.Record{Phase: c.Phase, InvocationID: c.ID, Function: c.Function, RequestedUs: int64(c.RuntimeMs) * 1000,
					StartTime: sent.UnixMicro()}
				fill(&r, &rep)
				recs = append(recs, r)
				cl.done.Add(1)
			}
			perCaller[k] = recs
		})
	}
	wg.Wait()
	n := 0
	for _, recs := range perCaller {
		n += len(recs)
	}
	out := make([]workload.Record, 0, n)
	for phase := 1; phase <= 2; phase++ {
		for _, recs := range perCaller {
			for i := range recs {
				if recs[i].Phase == phase {
					out = append(out, recs[i])
				}
			}
		}
	}
	return out, ctx.Err()
}

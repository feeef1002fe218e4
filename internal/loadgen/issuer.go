package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// Call is one invocation to send.
type Call struct {
	Function  string
	Offset    time.Duration // from the start of the run, in real time (already time-scaled)
	RuntimeMs int
	MemoryMB  int
	Phase     int    // 1 warm-up, 2 measured
	ID        string // invocation id, min<m>.inv<k>
}

// Reply is what an Invoker observed for one call.
type Reply struct {
	// Sent is when the invoker began sending, on the Issuer's clock (time.Now
	// for RealClock); zero if it did not say. Response runs from Sent, as
	// the loader measures it, and the Issuer counts the time from the
	// scheduled send to Sent as lateness.
	Sent     time.Time
	Status   int   // HTTP status; 0 when no reply came
	Err      error // transport error, or a reply that could not be read
	Conn     time.Duration
	Response time.Duration // from the send to the last byte of the reply
	ExecUs   int64         // ExecutionTime from the function's reply
	MemoryMB int
	Function string // reply's Function field
	Sandbox  string
	QueueUs  int64
	Cold     bool
}

// Invoker sends one call and waits for its reply. It must be safe for
// concurrent use and honour ctx.
type Invoker interface {
	Invoke(ctx context.Context, c *Call) Reply
}

// Clock is the issuer's time source.
type Clock interface {
	Now() time.Time
	// SleepUntil returns once t has passed or ctx has ended.
	SleepUntil(ctx context.Context, t time.Time)
}

// RealClock is the monotonic wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) SleepUntil(ctx context.Context, t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	// Timers are reused: a driver at thousands of sends per second would
	// otherwise allocate one per send.
	tm := timers.Get().(*time.Timer)
	tm.Reset(d)
	select {
	case <-tm.C:
	case <-ctx.Done():
		tm.Stop()
	}
	timers.Put(tm)
}

// timers holds stopped or fired timers (Go ≥ 1.23: Reset on either is safe
// and a stale value is never delivered).
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// Defaults of an Issuer.
const (
	DefaultMaxInFlight = 50_000
	DefaultGrace       = 2 * time.Minute
)

// Issuer sends calls open-loop: one driver goroutine per function sleeps
// until each call's time, measured from one monotonic start so that timer
// overshoot never accumulates, and fires it in its own goroutine, so a slow
// reply never delays a send. Each send's lateness (actual − scheduled) is
// recorded. An Issuer runs once.
type Issuer struct {
	Invoker Invoker
	Clock   Clock // nil: RealClock
	// MaxInFlight bounds outstanding calls; a call due while that many are
	// outstanding is not sent and is recorded as failed ("generator
	// overload"), which also fails the lateness check. 0: DefaultMaxInFlight.
	MaxInFlight int
	// Grace is how long replies are awaited (in real time) after the last
	// send; calls still open then are cancelled and recorded as connection
	// timeouts. 0: DefaultGrace.
	Grace time.Duration
	// Start is the time of offset 0, on the Clock; zero: when Run begins.
	Start time.Time

	issued, done atomic.Int64
}

// Issued is the number of calls sent (or refused for overload) so far.
func (is *Issuer) Issued() int64 { return is.issued.Load() }

// Done is the number of calls finished so far.
func (is *Issuer) Done() int64 { return is.done.Load() }

// Run sends calls (in any order; each function's calls are sent in offset
// order) and returns one record per call, in the order of calls. It returns
// early with ctx's error, after cancelling what is in flight.
func (is *Issuer) Run(ctx context.Context, calls []Call) ([]workload.Record, error) {
	if is.Invoker == nil {
		return nil, errors.New("issuer: no invoker")
	}
	clk := cmp.Or[Clock](is.Clock, RealClock{})
	maxInFlight := int64(cmp.Or(is.MaxInFlight, DefaultMaxInFlight))
	grace := cmp.Or(is.Grace, DefaultGrace)

	byFn := make(map[string][]int)
	for i := range calls {
		byFn[calls[i].Function] = append(byFn[calls[i].Function], i)
	}
	for _, idx := range byFn {
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(calls[a].Offset, calls[b].Offset) })
	}

	recs := make([]workload.Record, len(calls))
	// Calls run under their own context: ctx ending cancels them, and so
	// does the grace period running out after the last send.
	callCtx, cancelCalls := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCalls()
	stopOn := context.AfterFunc(ctx, cancelCalls)
	defer stopOn()

	var inflight atomic.Int64
	var calling, drivers sync.WaitGroup
	start := is.Start
	if start.IsZero() {
		start = clk.Now()
	}
	for _, idx := range byFn {
		drivers.Add(1)
		go func() {
			defer drivers.Done()
			for _, i := range idx {
				c := &calls[i]
				at := start.Add(c.Offset)
				clk.SleepUntil(ctx, at)
				if ctx.Err() != nil {
					return
				}
				now := clk.Now()
				r := &recs[i]
				r.Phase, r.InvocationID, r.Function = c.Phase, c.ID, c.Function
				r.RequestedUs, r.MemoryMB = int64(c.RuntimeMs)*1000, c.MemoryMB
				r.StartTime, r.LatenessUs = now.UnixMicro(), now.Sub(at).Microseconds()
				is.issued.Add(1)
				if inflight.Add(1) > maxInFlight {
					inflight.Add(-1)
					r.ConnTimeout, r.Error = true, fmt.Sprintf("generator overload: %d calls in flight, call not sent", maxInFlight)
					is.done.Add(1)
					continue
				}
				calling.Add(1)
				go func() {
					defer calling.Done()
					rep := is.Invoker.Invoke(callCtx, c)
					if !rep.Sent.IsZero() {
						// The send really began when the invoker started it:
						// the wait for this goroutine to run is lateness too.
						r.StartTime, r.LatenessUs = rep.Sent.UnixMicro(), rep.Sent.Sub(at).Microseconds()
					}
					fill(r, &rep)
					inflight.Add(-1)
					is.done.Add(1)
				}()
			}
		}()
	}
	drivers.Wait()
	if err := ctx.Err(); err != nil {
		cancelCalls()
		calling.Wait()
		return recs, err
	}
	// Bounded wait for the replies: the grace period from the last send.
	finished := make(chan struct{})
	go func() { calling.Wait(); close(finished) }()
	// The grace is a safety bound in real time, whatever the Clock.
	graceTimer := time.NewTimer(grace)
	defer graceTimer.Stop()
	select {
	case <-finished:
	case <-graceTimer.C:
		cancelCalls()
		<-finished
	case <-ctx.Done():
		cancelCalls()
		<-finished
	}
	return recs, ctx.Err()
}

func fill(r *workload.Record, rep *Reply) {
	r.Status, r.ConnUs, r.ResponseUs = rep.Status, rep.Conn.Microseconds(), rep.Response.Microseconds()
	r.ActualUs, r.QueueUs, r.Cold, r.Sandbox = rep.ExecUs, rep.QueueUs, rep.Cold, rep.Sandbox
	r.Instance = cmp.Or(rep.Function, r.Function)
	if rep.MemoryMB > 0 {
		r.MemoryMB = rep.MemoryMB
	}
	switch {
	case rep.Err != nil && rep.Status == 0:
		r.ConnTimeout, r.Error = true, rep.Err.Error()
	case rep.Err != nil:
		r.FuncTimeout, r.Error = true, rep.Err.Error()
	case rep.Status != 200:
		r.FuncTimeout = true
	}
}

// Lateness bounds how far behind schedule a valid run may send.
type Lateness struct {
	// Late is the lateness above which a send counts as late.
	Late time.Duration
	// MaxFraction is the share of late sends a valid run tolerates.
	MaxFraction float64
}

// DefaultLateness: at most 1 % of sends more than 10 ms late. Ten
// milliseconds is a quarter of a 40 ms cold start and far above timer
// jitter; an issuer that misses it on more than 1 % of sends is starved of
// CPU, and the latencies it measured are not the system's.
var DefaultLateness = Lateness{Late: 10 * time.Millisecond, MaxFraction: 0.01}

// ErrBehind marks a run whose sends fell behind schedule.
var ErrBehind = errors.New("the load generator fell behind its schedule")

// Check returns an error wrapping ErrBehind, with the numbers, when more
// than MaxFraction of the measured (not phase-1) sends were later than
// Late, or when any measured call was not sent (cut short, or refused for
// generator overload).
func (l Lateness) Check(recs []workload.Record) error {
	if len(recs) == 0 {
		return nil
	}
	late, unsent, n := 0, 0, 0
	lat := make([]float64, 0, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.Phase == 1 {
			continue // warm-up sends are not measured
		}
		n++
		if r.StartTime == 0 {
			unsent++
			continue
		}
		if r.Error != "" && r.Status == 0 && r.ConnTimeout && isOverload(r.Error) {
			unsent++
		}
		lat = append(lat, float64(r.LatenessUs))
		if time.Duration(r.LatenessUs)*time.Microsecond > l.Late {
			late++
		}
	}
	if n == 0 {
		return nil
	}
	slices.Sort(lat)
	frac := float64(late) / float64(n)
	if unsent > 0 || frac > l.MaxFraction {
		return fmt.Errorf("%w: %d of %d measured sends (%.2f%%) were more than %s late, limit %.2f%% (lateness p99 %.1f ms, max %.1f ms); %d calls not sent",
			ErrBehind, late, n, 100*frac, l.Late, 100*l.MaxFraction,
			workload.Percentile(lat, 99)/1000, lastOr(lat)/1000, unsent)
	}
	return nil
}

func isOverload(s string) bool { return len(s) >= 19 && s[:19] == "generator overload:" }

func lastOr(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}

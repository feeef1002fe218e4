package async

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Policy is one function's async settings (spec `async:` block).
type Policy struct {
	MaxAttempts int           // attempts in all, the first included
	MaxAge      time.Duration // from submit; older calls are dead
	Backoff     time.Duration // delay before the second attempt; doubles
	BackoffMax  time.Duration // cap of the delay
	// RetryFunctionErrors retries the function's own 5xx replies, not
	// only the platform's failures.
	RetryFunctionErrors bool
	// Concurrency bounds this consumer's running calls of the function.
	Concurrency int
	// UID is the function's identity now (spec.Function.UID): a call
	// submitted to another (deleted) function of the name is dead.
	UID string
}

// Invoker runs calls: the data plane, through its normal invocation path.
type Invoker interface {
	// Policy returns the function's settings; false: no such function.
	Policy(ctx context.Context, fn string) (Policy, bool)
	// Invoke runs c once and returns the reply, its body cut at maxBody.
	// A call that could not be sent at all has a Result with
	// PlatformError set (and Status 0 when there was no reply).
	Invoke(ctx context.Context, c *Call, maxBody int) Result
}

const hdrDeadReason = "Brisk-Dead-Reason"

// hdrRequeued marks a call put back at the queue's tail (requeue): its
// attempts so far are in its record.
const hdrRequeued = "Brisk-Requeued"

// requeue stores msg's call again at the stream's tail.
func (q *Queue) requeue(ctx context.Context, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return err
	}
	out := nats.NewMsg(msg.Subject())
	for k, v := range msg.Headers() {
		out.Header[k] = v
	}
	_, id, _ := splitSubject(msg.Subject())
	out.Header.Set(jetstream.MsgIDHeader, id+".requeue."+strconv.FormatUint(meta.Sequence.Stream, 10))
	out.Header.Set(hdrRequeued, "1")
	out.Data = msg.Data()
	_, err = q.js.PublishMsg(ctx, out)
	return err
}

// pullExpiry bounds one pull request of the consumer; pullBatch is the
// most calls one asks for.
const (
	pullExpiry = time.Second
	pullBatch  = 256
)

// runningAfter is how long an attempt runs before its record says running.
const runningAfter = 50 * time.Millisecond

// deferHold (plus up to a quarter more) is how long a call whose function
// holds its share of a consumer's slots waits, holding its own, before it
// goes back to the queue, and how long it stays there before it is
// delivered again.
const deferHold = time.Second

// Run delivers calls to inv until ctx ends. Every data plane runs one; the
// shared durable consumer gives each call to one of them at a time.
//
// It pulls with one request at a time, for as many calls as it has free
// slots (at most pullBatch), each request ending when it is filled or
// after pullExpiry. The JetStream client's continuous iterator (Messages)
// stalled here: with a backlog pending, the server holding no request of
// ours and nothing in flight, its Next waited out the whole expiry (2 s at
// a time, several times per 100,000-call drain; docs/benchmarks.md): its
// own count of what its requests still had coming went wrong. A request
// whose calls have all arrived, or which expired, is simply followed by
// the next.
func (q *Queue) Run(ctx context.Context, inv Invoker) error {
	go q.watchDepth(ctx)
	slots := make(chan struct{}, q.cfg.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	lim := &fnLimits{m: map[string]*fnLimit{}, slots: q.cfg.MaxInFlight}
	batchMax := min(q.cfg.MaxInFlight, pullBatch)
	failures := 0
	for {
		// Wait for one free slot, then take the others free now.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		n := 1
	take:
		for n < batchMax {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break take
			}
		}
		// The server ends the request a little before the context (the
		// client's rule); the context ends it at once when Run stops.
		fctx, cancel := context.WithTimeout(ctx, pullExpiry)
		batch, err := q.cons.Fetch(n, jetstream.FetchContext(fctx))
		got := 0
		if err == nil {
			for msg := range batch.Messages() {
				got++
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-slots }()
					q.deliver(ctx, inv, lim, msg)
				}()
			}
			err = batch.Error()
		}
		cancel()
		for range n - got {
			<-slots
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded):
			failures = 0
		default:
			// The server is away (restarting, a leader changing): try
			// again soon, without spinning.
			failures++
			q.cfg.Logger.Warn("async: consume", "err", err)
			t := time.NewTimer(min(time.Duration(failures)*100*time.Millisecond, 2*time.Second))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
		}
	}
}

// fnLimits holds each function's concurrency semaphore on this consumer.
// A function's calls may hold at most half of a consumer's slots (running
// or waiting for the function's concurrency), so that one function's
// backlog cannot keep other functions' calls from being fetched. A call
// past that waits a moment (deferHold) holding its slot, which bounds how
// fast such calls cycle through the queue, and then goes back to it.
type fnLimits struct {
	mu    sync.Mutex
	m     map[string]*fnLimit
	slots int // the consumer's MaxInFlight
}

type fnLimit struct {
	sem  chan struct{}
	held int // calls of the function holding a slot: running or waiting; guarded by fnLimits.mu
}

// enter takes a running slot of fn (concurrency n), waiting for it while
// the function holds fewer than its share of the consumer's slots. ok
// false: it holds its share already, or ctx ended.
func (l *fnLimits) enter(ctx context.Context, fn string, n int) (release func(), ok bool) {
	n = max(n, 1)
	l.mu.Lock()
	fl, found := l.m[fn]
	if !found || cap(fl.sem) != n {
		fl = &fnLimit{sem: make(chan struct{}, n)}
		l.m[fn] = fl
	}
	if fl.held >= max(n, l.slots/2) {
		l.mu.Unlock()
		return nil, false
	}
	fl.held++
	l.mu.Unlock()
	leave := func() {
		l.mu.Lock()
		fl.held--
		l.mu.Unlock()
	}
	select {
	case fl.sem <- struct{}{}:
		return func() { <-fl.sem; leave() }, true
	case <-ctx.Done():
		leave()
		return nil, false
	}
}

// priorAttempts reads call c's record: the attempts made so far, and
// whether the call was settled already (its consumer died between the
// final record and the acknowledgement). A record of another function
// under the same id is not this call's.
func (q *Queue) priorAttempts(ctx context.Context, c *Call) (int, bool) {
	e, err := q.status.Get(ctx, c.ID)
	if err != nil {
		return 0, false
	}
	var r Record
	if json.Unmarshal(e.Value(), &r) != nil || r.Function != c.Function {
		return 0, false
	}
	return r.Attempts, r.Status.Final()
}

// deliver makes one attempt of one call and settles its message.
func (q *Queue) deliver(ctx context.Context, inv Invoker, lim *fnLimits, msg jetstream.Msg) {
	c, err := decodeCall(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		q.cfg.Logger.Error("async: dropping a malformed call", "subject", msg.Subject(), "err", err)
		_ = msg.TermWithReason("malformed")
		return
	}
	// Attempts are counted in the call's record, not by JetStream's
	// deliveries: a call put back because its function was busy here has
	// not been attempted. A first delivery has no attempts before it (a
	// retry by hand is a new message whose record says 0), so only a
	// redelivery reads the record.
	attempt := 1
	if meta, err := msg.Metadata(); err != nil || meta.NumDelivered > 1 || msg.Headers().Get(hdrRequeued) != "" {
		prior, settled := q.priorAttempts(ctx, c)
		if settled {
			_ = msg.Ack()
			return
		}
		attempt = prior + 1
	}
	// Keep the message ours while it waits and runs.
	alive := q.keepInProgress(msg)
	defer alive()

	pol, ok := inv.Policy(ctx, c.Function)
	if !ok {
		if ctx.Err() != nil {
			_ = msg.Nak()
			return
		}
		q.settle(ctx, msg, c, &Record{Status: StatusDead, Attempts: attempt - 1, Error: "function " + c.Function + " no longer exists"}, nil)
		return
	}
	if c.FunctionUID != "" && pol.UID != "" && c.FunctionUID != pol.UID {
		q.settle(ctx, msg, c, &Record{Status: StatusDead, Attempts: attempt - 1,
			Error: "function " + c.Function + " it was submitted to was deleted (a function of that name made since is another)"}, nil)
		return
	}
	if age := q.now().Sub(c.Submitted); pol.MaxAge > 0 && age > pol.MaxAge {
		q.settle(ctx, msg, c, &Record{Status: StatusDead, Attempts: attempt - 1, Error: fmt.Sprintf("older than the function's async.max_age %s", pol.MaxAge)}, nil)
		return
	}
	release, ok := lim.enter(ctx, c.Function, pol.Concurrency)
	if !ok {
		if ctx.Err() == nil {
			q.m.deferred.WithLabelValues(c.Function).Inc()
			t := time.NewTimer(deferHold + time.Duration(rand.Int64N(int64(deferHold)/4)))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		// To the queue's tail, not back in place: JetStream redelivers
		// before it delivers new messages, so a call put back in place
		// would come back ahead of the other functions' calls forever.
		if ctx.Err() == nil && q.requeue(ctx, msg) == nil {
			_ = msg.Ack()
			return
		}
		_ = msg.NakWithDelay(deferHold)
		return
	}
	if !q.yield.enter(ctx) {
		release()
		_ = msg.Nak() // we are stopping: another consumer takes it
		return
	}
	start := q.now()
	// The running record is written only for a call still running after
	// runningAfter: a short call's final record follows at once, and one
	// write fewer is a third of what the queue costs a call.
	// The lock orders the two writes: a running record is sent (on the
	// connection every later write takes too) before the attempt is
	// marked done, or not at all, so it can never land after the final one.
	var runMu sync.Mutex
	attemptDone := false
	running := time.AfterFunc(runningAfter, func() {
		runMu.Lock()
		defer runMu.Unlock()
		if !attemptDone {
			q.putStatusAsync(&Record{ID: c.ID, Function: c.Function, FunctionUID: c.FunctionUID, Status: StatusRunning, Attempts: attempt, SubmittedAt: c.Submitted, StartedAt: &start, CallbackURL: c.CallbackURL})
		}
	})
	res := inv.Invoke(ctx, c, q.cfg.MaxResultBytes)
	q.yield.leave()
	running.Stop()
	runMu.Lock()
	attemptDone = true
	runMu.Unlock()
	release()
	end := q.now()
	res.Seconds = end.Sub(start).Seconds()
	if ctx.Err() != nil && res.Status == 0 {
		_ = msg.Nak() // we are stopping: another consumer takes it
		return
	}
	rec := &Record{Attempts: attempt, StartedAt: &start, FinishedAt: &end, Result: &res}
	retry, why := classify(&res, pol)
	switch {
	case !retry && res.Status >= 200 && res.Status < 400:
		rec.Status = StatusSucceeded
		q.m.delivered.WithLabelValues(c.Function, string(StatusSucceeded)).Inc()
		q.settle(ctx, msg, c, rec, inv)
		return
	case !retry:
		rec.Status, rec.Error = StatusFailed, why
		q.settle(ctx, msg, c, rec, inv)
		return
	}
	delay := backoff(pol, attempt)
	next := end.Add(delay)
	switch {
	case pol.MaxAttempts > 0 && attempt >= pol.MaxAttempts:
		rec.Status, rec.Error = StatusDead, fmt.Sprintf("%s; gave up after %d attempts (async.max_attempts)", why, attempt)
		q.settle(ctx, msg, c, rec, inv)
	case pol.MaxAge > 0 && next.Sub(c.Submitted) > pol.MaxAge:
		rec.Status, rec.Error = StatusDead, fmt.Sprintf("%s; the next attempt would be past async.max_age %s", why, pol.MaxAge)
		q.settle(ctx, msg, c, rec, inv)
	default:
		rec.ID, rec.Function, rec.FunctionUID, rec.SubmittedAt, rec.CallbackURL = c.ID, c.Function, c.FunctionUID, c.Submitted, c.CallbackURL
		rec.Status, rec.Error, rec.NextAttemptAt = StatusQueued, why, &next
		q.putStatusAsync(q.stored(ctx, rec))
		q.m.retried.WithLabelValues(c.Function).Inc()
		_ = msg.NakWithDelay(delay)
	}
}

// classify says whether an attempt's outcome is worth another attempt, and
// why it failed.
func classify(res *Result, pol Policy) (retry bool, why string) {
	if res.PlatformError != "" {
		why = fmt.Sprintf("brisk answered %d %s", res.Status, res.PlatformError)
		switch res.PlatformError {
		case "function-timeout":
			return pol.RetryFunctionErrors, why
		case "no-function", "function-deleted", "bad-request", "body-too-large", "unauthorized", "forbidden":
			return false, why
		}
		return true, why // capacity, queueing, sandbox failures, shutdown: the platform's
	}
	switch {
	case res.Status == http.StatusTooManyRequests:
		return true, "the function answered 429"
	case res.Status >= 500:
		return pol.RetryFunctionErrors, fmt.Sprintf("the function answered %d", res.Status)
	case res.Status >= 400:
		return false, fmt.Sprintf("the function answered %d", res.Status)
	}
	return false, ""
}

// backoff is the delay after attempt n (1-based): Backoff·2^(n-1), capped,
// plus up to 10% jitter so that calls failed together do not return
// together.
func backoff(p Policy, n int) time.Duration {
	d := p.Backoff
	if d <= 0 {
		d = time.Second
	}
	for i := 1; i < n && d < p.BackoffMax; i++ {
		d *= 2
	}
	if p.BackoffMax > 0 && d > p.BackoffMax {
		d = p.BackoffMax
	}
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}

// settle ends a call: final record, dead letter when it did not succeed,
// callback, then the message leaves the queue. Each step is safe to repeat
// if this consumer dies before the ack (the dead letter is de-duplicated).
//
// The writes outlive ctx (bounded by the publish timeout): an attempt that
// ended as its data plane stops must still leave its record before its
// message leaves the queue, or its result would be lost.
func (q *Queue) settle(ctx context.Context, msg jetstream.Msg, c *Call, rec *Record, inv Invoker) {
	wctx := context.WithoutCancel(ctx)
	rec.ID, rec.Function, rec.FunctionUID, rec.SubmittedAt, rec.CallbackURL = c.ID, c.Function, c.FunctionUID, c.Submitted, c.CallbackURL
	if rec.Status != StatusSucceeded {
		dm := nats.NewMsg(subject(deadPrefix, c.Function, c.ID))
		dm.Header = msg.Headers()
		dm.Header.Del(jetstream.MsgIDHeader)
		meta, _ := msg.Metadata()
		seq := uint64(0)
		if meta != nil {
			seq = meta.Sequence.Stream
		}
		dm.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("dead-%s-%d", c.ID, seq))
		dm.Header.Set(hdrDeadReason, rec.Error)
		dm.Data = msg.Data()
		if _, err := q.js.PublishMsg(wctx, dm); err != nil {
			q.cfg.Logger.Warn("async: dead letter not stored; the call stays queued", "call", c.ID, "err", err)
			_ = msg.NakWithDelay(time.Second)
			return
		}
		if rec.Status == StatusDead {
			q.m.dead.WithLabelValues(c.Function).Inc()
		} else {
			q.m.delivered.WithLabelValues(c.Function, string(StatusFailed)).Inc()
		}
	}
	if c.CallbackURL != "" && rec.Result != nil {
		rec.Callback = q.callback(ctx, c, rec)
	}
	if err := q.putStatus(wctx, q.stored(wctx, rec)); err != nil {
		q.cfg.Logger.Warn("async: status record not stored", "call", c.ID, "err", err)
	}
	// The final record is stored: a lost ack only redelivers a call that
	// the record shows settled, and that is acknowledged without running.
	if err := msg.Ack(); err != nil {
		q.cfg.Logger.Warn("async: ack", "call", c.ID, "err", err)
	}
}

// keepInProgress tells JetStream every AckWait/3 that msg is still being
// worked on; the returned func stops it.
func (q *Queue) keepInProgress(msg jetstream.Msg) func() {
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	t = time.AfterFunc(q.cfg.AckWait/3, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			_ = msg.InProgress()
			t.Reset(q.cfg.AckWait / 3)
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

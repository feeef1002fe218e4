package trigger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Queue takes the calls triggers make: *async.Queue.
type Queue interface {
	Submit(ctx context.Context, c *async.Call) error
}

// Config configures a Runner.
type Config struct {
	Queue Queue
	// NATS is the cluster's NATS connection (the async queue's), for
	// NATS triggers without a URL; nil: such triggers fail, saying so.
	NATS *nats.Conn
	// Secret returns a secret's value (a NATS trigger's credentials).
	Secret func(namespace, name string) ([]byte, bool)
	// Record persists the last tick a cron trigger fired, so that a
	// control plane taking over neither repeats nor loses ticks.
	Record func(key string, tick time.Time) error
	// OutboundAllow lists address ranges external NATS servers may be at
	// besides public ones (loopback, private and link-local addresses are
	// refused unless listed: a trigger is the platform connecting on a
	// tenant's behalf).
	OutboundAllow []netip.Prefix
	// Workers is how many calls one NATS trigger queues at once; default
	// 32.
	Workers int
	Clock   clock.Clock
	Logger  *slog.Logger
}

// Entry is a trigger as the registry holds it.
type Entry struct {
	Trigger spec.Trigger
	// LastTick is where a cron trigger's ticks count from.
	LastTick time.Time
}

// Key is the entry's registry key (namespace/name).
func (e *Entry) Key() string { return spec.TriggerNamespace(&e.Trigger) + "/" + e.Trigger.Name }

// Runner runs the triggers it is given while Run runs: on the control
// plane, only the leader's does.
type Runner struct {
	cfg  Config
	clk  clock.Clock
	log  *slog.Logger
	wake chan struct{}
	lag  *lagHistograms

	mu   sync.Mutex
	ctx  context.Context // Run's; nil before and after
	jobs map[string]*job
}

// job is one trigger's running state.
type job struct {
	e     Entry
	sched Schedule // cron
	stats *stats   // kept when the trigger is replaced (paused, resumed)
	// cron: the last tick fired and the next one (the cron loop's).
	last, next time.Time
	// retryAt holds off a firing the queue refused.
	retryAt time.Time
	// nats: stop ends its subscription; done is closed when it has.
	stop   context.CancelFunc
	done   chan struct{}
	remove atomic.Bool
}

// stats are a trigger's counts since this runner started it.
type stats struct {
	fired, failed atomic.Uint64
	mu            sync.Mutex
	lastErr       string
	next          time.Time
	lastTick      time.Time
}

func (s *stats) fail(err error) {
	s.failed.Add(1)
	s.mu.Lock()
	s.lastErr = err.Error()
	s.mu.Unlock()
}

func (s *stats) clearErr() {
	s.mu.Lock()
	s.lastErr = ""
	s.mu.Unlock()
}

func (s *stats) ok() {
	s.fired.Add(1)
	s.mu.Lock()
	s.lastErr = ""
	s.mu.Unlock()
}

// New returns a runner; Run starts it.
func New(cfg Config) *Runner {
	if cfg.Workers == 0 {
		cfg.Workers = 32
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, clk: clock.Or(cfg.Clock), log: cfg.Logger, wake: make(chan struct{}, 1), jobs: map[string]*job{}, lag: newLagHistograms()}
}

// Put adds or replaces a trigger.
func (r *Runner) Put(e Entry) {
	j := &job{e: e, last: e.LastTick, stats: &stats{}}
	if e.Trigger.Cron != nil {
		s, err := spec.ParseSchedule(e.Trigger.Cron)
		if err != nil { // validated when stored: a zone gone from the system's database
			j.stats.fail(err)
		}
		j.sched = s
	}
	r.mu.Lock()
	old := r.jobs[e.Key()]
	if old != nil && old.e.Trigger.UID == e.Trigger.UID {
		j.stats = old.stats
		if old.last.After(j.last) { // fired, not recorded
			j.last = old.last
		}
	}
	r.jobs[e.Key()] = j
	ctx := r.ctx
	r.mu.Unlock()
	if old != nil {
		r.stopNATS(old, false)
	}
	if ctx != nil && e.Trigger.NATS != nil && !e.Trigger.Paused {
		r.startNATS(ctx, j)
	}
	r.poke()
}

// Remove stops and forgets a deleted trigger (and its durable consumer).
func (r *Runner) Remove(key string) {
	r.mu.Lock()
	j := r.jobs[key]
	delete(r.jobs, key)
	r.mu.Unlock()
	if j != nil {
		r.stopNATS(j, true)
	}
	r.poke()
}

func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Status is what a trigger has done since this runner started it.
func (r *Runner) Status(key string) api.TriggerStatus {
	r.mu.Lock()
	j := r.jobs[key]
	r.mu.Unlock()
	if j == nil {
		return api.TriggerStatus{State: "unknown"}
	}
	st := api.TriggerStatus{State: "active", Fired: j.stats.fired.Load(), Failed: j.stats.failed.Load()}
	j.stats.mu.Lock()
	st.LastError, st.Next, st.LastTick = j.stats.lastErr, j.stats.next, j.stats.lastTick
	j.stats.mu.Unlock()
	if st.LastTick.IsZero() && j.e.Trigger.Cron != nil {
		st.LastTick = j.e.LastTick
	}
	switch {
	case j.e.Trigger.Paused:
		st.State, st.Next = "paused", time.Time{}
	case st.LastError != "":
		st.State = "failing"
	}
	if st.Next.IsZero() && j.sched != nil && !j.e.Trigger.Paused {
		st.Next = j.sched.Next(r.clk.Now())
	}
	return st
}

// Run fires cron triggers and runs NATS subscriptions until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	r.mu.Lock()
	r.ctx = ctx
	for _, j := range r.jobs {
		if j.e.Trigger.NATS != nil && !j.e.Trigger.Paused {
			r.startNATS(ctx, j)
		}
	}
	r.mu.Unlock()
	r.cronLoop(ctx)
	r.mu.Lock()
	r.ctx = nil
	jobs := make([]*job, 0, len(r.jobs))
	for _, j := range r.jobs {
		jobs = append(jobs, j)
	}
	r.mu.Unlock()
	for _, j := range jobs {
		r.stopNATS(j, false)
	}
}

// retryAfter is how soon a cron firing the queue refused is tried again.
const retryAfter = time.Second

// cronLoop fires due ticks and sleeps until the next one (or a change).
func (r *Runner) cronLoop(ctx context.Context) {
	sem := make(chan struct{}, 64)
	for {
		now := r.clk.Now()
		var wakeAt time.Time
		earliest := func(t time.Time) {
			if !t.IsZero() && (wakeAt.IsZero() || t.Before(wakeAt)) {
				wakeAt = t
			}
		}
		r.mu.Lock()
		var due []*job
		for _, j := range r.jobs {
			if j.sched == nil || j.e.Trigger.Paused {
				continue
			}
			if now.Before(j.retryAt) {
				earliest(j.retryAt)
				continue
			}
			p := PlanCron(j.sched, j.last, now, j.e.Trigger.Cron.CatchUp)
			if p.Fire.IsZero() {
				if p.Cursor.After(j.last) { // ticks skipped (catch_up skip)
					j.last = p.Cursor
					r.log.Info("cron ticks skipped", "trigger", j.e.Key(), "missed", p.Missed, "through", p.Cursor)
				}
				j.next = p.Next
				j.stats.mu.Lock()
				j.stats.next = p.Next
				j.stats.mu.Unlock()
				earliest(p.Next)
				continue
			}
			if p.Missed > 0 {
				r.log.Info("cron ticks missed: firing the latest once", "trigger", j.e.Key(), "missed", p.Missed, "tick", p.Fire)
			}
			j.next = p.Fire // fired below; the plan after it is computed next pass
			due = append(due, j)
		}
		r.mu.Unlock()
		var wg sync.WaitGroup
		for _, j := range due {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				tick := j.next
				if err := r.fireCron(ctx, j, tick); err != nil {
					j.stats.fail(err)
					r.log.Warn("cron trigger not fired", "trigger", j.e.Key(), "tick", tick, "err", err)
					r.mu.Lock()
					j.retryAt = r.clk.Now().Add(retryAfter)
					r.mu.Unlock()
					return
				}
				r.mu.Lock()
				j.last = tick
				r.mu.Unlock()
			}()
		}
		wg.Wait()
		if len(due) > 0 {
			continue // plan again from the ticks just fired
		}
		var timer <-chan time.Time
		if !wakeAt.IsZero() {
			timer = r.clk.After(max(wakeAt.Sub(r.clk.Now()), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-timer:
		}
	}
}

// fireCron queues tick's call and records the tick; an error leaves it
// to be retried.
func (r *Runner) fireCron(ctx context.Context, j *job, tick time.Time) error {
	t := &j.e.Trigger
	id := CronCallID(t.UID, tick)
	h := http.Header{}
	var body []byte
	if t.Cron.Payload != "" {
		body = []byte(t.Cron.Payload)
		h.Set("Content-Type", cmp.Or(t.Cron.ContentType, "text/plain; charset=utf-8"))
	}
	addHeaders(h, t.Headers, id, tick)
	h["X-Brisk-Trigger"] = []string{j.e.Key()}
	h["X-Brisk-Trigger-Time"] = []string{tick.UTC().Format(time.RFC3339)}
	c := &async.Call{ID: id, Function: t.Function, Method: http.MethodPost, Path: cmp.Or(t.Path, "/"),
		Header: h, Body: body, Host: "brisk-trigger", FunctionUID: t.FunctionUID}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := r.cfg.Queue.Submit(sctx, c)
	if err != nil {
		// A refused submit is retried after retryAfter; the tick stays
		// due (or is superseded by the next one).
		return fmt.Errorf("queueing tick %s: %w", tick.UTC().Format(time.RFC3339), err)
	}
	now := r.clk.Now()
	r.lag.observe(spec.TriggerCron, now.Sub(tick))
	j.stats.ok()
	j.stats.mu.Lock()
	j.stats.lastTick = tick
	j.stats.mu.Unlock()
	if r.cfg.Record != nil {
		if err := r.cfg.Record(j.e.Key(), tick); err != nil {
			// The call is queued; a control plane taking over fires the
			// tick again under the same id, which the queue stores once.
			r.log.Warn("cron tick fired but not recorded", "trigger", j.e.Key(), "tick", tick, "err", err)
		}
	}
	return nil
}

// CallIDPrefix starts every call id a trigger makes.
const CallIDPrefix = async.TriggerIDPrefix

// CronCallID is the id of a cron trigger's call for tick: the same on
// every control plane, so a tick fired twice is queued once.
func CronCallID(uid string, tick time.Time) string {
	return CallIDPrefix + uid + "-" + strconv.FormatInt(tick.Unix(), 10)
}

// MessageCallID is the id of the call made of a JetStream trigger's
// message seq (its stream sequence).
func MessageCallID(uid string, seq uint64) string {
	return CallIDPrefix + uid + "-m" + strconv.FormatUint(seq, 10)
}

// addHeaders adds a trigger's own headers to a call's; with
// Ce-Specversion among them the call is a CloudEvent in binary mode, whose
// id is the call's and whose time the tick's (the message's arrival).
func addHeaders(h http.Header, own map[string]string, id string, at time.Time) {
	for k, v := range own {
		h.Set(k, v)
	}
	if h.Get("Ce-Specversion") == "" {
		return
	}
	if h.Get("Ce-Id") == "" {
		h.Set("Ce-Id", id)
	}
	if h.Get("Ce-Time") == "" {
		h.Set("Ce-Time", at.UTC().Format(time.RFC3339Nano))
	}
}

// permanent reports whether a submit can never succeed (the message, not
// the moment, is wrong).
func permanent(err error) bool {
	return errors.Is(err, async.ErrTooLarge) || errors.Is(err, async.ErrBadID) || errors.Is(err, async.ErrIDTaken)
}

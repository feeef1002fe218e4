package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/trigger"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// replay --triggers: the trace's timer functions are called by cron
// triggers and its queue functions by NATS triggers, not by the load
// generator (docs/triggers.md, "Replaying a trace's triggers").
//
//   - A timer function fires at its calls' times spread evenly over their
//     columns (workload.Schedule.SpreadTimers); its trigger is "@every P"
//     from the first firing (CronSource.Start), P the mean interval between
//     its firings in the window (rounded to a second; one firing: once).
//     The ticks are those of the trigger, which the trace's counts
//     approximate; each is one measured call when it falls in the measured
//     minutes. The payload asks the function's median runtime and memory.
//   - A queue function's calls are messages the generator publishes at
//     their times to a JetStream stream; its trigger (a durable consumer
//     on its subject) makes each an asynchronous call.
//
// A trigger-made call's record comes from the queue's record of it: its
// response time runs from the tick (or the publish) to the call's finish,
// and cold and ExecutionTime come from its result.

// replayTriggerLead is how long after the triggers are made the schedule
// starts: their first ticks are not in the past when they arrive.
const replayTriggerLead = 2 * time.Second

// timerTrigger is one timer function's cron trigger.
type timerTrigger struct {
	fn       string
	start    time.Duration // first tick, from the schedule's start
	every    time.Duration
	payload  string
	ticks    []time.Duration // from the schedule's start, within the window
	phases   []int
	requestU int64 // requested runtime, µs
	memoryMB int
	uid      string
	deleted  bool
}

// replayTriggers holds a replay's triggers and what was published.
type replayTriggers struct {
	timers   []*timerTrigger
	subjects map[string]string // queue function → subject
	uids     map[string]string // queue function → trigger uid
	stream   string
	js       jetstream.JetStream
	http     loadgen.Invoker
	seqs     sync.Map // queueKey → stream sequence
}

func queueKey(fn, id string) string { return fn + "/" + id }

// planTriggers decides the triggers of s's timer and queue functions and
// returns the calls the generator still makes itself. calls[i] is
// s.Invocations[i]'s call; fns the registered functions by index.
func planTriggers(s *workload.Schedule, calls []loadgen.Call, fns []*spec.Function, timeScale float64) (*replayTriggers, []loadgen.Call) {
	rt := &replayTriggers{subjects: map[string]string{}, uids: map[string]string{}}
	_, fires := s.SpreadTimers()
	window := workload.ScaleOffset(time.Duration(s.Columns)*s.Granularity.Period(), timeScale)
	warm := workload.ScaleOffset(time.Duration(s.WarmupColumns)*s.Granularity.Period(), timeScale)
	byFn := map[int32][]int{} // timer function → its calls
	var rest []loadgen.Call
	for i := range s.Invocations {
		f := s.Invocations[i].Func
		switch s.Functions[f].Trigger {
		case workload.TriggerTimer:
			byFn[f] = append(byFn[f], i)
			continue
		case workload.TriggerQueue:
			rt.subjects[fns[f].Name] = ""
		}
		rest = append(rest, calls[i])
	}
	for _, f := range slices.Sorted(maps.Keys(fires)) {
		offs := fires[f]
		first := workload.ScaleOffset(offs[0], timeScale).Round(time.Second)
		every := 24 * time.Hour // one firing: once in the window
		if n := len(offs); n > 1 {
			every = max(workload.ScaleOffset((offs[n-1]-offs[0])/time.Duration(n-1), timeScale).Round(time.Second), time.Second)
		}
		ms := make([]int, 0, len(byFn[f]))
		mb := make([]int, 0, len(byFn[f]))
		for _, i := range byFn[f] {
			ms, mb = append(ms, calls[i].RuntimeMs), append(mb, calls[i].MemoryMB)
		}
		slices.Sort(ms)
		slices.Sort(mb)
		tt := &timerTrigger{fn: fns[f].Name, start: first, every: every, requestU: int64(ms[len(ms)/2]) * 1000, memoryMB: mb[len(mb)/2]}
		tt.payload = string(loadgen.AppendRequest(nil, ms[len(ms)/2], tt.memoryMB))
		for t := first; t < window; t += every {
			tt.ticks = append(tt.ticks, t)
			phase := 2
			if t < warm {
				phase = 1
			}
			tt.phases = append(tt.phases, phase)
		}
		rt.timers = append(rt.timers, tt)
	}
	return rt, rest
}

// create makes the stream and the triggers; start is the schedule's start.
func (rt *replayTriggers) create(ctx context.Context, c *Cluster, o *Options, start time.Time) error {
	if len(rt.subjects) > 0 {
		if c.nc == nil {
			return errors.New("replay --triggers: the trace has queue functions, whose messages go to the cluster's embedded NATS: needs --local")
		}
		js, err := jetstream.New(c.nc)
		if err != nil {
			return err
		}
		id := runID()
		rt.js, rt.stream = js, "REPLAY_"+strings.ToUpper(id)
		prefix := spec.DefaultNamespace + ".replay-" + id + "."
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: rt.stream, Subjects: []string{prefix + ">"}}); err != nil {
			return fmt.Errorf("replay --triggers: creating the stream: %w", err)
		}
		for fn := range rt.subjects {
			rt.subjects[fn] = prefix + fn
			tr, err := c.Client.CreateTrigger(ctx, spec.Trigger{Name: fn, Function: fn, NATS: &spec.NATSSource{Subject: prefix + fn, Stream: rt.stream}})
			if err != nil {
				return fmt.Errorf("replay --triggers: creating %s's trigger: %w", fn, err)
			}
			rt.uids[fn] = tr.UID
		}
		for fn := range rt.subjects {
			if err := poll(ctx, 30*time.Second, 20*time.Millisecond, func() (bool, error) {
				_, err := js.Consumer(ctx, rt.stream, "brisk-"+rt.uids[fn])
				return err == nil, nil
			}, func() string { return fn + "'s trigger's durable consumer" }); err != nil {
				return err
			}
		}
	}
	for _, tt := range rt.timers {
		tr, err := c.Client.CreateTrigger(ctx, spec.Trigger{Name: tt.fn, Function: tt.fn, Cron: &spec.CronSource{
			Schedule: "@every " + tt.every.String(), Start: start.Add(tt.start).UTC(), Payload: tt.payload, ContentType: "application/json"}})
		if err != nil {
			return fmt.Errorf("replay --triggers: creating %s's trigger: %w", tt.fn, err)
		}
		tt.uid = tr.UID
	}
	o.logf("replay --triggers: %d cron triggers (timer functions), %d NATS triggers (queue functions)", len(rt.timers), len(rt.subjects))
	return nil
}

// stopTimers deletes the cron triggers: no tick after the window.
func (rt *replayTriggers) stopTimers(ctx context.Context, c *Cluster) {
	for _, tt := range rt.timers {
		if tt.uid != "" && !tt.deleted {
			_ = c.Client.DeleteTrigger(context.WithoutCancel(ctx), "", tt.fn)
			tt.deleted = true
		}
	}
}

// stop deletes the triggers and the stream.
func (rt *replayTriggers) stop(ctx context.Context, c *Cluster) {
	rt.stopTimers(ctx, c)
	ctx = context.WithoutCancel(ctx)
	for fn := range rt.uids {
		_ = c.Client.DeleteTrigger(ctx, "", fn)
	}
	if rt.js != nil {
		_ = rt.js.DeleteStream(ctx, rt.stream)
	}
}

// Invoke publishes a queue function's call and sends others over HTTP.
func (rt *replayTriggers) Invoke(ctx context.Context, c *loadgen.Call) loadgen.Reply {
	subject, ok := rt.subjects[c.Function]
	if !ok {
		return rt.http.Invoke(ctx, c)
	}
	rep := loadgen.Reply{Sent: time.Now()}
	ack, err := rt.js.Publish(ctx, subject, loadgen.AppendRequest(nil, c.RuntimeMs, c.MemoryMB))
	rep.Response = time.Since(rep.Sent)
	if err != nil {
		rep.Err = fmt.Errorf("publishing: %w", err)
		return rep
	}
	rt.seqs.Store(queueKey(c.Function, c.ID), ack.Sequence)
	rep.Status = 200 // the call's own outcome replaces the record (records)
	return rep
}

// records waits for the trigger-made calls to end and returns the records:
// recs with each published call's record replaced by its call's, and one
// record per timer tick. start is the schedule's start.
func (rt *replayTriggers) records(ctx context.Context, c *Cluster, o *Options, start time.Time, recs []workload.Record, timeout time.Duration) ([]workload.Record, error) {
	var ids []string
	type ref struct {
		rec  int // index in recs; -1: a tick
		tt   *timerTrigger
		tick int
	}
	var refs []ref
	for i := range recs {
		r := &recs[i]
		if _, ok := rt.subjects[r.Function]; !ok {
			continue
		}
		seq, ok := rt.seqs.Load(queueKey(r.Function, r.InvocationID))
		if !ok {
			continue // not published: its record says why
		}
		ids = append(ids, trigger.MessageCallID(rt.uids[r.Function], seq.(uint64)))
		refs = append(refs, ref{rec: i})
	}
	for _, tt := range rt.timers {
		for k, t := range tt.ticks {
			ids = append(ids, trigger.CronCallID(tt.uid, start.Add(t)))
			refs = append(refs, ref{rec: -1, tt: tt, tick: k})
		}
	}
	ends, err := c.awaitCalls(ctx, ids, timeout, 16)
	if err != nil && ctx.Err() != nil {
		return recs, err
	}
	for i, e := range ends {
		rf := refs[i]
		var r workload.Record
		if rf.rec >= 0 {
			r = recs[rf.rec]
		} else {
			tt := rf.tt
			at := start.Add(tt.ticks[rf.tick])
			r = workload.Record{Phase: tt.phases[rf.tick], Function: tt.fn, InvocationID: "tick" + strconv.Itoa(rf.tick),
				StartTime: at.UnixMicro(), RequestedUs: tt.requestU, MemoryMB: tt.memoryMB}
		}
		callRecord(&r, &e)
		if rf.rec >= 0 {
			recs[rf.rec] = r
		} else {
			recs = append(recs, r)
		}
	}
	if err != nil {
		o.logf("replay --triggers: %v", err)
	}
	return recs, nil
}

// callRecord fills r (its StartTime the tick or publish) from its call's end.
func callRecord(r *workload.Record, e *callEnd) {
	r.Status, r.Error, r.ConnTimeout, r.FuncTimeout = int(e.code), "", false, false
	r.QueueUs, r.Cold, r.ActualUs = max(e.queueUs, 0), e.cold, e.execUs
	if e.finished > 0 {
		r.ResponseUs = e.finished/1000 - r.StartTime
	}
	if e.started > 0 {
		r.ConnUs = e.started/1000 - r.StartTime
	}
	switch st := e.Status(); {
	case st == "":
		r.ConnTimeout, r.Error = true, "no call record"
	case !st.Final():
		r.ConnTimeout, r.Error = true, "call "+string(st)+" at the end of the run"
	case st != "succeeded":
		r.FuncTimeout, r.Error = true, "call "+string(st)
	case r.Status != 200:
		r.FuncTimeout, r.Error = true, fmt.Sprintf("HTTP %d", r.Status)
	}
}

// finish waits out the window's last ticks, stops the cron triggers and
// returns the records with the trigger-made calls'.
func (rt *replayTriggers) finish(ctx context.Context, c *Cluster, o *Options, start time.Time, window time.Duration, recs []workload.Record) ([]workload.Record, error) {
	select {
	case <-time.After(time.Until(start.Add(window))):
	case <-ctx.Done():
		return recs, ctx.Err()
	}
	rt.stopTimers(ctx, c)
	return rt.records(ctx, c, o, start, recs, max(o.Grace, loadgen.DefaultGrace))
}

// ReplayTriggers is summary.json's triggers: the measured phase's calls
// made by triggers.
type ReplayTriggers struct {
	TimerFunctions  int   `json:"timer_functions"`
	TimerCalls      int64 `json:"timer_calls"`
	TimerColdStarts int64 `json:"timer_cold_starts"`
	QueueFunctions  int   `json:"queue_functions"`
	QueueCalls      int64 `json:"queue_calls"`
	QueueColdStarts int64 `json:"queue_cold_starts"`
	// TickToStartMs: a tick to its call's start in the sandbox.
	TickToStartMs workload.Dist `json:"tick_to_start_ms"`
}

func (rt *replayTriggers) summary(s *workload.Schedule, recs []workload.Record) *ReplayTriggers {
	out := &ReplayTriggers{QueueFunctions: len(rt.subjects)}
	_, out.TimerCalls, out.TimerColdStarts = s.TimerStats(recs)
	out.TimerFunctions = len(rt.timers)
	timer := map[string]bool{}
	for _, tt := range rt.timers {
		timer[tt.fn] = true
	}
	var lag []float64
	for i := range recs {
		r := &recs[i]
		if r.Phase != 2 {
			continue
		}
		if timer[r.Function] && r.OK() {
			lag = append(lag, float64(r.ConnUs+r.QueueUs)/1000)
		}
		if _, ok := rt.subjects[r.Function]; ok {
			out.QueueCalls++
			if r.Cold {
				out.QueueColdStarts++
			}
		}
	}
	out.TickToStartMs = workload.NewDist(lag)
	return out
}

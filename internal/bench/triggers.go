package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/internal/trigger"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TriggersConfig configures bench triggers.
type TriggersConfig struct {
	// Cron phase: Functions warm functions (one sandbox each), each with
	// an "@every 1s" trigger, for CronDuration.
	Functions    int
	CronDuration time.Duration
	// NATS phase: Messages published at once to a JetStream stream that
	// a trigger of one function with Sandboxes sandboxes reads; the
	// function's async.concurrency is Concurrency.
	Messages    int
	Sandboxes   int
	Concurrency int
	Timeout     time.Duration
}

func (c TriggersConfig) withDefaults() TriggersConfig {
	if c.Functions == 0 {
		c.Functions = 10
	}
	if c.CronDuration == 0 {
		c.CronDuration = 30 * time.Second
	}
	if c.Messages == 0 {
		c.Messages = 50_000
	}
	if c.Sandboxes == 0 {
		c.Sandboxes = 2
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Minute
	}
	return c
}

// Validate checks the configuration.
func (c TriggersConfig) Validate() error {
	if c.Functions < 0 || c.CronDuration < 0 || c.Messages < 0 || c.Sandboxes < 0 || c.Concurrency < 0 {
		return errors.New("bench triggers: counts and durations must not be negative")
	}
	return nil
}

// TriggersSummary is bench triggers' result (summary.json).
type TriggersSummary struct {
	Command string       `json:"command"`
	Cron    CronPhase    `json:"cron"`
	NATS    NATSPhase    `json:"nats"`
	Goals   []Goal       `json:"goals"`
	Host    HostInfo     `json:"host"`
	Config  TriggersConf `json:"config"`
}

// TriggersConf is the configuration as summary.json records it.
type TriggersConf struct {
	Functions     int     `json:"functions"`
	CronDurationS float64 `json:"cron_duration_s"`
	Messages      int     `json:"messages"`
	Sandboxes     int     `json:"sandboxes"`
	Concurrency   int     `json:"concurrency"`
}

// CronPhase: firing lag of cron triggers of warm functions.
type CronPhase struct {
	Functions int `json:"functions"`
	Ticks     int `json:"ticks"`
	// LagMs is a tick's scheduled time to its call's start in the
	// function's sandbox (the attempt's start on the data plane plus its
	// queue wait there); QueuedMs the tick to the call queued.
	LagMs    workload.Dist `json:"lag_ms"`
	QueuedMs workload.Dist `json:"queued_ms"`
	Outcome  CallOutcome   `json:"outcome"`
}

// NATSPhase: a JetStream trigger's throughput into one warm function.
type NATSPhase struct {
	Messages    int     `json:"messages"`
	PublishPerS float64 `json:"publish_per_s"`
	// QueuedPerS is messages made calls per second (first publish to the
	// last call queued); CalledPerS messages whose calls finished per
	// second (first publish to the last finish).
	QueuedPerS float64     `json:"queued_per_s"`
	CalledPerS float64     `json:"called_per_s"`
	Outcome    CallOutcome `json:"outcome"`
}

// Triggers runs bench triggers on a local cluster (the NATS phase
// publishes to its embedded server).
func Triggers(ctx context.Context, c *Cluster, o Options, cfg TriggersConfig) (*TriggersSummary, string, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, "", err
	}
	if c.nc == nil || c.queue == nil {
		return nil, "", errors.New("bench triggers: needs --local (the NATS phase publishes to the cluster's embedded NATS server)")
	}
	host := hostInfo()
	out := &TriggersSummary{Command: "bench triggers", Config: TriggersConf{Functions: cfg.Functions, CronDurationS: cfg.CronDuration.Seconds(),
		Messages: cfg.Messages, Sandboxes: cfg.Sandboxes, Concurrency: cfg.Concurrency}}
	var text []string
	finish := func(err error) (*TriggersSummary, string, error) {
		out.Goals = triggerGoals(out)
		out.Host = host()
		if werr := writeOutputs(o.Out, out, nil, nil); werr != nil {
			err = errors.Join(err, werr)
		}
		text = append(text, formatGoals(out.Goals), out.Host.String())
		return out, strings.Join(text, "\n"), err
	}
	if cfg.Functions > 0 && cfg.CronDuration > 0 {
		if err := cronPhase(ctx, c, &o, cfg, &out.Cron); err != nil {
			return finish(err)
		}
		cp := &out.Cron
		text = append(text, fmt.Sprintf("cron: %d functions, %d ticks: tick→start p50 %.2f p99 %.2f max %.2f ms; tick→queued p50 %.2f p99 %.2f ms; %+v",
			cp.Functions, cp.Ticks, cp.LagMs.P50, cp.LagMs.P99, cp.LagMs.Max, cp.QueuedMs.P50, cp.QueuedMs.P99, cp.Outcome))
	}
	if cfg.Messages > 0 {
		if err := natsPhase(ctx, c, &o, cfg, &out.NATS); err != nil {
			return finish(err)
		}
		np := &out.NATS
		text = append(text, fmt.Sprintf("nats: %d messages published at %.0f/s; made calls at %.0f/s, called at %.0f/s; %+v",
			np.Messages, np.PublishPerS, np.QueuedPerS, np.CalledPerS, np.Outcome))
	}
	return finish(nil)
}

func triggerGoals(s *TriggersSummary) []Goal {
	return []Goal{
		{Name: "cron tick→start p99, warm (ms)", Target: "≤ 20", Measured: s.Cron.LagMs.P99, Met: s.Cron.LagMs.N > 0 && s.Cron.LagMs.P99 <= 20},
		{Name: "NATS messages called per second", Target: "≥ 5000", Measured: s.NATS.CalledPerS, Met: s.NATS.CalledPerS >= 5000},
	}
}

func cronPhase(ctx context.Context, c *Cluster, o *Options, cfg TriggersConfig, out *CronPhase) error {
	id := runID()
	var fns []*spec.Function
	var names []string
	for i := range cfg.Functions {
		name := fmt.Sprintf("bench-cron-%s-%d", id, i)
		names = append(names, name)
		// A small request: a 2-core node of the process runtime holds them all.
		fns = append(fns, &spec.Function{Name: name, Builtin: "trace", Scaling: spec.Scaling{Min: 1, Max: 1},
			Resources: spec.Resources{MilliCPU: 50, MemoryMB: 32}})
	}
	defer cleanup(c, o, names)
	o.logf("cron: registering %d warm functions", len(fns))
	if err := firstError(registerAll(ctx, c.Client, fns, 4, false, nil), "registering"); err != nil {
		return err
	}
	for _, n := range names {
		if _, err := c.waitReady(ctx, n, 1, 2*time.Minute); err != nil {
			return err
		}
	}
	uids := map[string]string{}
	for _, n := range names {
		tr, err := c.Client.CreateTrigger(ctx, spec.Trigger{Name: n, Function: n,
			Cron: &spec.CronSource{Schedule: "@every 1s", Payload: `{"ms":0}`, ContentType: "application/json"}})
		if err != nil {
			return fmt.Errorf("bench triggers: creating a trigger: %w", err)
		}
		uids[n] = tr.UID
	}
	start := time.Now()
	o.logf("cron: %d triggers firing every second for %s", len(names), cfg.CronDuration)
	select {
	case <-time.After(cfg.CronDuration):
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, n := range names {
		_ = c.Client.DeleteTrigger(ctx, "", n)
	}
	end := time.Now()
	// The ticks fired in the window, by id.
	var ids []string
	var ticks []time.Time
	for _, n := range names {
		for s := start.Unix() + 1; s < end.Unix(); s++ {
			ids = append(ids, trigger.CronCallID(uids[n], time.Unix(s, 0)))
			ticks = append(ticks, time.Unix(s, 0))
		}
	}
	recs, err := c.awaitCalls(ctx, ids, cfg.Timeout, 16)
	if err != nil {
		return err
	}
	var lag, queued []float64
	for i := range recs {
		r := &recs[i]
		if r.started == 0 || r.Status() != "succeeded" {
			continue
		}
		q := max(r.queueUs, 0)
		lag = append(lag, ms(time.Duration(r.started-ticks[i].UnixNano()))+float64(q)/1000)
		queued = append(queued, ms(time.Duration(r.submitted-ticks[i].UnixNano())))
	}
	*out = CronPhase{Functions: len(names), Ticks: len(ids), LagMs: workload.NewDist(lag), QueuedMs: workload.NewDist(queued), Outcome: outcome(recs)}
	return nil
}

func natsPhase(ctx context.Context, c *Cluster, o *Options, cfg TriggersConfig, out *NATSPhase) error {
	name := "bench-nats-" + runID()
	fn := &spec.Function{Name: name, Builtin: "trace", Concurrency: 10000,
		Scaling: spec.Scaling{Min: cfg.Sandboxes, Max: cfg.Sandboxes}, Async: spec.Async{Concurrency: cfg.Concurrency}}
	defer cleanup(c, o, []string{name})
	if err := firstError(registerAll(ctx, c.Client, []*spec.Function{fn}, 1, false, nil), "registering"); err != nil {
		return err
	}
	if _, err := c.waitReady(ctx, name, cfg.Sandboxes, 2*time.Minute); err != nil {
		return err
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	stream := "BENCH_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	subject := "default." + name
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		return fmt.Errorf("bench triggers: stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	tr, err := c.Client.CreateTrigger(ctx, spec.Trigger{Name: name, Function: name, NATS: &spec.NATSSource{Subject: subject, Stream: stream}})
	if err != nil {
		return fmt.Errorf("bench triggers: creating a trigger: %w", err)
	}
	defer func() { _ = c.Client.DeleteTrigger(context.WithoutCancel(ctx), "", name) }()
	if err := poll(ctx, 30*time.Second, 20*time.Millisecond, func() (bool, error) {
		_, err := js.Consumer(ctx, stream, "brisk-"+tr.UID)
		return err == nil, nil
	}, func() string { return "the trigger's durable consumer" }); err != nil {
		return err
	}
	o.logf("nats: publishing %d messages", cfg.Messages)
	body := []byte(`{"ms":0}`)
	t0 := time.Now()
	for i := range cfg.Messages {
		if _, err := js.PublishAsync(subject, body); err != nil {
			return fmt.Errorf("bench triggers: publishing message %d: %w", i, err)
		}
		if i%1000 == 999 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	published := time.Since(t0)
	ids := make([]string, cfg.Messages)
	for i := range ids {
		ids[i] = trigger.MessageCallID(tr.UID, uint64(i+1))
	}
	recs, err := c.awaitCalls(ctx, ids, cfg.Timeout, 16)
	if err != nil {
		return err
	}
	var lastSubmit, lastFinish int64
	for i := range recs {
		lastSubmit, lastFinish = max(lastSubmit, recs[i].submitted), max(lastFinish, recs[i].finished)
	}
	*out = NATSPhase{Messages: cfg.Messages, PublishPerS: rate(cfg.Messages, published),
		QueuedPerS: rate(cfg.Messages, time.Duration(lastSubmit-t0.UnixNano())), CalledPerS: rate(cfg.Messages, time.Duration(lastFinish-t0.UnixNano())),
		Outcome: outcome(recs)}
	return nil
}

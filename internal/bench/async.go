package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// AsyncConfig is `brisk bench async`: asynchronous calls
// (POST /async-function/NAME) in four phases — accept rate, queueing
// overhead at light load, drain rate of a backlog, and synchronous warm
// throughput of the same function for comparison.
type AsyncConfig struct {
	// Clients submit calls as fast as they can in the accept and backlog
	// phases; default 16.
	Clients int
	// AcceptDuration bounds the accept phase in time (default 10s) and
	// AcceptMax in calls (default 100,000).
	AcceptDuration time.Duration
	AcceptMax      int
	// AcceptRate is the paced phase's offered rate (default 10,000/s): the
	// clients send on a fixed schedule for AcceptDuration (at most
	// AcceptMax calls), and the accept latency is measured at that load
	// rather than at saturation.
	AcceptRate float64
	// LightCalls are submitted one at a time, LightGap apart (defaults 50
	// and 20ms), to a warm function.
	LightCalls int
	LightGap   time.Duration
	// Backlog calls are submitted at once and drained (default 20,000).
	Backlog int
	// Concurrency is the function's async.concurrency (the calls one data
	// plane runs at once) and the number of closed-loop callers of the
	// synchronous phase, so that both have as many calls in flight;
	// default 64.
	Concurrency int
	// SyncDuration is the synchronous phase's measured time (default 10s),
	// after SyncWarmup (default 1s).
	SyncDuration, SyncWarmup time.Duration
	// ExecMs is the work each call asks for: body {"ms": ExecMs}.
	ExecMs int
	// Sandboxes are pre-warmed (scaling min = max), each with unlimited
	// concurrency; default 2.
	Sandboxes int
	// Timeout bounds the wait for one phase's calls to finish (default 3m).
	Timeout time.Duration
}

func (cfg AsyncConfig) withDefaults() AsyncConfig {
	cfg.Clients = cmp.Or(cfg.Clients, 16)
	cfg.AcceptDuration = cmp.Or(cfg.AcceptDuration, 10*time.Second)
	cfg.AcceptMax = cmp.Or(cfg.AcceptMax, 100_000)
	cfg.AcceptRate = cmp.Or(cfg.AcceptRate, 10_000)
	cfg.LightCalls = cmp.Or(cfg.LightCalls, 50)
	cfg.LightGap = cmp.Or(cfg.LightGap, 20*time.Millisecond)
	cfg.Backlog = cmp.Or(cfg.Backlog, 20_000)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 64)
	cfg.SyncDuration = cmp.Or(cfg.SyncDuration, 10*time.Second)
	cfg.Sandboxes = cmp.Or(cfg.Sandboxes, 2)
	cfg.Timeout = cmp.Or(cfg.Timeout, 3*time.Minute)
	return cfg
}

// Validate reports the first parameter out of range.
func (cfg AsyncConfig) Validate() error {
	switch {
	case cfg.Clients < 1 || cfg.Clients > 4096:
		return fmt.Errorf("--clients %d out of range [1, 4096]", cfg.Clients)
	case cfg.AcceptDuration <= 0 || cfg.AcceptDuration > time.Hour:
		return fmt.Errorf("--accept-duration %s: want (0, 1h]", cfg.AcceptDuration)
	case cfg.AcceptMax < 1 || cfg.AcceptMax > 10_000_000:
		return fmt.Errorf("--accept-max %d out of range [1, 10000000]", cfg.AcceptMax)
	case cfg.AcceptRate < 1 || cfg.AcceptRate > 1_000_000:
		return fmt.Errorf("--accept-rate %g out of range [1, 1000000]", cfg.AcceptRate)
	case cfg.LightCalls < 1 || cfg.LightCalls > 100_000:
		return fmt.Errorf("--light-calls %d out of range [1, 100000]", cfg.LightCalls)
	case cfg.LightGap < 0 || cfg.LightGap > time.Minute:
		return fmt.Errorf("--light-gap %s: want [0, 1m]", cfg.LightGap)
	case cfg.Backlog < 1 || cfg.Backlog > 1_000_000:
		return fmt.Errorf("--backlog %d out of range [1, 1000000] (the queue's default limit)", cfg.Backlog)
	case cfg.Concurrency < 1 || cfg.Concurrency > 10_000:
		return fmt.Errorf("--concurrency %d out of range [1, 10000]", cfg.Concurrency)
	case cfg.SyncDuration <= 0 || cfg.SyncDuration > time.Hour || cfg.SyncWarmup < 0:
		return fmt.Errorf("--sync-duration %s: want (0, 1h], and --sync-warmup %s not negative", cfg.SyncDuration, cfg.SyncWarmup)
	case cfg.ExecMs < 0 || cfg.ExecMs > 60_000:
		return fmt.Errorf("--exec-ms %d out of range [0, 60000]", cfg.ExecMs)
	case cfg.Sandboxes < 1 || cfg.Sandboxes > 10_000:
		return fmt.Errorf("--sandboxes %d out of range [1, 10000]", cfg.Sandboxes)
	case cfg.Timeout <= 0:
		return fmt.Errorf("--timeout %s must be positive", cfg.Timeout)
	}
	return nil
}

// AsyncSummary is summary.json of bench async.
type AsyncSummary struct {
	Command  string          `json:"command"`
	Function string          `json:"function"`
	Config   AsyncConfigJSON `json:"config"`
	Accept   AcceptPhase     `json:"accept"`
	Paced    PacedPhase      `json:"paced"`
	Light    LightPhase      `json:"light"`
	Drain    DrainPhase      `json:"drain"`
	Sync     SyncPhase       `json:"sync"`
	// DrainOverSync is the backlog's drain rate over the synchronous
	// throughput with as many calls in flight.
	DrainOverSync float64 `json:"drain_over_sync"`
	// CPURatio is the sync phase's CPU per call over the drain's (a local
	// cluster, where this process is the whole load): the drain/sync ratio
	// where CPU is the limit, steadier on a shared host than two rates.
	CPURatio float64 `json:"cpu_ratio,omitempty"`
	// Goals are the targets next to what was measured; a run
	// reports them, it does not fail on them.
	Goals []Goal   `json:"goals"`
	Host  HostInfo `json:"host"`
}

// AsyncConfigJSON records the run's parameters.
type AsyncConfigJSON struct {
	Clients         int     `json:"clients"`
	AcceptDurationS float64 `json:"accept_duration_s"`
	AcceptMax       int     `json:"accept_max"`
	AcceptRate      float64 `json:"accept_rate"`
	LightCalls      int     `json:"light_calls"`
	LightGapMs      float64 `json:"light_gap_ms"`
	Backlog         int     `json:"backlog"`
	Concurrency     int     `json:"concurrency"`
	SyncDurationS   float64 `json:"sync_duration_s"`
	ExecMs          int     `json:"exec_ms"`
	Sandboxes       int     `json:"sandboxes"`
	H2C             bool    `json:"h2c"`
}

// CallOutcome counts how a phase's accepted calls ended, from their status
// records.
type CallOutcome struct {
	Accepted  int `json:"accepted"`
	Succeeded int `json:"succeeded"`
	// Failed ended failed or dead.
	Failed int `json:"failed"`
	// Unfinished were not in an end state when the wait gave up.
	Unfinished int `json:"unfinished"`
	// Retried took more than one attempt.
	Retried int `json:"retried"`
}

// AcceptPhase is phase 1: clients submitting as fast as they can.
type AcceptPhase struct {
	Clients int `json:"clients"`
	// DurationS runs from the first send to the last reply.
	DurationS float64 `json:"duration_s"`
	Sent      int     `json:"sent"`
	// Statuses counts the replies by HTTP status ("0": no reply).
	Statuses     map[string]int `json:"statuses"`
	AcceptedPerS float64        `json:"accepted_per_s"`
	// LatencyMs is the client's time from send to the 202 (accepted
	// calls).
	LatencyMs workload.Dist `json:"accept_latency_ms"`
	Calls     CallOutcome   `json:"calls"`
	// FinishedWhileSubmitting counts calls that finished before the last
	// one was submitted: the consumer runs while the clients submit.
	FinishedWhileSubmitting int `json:"finished_while_submitting"`
	// DrainedS runs from the first submit to the last finish (server
	// clock).
	DrainedS float64 `json:"drained_s"`
}

// PacedPhase is phase 1b: the clients send on a fixed schedule at
// OfferedPerS, so that the accept latency is what a client sees at that
// load; a closed loop at saturation (phase 1) measures the rate, and its
// latency is the clients' own queueing behind one another.
type PacedPhase struct {
	Clients      int            `json:"clients"`
	OfferedPerS  float64        `json:"offered_per_s"`
	DurationS    float64        `json:"duration_s"`
	Sent         int            `json:"sent"`
	Statuses     map[string]int `json:"statuses"`
	AcceptedPerS float64        `json:"accepted_per_s"`
	// LatencyMs runs from a call's scheduled send time when every client
	// was still busy then (the wait counts: no coordinated omission), else
	// from its actual send (a client's timer firing late is not the
	// server's).
	LatencyMs workload.Dist `json:"accept_latency_ms"`
	// Late counts sends that left after their scheduled time because every
	// client was busy.
	Late  int         `json:"late"`
	Calls CallOutcome `json:"calls"`
}

// LightPhase is phase 2: calls one at a time to a warm function.
type LightPhase struct {
	Count int     `json:"count"`
	GapMs float64 `json:"gap_ms"`
	// OverheadMs is accept to function start: dispatch plus the data
	// plane's queue wait.
	OverheadMs workload.Dist `json:"accept_to_start_ms"`
	// DispatchMs is StartedAt − SubmittedAt: the queue stored the call,
	// the consumer pulled it and took a slot.
	DispatchMs workload.Dist `json:"dispatch_ms"`
	// QueueWaitMs is the data plane's queue wait (X-Brisk-Timing
	// queue_us of the attempt).
	QueueWaitMs workload.Dist `json:"dataplane_queue_ms"`
	// EndToEndMs is FinishedAt − SubmittedAt.
	EndToEndMs workload.Dist `json:"submit_to_finish_ms"`
	LatencyMs  workload.Dist `json:"accept_latency_ms"`
	Outcome    CallOutcome   `json:"calls"`
	// NoTiming counts succeeded calls whose result lacks X-Brisk-Timing
	// (their queue wait counts as 0).
	NoTiming int `json:"without_timing_header"`
}

// DrainPhase is phase 3: a backlog submitted at once, then drained.
type DrainPhase struct {
	Backlog int `json:"backlog"`
	Clients int `json:"clients"`
	// Paused: the queue handed out no call while the backlog was
	// submitted (a local cluster); the drain then runs from the resume.
	Paused bool `json:"paused"`
	// SubmitS is the client's time from the first send to the last 202.
	SubmitS    float64 `json:"submit_s"`
	SubmitPerS float64 `json:"submitted_per_s"`
	// SubmitCPUPerCallUs is this process's CPU time per submit while the
	// queue was paused (a local cluster): the accept path alone.
	SubmitCPUPerCallUs float64        `json:"submit_cpu_per_call_us,omitempty"`
	Statuses           map[string]int `json:"statuses"`
	LatencyMs          workload.Dist  `json:"accept_latency_ms"`
	Calls              CallOutcome    `json:"calls"`
	// DrainS runs from the resume (Paused) or else the first call's
	// SubmittedAt to the last call's FinishedAt; DrainedPerS is the calls
	// that succeeded over it.
	DrainS      float64 `json:"drain_s"`
	DrainedPerS float64 `json:"drained_per_s"`
	// Without a pause, TailCalls finished after the last submit and
	// TailPerS is their rate from the last submit to the last finish:
	// draining with no submits competing.
	TailCalls int     `json:"tail_calls"`
	TailPerS  float64 `json:"tail_per_s"`
	// CPUPerCallUs is this process's CPU time over the drain per call
	// drained (a local cluster with the queue paused: generator, cluster,
	// NATS and emulated sandboxes).
	CPUPerCallUs float64 `json:"cpu_per_call_us,omitempty"`
}

// SyncPhase is phase 4: synchronous calls of the same function.
type SyncPhase struct {
	Callers       int           `json:"callers"`
	DurationS     float64       `json:"duration_s"`
	Completed     int           `json:"completed"`
	Failed        int           `json:"failed"`
	ThroughputRPS float64       `json:"throughput_rps"`
	LatencyMs     workload.Dist `json:"latency_ms"`
	// CPUPerCallUs is this process's CPU time per call, warm-up included
	// (a local cluster).
	CPUPerCallUs float64 `json:"cpu_per_call_us,omitempty"`
}

// Goal is one target next to the measured value.
type Goal struct {
	Name     string  `json:"name"`
	Target   string  `json:"target"`
	Measured float64 `json:"measured"`
	Met      bool    `json:"met"`
}

// Async runs bench async.
func Async(ctx context.Context, c *Cluster, o Options, cfg AsyncConfig) (*AsyncSummary, string, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, "", fmt.Errorf("bench async: %w", err)
	}
	host := hostInfo()
	name := "bench-async-" + runID()
	fn := &spec.Function{Name: name, Builtin: "trace", Concurrency: 10000, // unlimited: nothing queues for a slot
		Scaling: spec.Scaling{Min: cfg.Sandboxes, Max: cfg.Sandboxes},
		Async:   spec.Async{Concurrency: cfg.Concurrency}}
	defer cleanup(c, &o, []string{name})
	o.logf("registering %s with %d sandboxes, async concurrency %d", name, cfg.Sandboxes, cfg.Concurrency)
	if err := firstError(registerAll(ctx, c.Client, []*spec.Function{fn}, 1, false, nil), "registering"); err != nil {
		return nil, "", err
	}
	if _, err := c.waitReady(ctx, name, cfg.Sandboxes, 2*time.Minute); err != nil {
		return nil, "", err
	}
	httpc := loadgen.NewHTTPClient(o.HTTP)
	syncInv := &loadgen.HTTPInvoker{Client: httpc, Route: loadgen.DataPlane(c.Invoke), Header: c.InvokeHeader()}
	if err := primeDataPlane(ctx, syncInv, []string{name}); err != nil {
		return nil, "", err
	}
	sub, err := newAsyncSubmitter(httpc, c.Invoke, name, c.InvokeHeader(), cfg.ExecMs, !o.HTTP.H2C)
	if err != nil {
		return nil, "", err
	}
	defer sub.close()
	out := &AsyncSummary{Command: "bench async", Function: name, Config: AsyncConfigJSON{Clients: cfg.Clients,
		AcceptDurationS: cfg.AcceptDuration.Seconds(), AcceptMax: cfg.AcceptMax, AcceptRate: cfg.AcceptRate, LightCalls: cfg.LightCalls,
		LightGapMs: ms(cfg.LightGap), Backlog: cfg.Backlog, Concurrency: cfg.Concurrency, SyncDurationS: cfg.SyncDuration.Seconds(),
		ExecMs: cfg.ExecMs, Sandboxes: cfg.Sandboxes, H2C: o.HTTP.H2C}}
	var text []string
	var phases []phaseRecords
	finish := func(err error) (*AsyncSummary, string, error) {
		out.Goals = asyncGoals(out)
		out.Host = host()
		if werr := writeOutputs(o.Out, out, nil, nil); werr != nil {
			err = errors.Join(err, werr)
		} else if o.Out != "" {
			err = errors.Join(err, writeFile(filepath.Join(o.Out, "calls.csv"), func(w io.Writer) error { return writeCallsCSV(w, phases) }))
		}
		text = append(text, formatGoals(out.Goals), out.Host.String())
		return out, strings.Join(text, "\n"), err
	}

	// A first call through the queue, so that the consumer has pulled and
	// the function's policy is known before anything is measured.
	o.logf("warm-up: one asynchronous call")
	id, _, _, err := sub.submit(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("bench async: the warm-up call: %w", err)
	}
	if recs, err := c.awaitCalls(ctx, []string{id}, cfg.Timeout, 1); err != nil {
		return nil, "", fmt.Errorf("bench async: the warm-up call: %w", err)
	} else if st := recs[0].Status(); st != async.StatusSucceeded {
		why := ""
		if r, err := c.Client.Call(ctx, id); err == nil {
			why = r.Error
		}
		return nil, "", fmt.Errorf("bench async: the warm-up call ended %s: %s", st, why)
	}

	// Phase 1: accept rate.
	o.logf("phase 1: %d clients submit for %s (at most %d calls)", cfg.Clients, cfg.AcceptDuration, cfg.AcceptMax)
	acc := sub.run(ctx, &o, "accept ", cfg.Clients, cfg.AcceptMax, cfg.AcceptDuration)
	if err := acc.err(); err != nil {
		return nil, "", err
	}
	out.Accept = AcceptPhase{Clients: cfg.Clients, DurationS: acc.elapsed.Seconds(), Sent: acc.sent, Statuses: acc.statuses,
		AcceptedPerS: rate(len(acc.ids), acc.elapsed), LatencyMs: workload.NewDist(acc.lat)}
	o.logf("phase 1: waiting for %d calls to finish", len(acc.ids))
	recs, werr := c.awaitCalls(ctx, acc.ids, cfg.Timeout, cfg.Clients)
	phases = append(phases, phaseRecords{"accept", acc.ids, recs})
	out.Accept.Calls = outcome(recs)
	first, lastSubmit, lastFinish := span(recs)
	out.Accept.DrainedS = lastFinish.Sub(first).Seconds()
	out.Accept.FinishedWhileSubmitting = finishedBy(recs, lastSubmit)
	text = append(text, formatAccept(&out.Accept))
	if werr != nil {
		return finish(werr)
	}

	// Phase 1b: accept latency at the goal's rate.
	o.logf("phase 1b: %d clients send %.0f calls/s for %s (at most %d calls)", cfg.Clients, cfg.AcceptRate, cfg.AcceptDuration, cfg.AcceptMax)
	paced := sub.paced(ctx, &o, cfg.Clients, cfg.AcceptRate, cfg.AcceptMax, cfg.AcceptDuration)
	if err := paced.err(); err != nil {
		return nil, "", err
	}
	out.Paced = PacedPhase{Clients: cfg.Clients, OfferedPerS: cfg.AcceptRate, DurationS: paced.elapsed.Seconds(), Sent: paced.sent,
		Statuses: paced.statuses, AcceptedPerS: rate(len(paced.ids), paced.elapsed), LatencyMs: workload.NewDist(paced.lat), Late: paced.late}
	o.logf("phase 1b: waiting for %d calls to finish", len(paced.ids))
	recs, werr = c.awaitCalls(ctx, paced.ids, cfg.Timeout, cfg.Clients)
	phases = append(phases, phaseRecords{"paced", paced.ids, recs})
	out.Paced.Calls = outcome(recs)
	text = append(text, formatPaced(&out.Paced))
	if werr != nil {
		return finish(werr)
	}

	// Phase 2: queueing overhead at light load.
	o.logf("phase 2: %d calls, %s apart", cfg.LightCalls, cfg.LightGap)
	light, err := sub.oneByOne(ctx, cfg.LightCalls, cfg.LightGap)
	if err != nil {
		return finish(err)
	}
	recs, werr = c.awaitCalls(ctx, light.ids, cfg.Timeout, cfg.Clients)
	phases = append(phases, phaseRecords{"light", light.ids, recs})
	out.Light = lightPhase(recs, cfg, light.lat)
	text = append(text, formatLight(&out.Light))
	if werr != nil {
		return finish(werr)
	}

	// Phase 3: drain a backlog. A local cluster's queue is paused while
	// the backlog is submitted, so that it is all there when the drain
	// starts; on another cluster the consumer drains while the clients
	// submit, and the drain rate cannot exceed the submit rate.
	o.logf("phase 3: a backlog of %d calls", cfg.Backlog)
	resume, perr := c.pauseAsync(ctx, time.Hour) // resumed below, or deferred on failure
	if perr != nil {
		o.logf("phase 3: the queue is not paused (%v): it drains while the backlog is submitted", perr)
	} else {
		defer func() {
			if resume != nil {
				_, _ = resume(context.WithoutCancel(ctx))
			}
		}()
	}
	cpu0 := processCPU()
	bl := sub.run(ctx, &o, "backlog", cfg.Clients, cfg.Backlog, 0)
	submitCPU := processCPU() - cpu0
	// The trace starts before the resume: a small backlog may be drained
	// before resume returns (it waits to see the consumer deliver).
	cpu := startCPUTrace(20 * time.Millisecond)
	defer cpu.stop() // on the early returns; stopping twice is a no-op
	var resumed time.Time
	if resume != nil {
		var err error
		if resumed, err = resume(ctx); err != nil {
			return finish(err)
		}
		resume = nil
	}
	if err := bl.err(); err != nil {
		return finish(err)
	}
	out.Drain = DrainPhase{Backlog: cfg.Backlog, Clients: cfg.Clients, Paused: !resumed.IsZero(), SubmitS: bl.elapsed.Seconds(),
		SubmitPerS: rate(len(bl.ids), bl.elapsed), Statuses: bl.statuses, LatencyMs: workload.NewDist(bl.lat)}
	if c.IsLocal() && !resumed.IsZero() {
		out.Drain.SubmitCPUPerCallUs = cpuPerCall(submitCPU, bl.sent)
	}
	o.logf("phase 3: waiting for %d calls to finish", len(bl.ids))
	recs, werr = c.awaitCalls(ctx, bl.ids, cfg.Timeout, cfg.Clients)
	cpu.stop()
	phases = append(phases, phaseRecords{"backlog", bl.ids, recs})
	out.Drain.Calls = outcome(recs)
	first, lastSubmit, lastFinish = span(recs)
	if !resumed.IsZero() {
		first = resumed
	}
	if d := lastFinish.Sub(first); d > 0 {
		out.Drain.DrainS = d.Seconds()
		out.Drain.DrainedPerS = float64(out.Drain.Calls.Succeeded) / d.Seconds()
		if c.IsLocal() && !resumed.IsZero() {
			out.Drain.CPUPerCallUs = cpuPerCall(cpu.at(lastFinish)-cpu.at(first), out.Drain.Calls.Succeeded)
		}
	}
	if resumed.IsZero() {
		out.Drain.TailCalls = out.Drain.Calls.Accepted - out.Drain.Calls.Unfinished - finishedBy(recs, lastSubmit)
		if d := lastFinish.Sub(lastSubmit); d > 0 {
			out.Drain.TailPerS = float64(out.Drain.TailCalls) / d.Seconds()
		}
	}
	text = append(text, formatDrain(&out.Drain))
	if werr != nil {
		return finish(werr)
	}

	// Phase 4: synchronous throughput with as many calls in flight.
	o.logf("phase 4: %d closed-loop synchronous callers for %s", cfg.Concurrency, cfg.SyncDuration)
	ld := load{closed: cfg.Concurrency, names: []string{name}, execMs: cfg.ExecMs}
	cpu0 = processCPU()
	srecs, err := ld.send(ctx, &o, "sync   ", syncInv, cfg.SyncWarmup, cfg.SyncDuration)
	if err != nil {
		return finish(err)
	}
	syncCPU := processCPU() - cpu0
	s := workload.Summarize(srecs)
	out.Sync = SyncPhase{Callers: cfg.Concurrency, DurationS: cfg.SyncDuration.Seconds(), Completed: s.Completed, Failed: s.Failed,
		ThroughputRPS: s.ThroughputRPS, LatencyMs: s.LatencyMs}
	if c.IsLocal() {
		out.Sync.CPUPerCallUs = cpuPerCall(syncCPU, len(srecs))
	}
	if s.ThroughputRPS > 0 {
		out.DrainOverSync = out.Drain.DrainedPerS / s.ThroughputRPS
	}
	if out.Drain.CPUPerCallUs > 0 && out.Sync.CPUPerCallUs > 0 {
		out.CPURatio = out.Sync.CPUPerCallUs / out.Drain.CPUPerCallUs
	}
	text = append(text, fmt.Sprintf("sync:    %d closed-loop callers, %s: %d ok, %d failed, %.0f calls/s; latency ms p50 %.3f p99 %.3f",
		cfg.Concurrency, cfg.SyncDuration, s.Completed, s.Failed, s.ThroughputRPS, s.LatencyMs.P50, s.LatencyMs.P99))
	ratio := fmt.Sprintf("drain/sync: %.3f", out.DrainOverSync)
	if out.CPURatio > 0 {
		ratio += fmt.Sprintf("; CPU per call (this process, cluster included): drained %.1f µs, sync %.1f µs, sync/drained %.3f",
			out.Drain.CPUPerCallUs, out.Sync.CPUPerCallUs, out.CPURatio)
	}
	text = append(text, ratio)
	var failed error
	for _, p := range []struct {
		what string
		o    CallOutcome
	}{{"accept", out.Accept.Calls}, {"light", out.Light.Outcome}, {"backlog", out.Drain.Calls}} {
		if p.o.Succeeded != p.o.Accepted {
			failed = errors.Join(failed, fmt.Errorf("bench async: %s phase: %d of %d accepted calls did not succeed", p.what, p.o.Accepted-p.o.Succeeded, p.o.Accepted))
		}
	}
	return finish(failed)
}

// asyncSubmitter posts asynchronous calls of one function: over plain
// HTTP/1.1 with its own wire client (wire.go) when wire is allowed and the
// URL is http://, else with hc.
type asyncSubmitter struct {
	client *http.Client
	wire   *wireClient
	u      *url.URL
	header http.Header
	body   []byte
}

// submitTimeout bounds one submit of the wire client.
const submitTimeout = time.Minute

func newAsyncSubmitter(hc *http.Client, invoke, name string, header http.Header, execMs int, wire bool) (*asyncSubmitter, error) {
	base := invoke
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(strings.TrimRight(base, "/") + "/async-function/" + name)
	if err != nil {
		return nil, err
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for k, v := range header {
		h[k] = v
	}
	s := &asyncSubmitter{client: hc, u: u, header: h, body: []byte(`{"ms":` + strconv.Itoa(execMs) + `}`)}
	if wire && u.Scheme == "http" && u.RawQuery == "" {
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), "80")
		}
		if s.wire, err = newWireClient(addr, http.MethodPost, u.EscapedPath(), u.Host, h, s.body, submitTimeout); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *asyncSubmitter) close() {
	if s.wire != nil {
		s.wire.close()
	}
}

// submit posts one call and returns its id once it is accepted, the
// reply's status and the time to it.
func (s *asyncSubmitter) submit(ctx context.Context) (id string, status int, took time.Duration, err error) {
	if s.wire != nil {
		start := time.Now()
		rep, err := s.wire.do(ctx, "x-call-id")
		took = time.Since(start)
		switch {
		case err != nil:
			return "", 0, took, fmt.Errorf("POST %s: %w", s.u.Path, err)
		case rep.code != http.StatusAccepted:
			return "", rep.code, took, fmt.Errorf("POST %s: HTTP %d: %s", s.u.Path, rep.code, strings.TrimSpace(string(rep.body)))
		case rep.value == "":
			return "", rep.code, took, errors.New("a 202 without X-Call-Id")
		}
		return rep.value, rep.code, took, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(s.body))
	if err != nil {
		return "", 0, 0, err
	}
	req.URL, req.Host = s.u, s.u.Host
	for k, v := range s.header {
		req.Header[k] = v
	}
	start := time.Now()
	var resp *http.Response
	if rt := s.client.Transport; rt != nil && s.client.Timeout == 0 {
		resp, err = rt.RoundTrip(req)
	} else {
		resp, err = s.client.Do(req)
	}
	if err != nil {
		return "", 0, time.Since(start), err
	}
	var buf [512]byte
	n, _ := io.ReadFull(resp.Body, buf[:])
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took = time.Since(start)
	if resp.StatusCode != http.StatusAccepted {
		return "", resp.StatusCode, took, fmt.Errorf("POST %s: HTTP %d: %s", s.u.Path, resp.StatusCode, strings.TrimSpace(string(buf[:n])))
	}
	id = resp.Header.Get("X-Call-Id")
	if id == "" {
		return "", resp.StatusCode, took, errors.New("a 202 without X-Call-Id")
	}
	return id, resp.StatusCode, took, nil
}

// submitRun is what a run of submits saw.
type submitRun struct {
	ids      []string  // accepted, in no particular order
	lat      []float64 // ms to the 202, accepted calls
	sent     int
	statuses map[string]int
	failed   int
	first    error
	elapsed  time.Duration // first send to last reply
	late     int           // paced: sends after their time, every client busy
}

// record adds one submit's outcome; it reports whether it was accepted.
func (r *submitRun) record(id string, status int, lat time.Duration, err error) bool {
	r.sent++
	r.statuses[strconv.Itoa(status)]++
	if err != nil {
		r.failed++
		r.first = cmp.Or(r.first, err)
		return false
	}
	r.ids = append(r.ids, id)
	r.lat = append(r.lat, ms(lat))
	return true
}

// err is the run's failure when no call at all was accepted.
func (r *submitRun) err() error {
	if len(r.ids) == 0 {
		return fmt.Errorf("bench async: no call was accepted (%d sent): %w", r.sent, cmp.Or(r.first, errors.New("none sent")))
	}
	return nil
}

// run submits with clients until max calls are sent or d (0: no limit)
// has passed.
func (s *asyncSubmitter) run(ctx context.Context, o *Options, label string, clients, max int, d time.Duration) submitRun {
	var next, done atomic.Int64
	start := time.Now()
	end := start.Add(d)
	per := make([]submitRun, clients)
	total := int64(max)
	if d > 0 {
		// The bar runs on time; the count caps it too.
		total = int64(d / time.Millisecond)
	}
	bar := loadgen.StartProgress(o.Progress, label, total, func() (int64, string) {
		if d > 0 {
			return min(int64(time.Since(start)/time.Millisecond), total), fmt.Sprintf("accepted %d", done.Load())
		}
		return done.Load(), ""
	})
	var wg sync.WaitGroup
	for k := range per {
		r := &per[k]
		r.statuses = map[string]int{}
		wg.Go(func() {
			for ctx.Err() == nil && (d <= 0 || time.Now().Before(end)) && next.Add(1) <= int64(max) {
				if r.record(s.submit(ctx)) {
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	bar.Stop()
	all := merge(per, time.Since(start))
	if all.failed > 0 {
		o.logf("%s: %d of %d submits not accepted, first: %v", strings.TrimSpace(label), all.failed, all.sent, all.first)
	}
	return all
}

// paced submits with clients on one schedule, a call every 1/rate, until
// max calls are sent or d has passed. Each client takes the next slot; a
// call's latency runs from its slot when the client was still busy with
// its previous call then, else from when it was sent.
func (s *asyncSubmitter) paced(ctx context.Context, o *Options, clients int, rate float64, max int, d time.Duration) submitRun {
	var next, done atomic.Int64
	start := time.Now()
	total := min(int64(max), int64(d.Seconds()*rate))
	bar := loadgen.StartProgress(o.Progress, "paced ", total, func() (int64, string) { return done.Load(), "" })
	per := make([]submitRun, clients)
	var wg sync.WaitGroup
	for k := range per {
		r := &per[k]
		r.statuses = map[string]int{}
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				slot := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
				from := slot
				if wait := time.Until(slot); wait > 0 {
					time.Sleep(wait)
					from = time.Now() // idle until its slot: a late timer is not the server's
				} else if wait < -time.Millisecond {
					r.late++
				}
				id, st, took, err := s.submit(ctx)
				sent := time.Now().Add(-took)
				// From the slot, or from the send when the client was idle.
				if r.record(id, st, took+sent.Sub(from), err) {
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	bar.Stop()
	all := merge(per, time.Since(start))
	if all.failed > 0 {
		o.logf("paced: %d of %d submits not accepted, first: %v", all.failed, all.sent, all.first)
	}
	return all
}

// merge adds the clients' runs up.
func merge(per []submitRun, elapsed time.Duration) submitRun {
	all := submitRun{statuses: map[string]int{}, elapsed: elapsed}
	for i := range per {
		r := &per[i]
		all.ids = append(all.ids, r.ids...)
		all.lat = append(all.lat, r.lat...)
		all.sent += r.sent
		all.failed += r.failed
		all.late += r.late
		all.first = cmp.Or(all.first, r.first)
		for k, v := range r.statuses {
			all.statuses[k] += v
		}
	}
	return all
}

// oneByOne submits n calls, gap apart, each after the last was accepted.
func (s *asyncSubmitter) oneByOne(ctx context.Context, n int, gap time.Duration) (submitRun, error) {
	r := submitRun{statuses: map[string]int{}}
	start := time.Now()
	for i := range n {
		if i > 0 {
			select {
			case <-time.After(gap):
			case <-ctx.Done():
				return r, ctx.Err()
			}
		}
		if !r.record(s.submit(ctx)) {
			return r, fmt.Errorf("bench async: light-load call %d: %w", i, r.first)
		}
	}
	r.elapsed = time.Since(start)
	return r, nil
}

// awaitCalls waits until every call in ids is in an end state, or timeout
// passes, and returns their records (nil where none could be read). The
// queue hands calls out about in order, so it first waits for the last
// one and only then reads them all, with workers concurrent reads: the
// polling costs the run under way next to nothing.
func (c *Cluster) awaitCalls(ctx context.Context, ids []string, timeout time.Duration, workers int) ([]callEnd, error) {
	recs := make([]callEnd, len(ids))
	if len(ids) == 0 {
		return recs, nil
	}
	deadline := time.Now().Add(timeout)
	last := ids[len(ids)-1]
	_ = poll(ctx, timeout, 50*time.Millisecond, func() (bool, error) {
		r, err := c.Client.Call(ctx, last)
		return err == nil && r.Status.Final(), nil
	}, func() string { return "" })
	pending := make([]int, len(ids))
	for i := range pending {
		pending[i] = i
	}
	var lastErr error
	for {
		var mu sync.Mutex
		var still []int
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(max(workers, 1), len(pending)) {
			wg.Go(func() {
				for j := int(next.Add(1) - 1); j < len(pending) && ctx.Err() == nil; j = int(next.Add(1) - 1) {
					i := pending[j]
					r, err := c.Client.Call(ctx, ids[i])
					if err == nil {
						recs[i] = endOf(r)
					}
					if err != nil || !r.Status.Final() {
						mu.Lock()
						still = append(still, i)
						if err != nil {
							lastErr = err
						}
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if err := ctx.Err(); err != nil {
			return recs, err
		}
		if len(still) == 0 {
			return recs, nil
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("bench async: %d of %d calls not finished after %s", len(still), len(ids), timeout)
			if lastErr != nil {
				err = fmt.Errorf("%w (last error reading a call: %w)", err, lastErr)
			}
			return recs, err
		}
		pending = still
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return recs, ctx.Err()
		}
	}
}

// callEnd is what the run keeps of a call's record: what the summary and
// calls.csv read, without pointers. The run holds every call's to its
// end, with --local in the process that runs the cluster too: as records,
// they were a third of that process's heap objects (the garbage collector
// marked them at every cycle, taking the CPU from the submits meanwhile).
type callEnd struct {
	submitted, started, finished int64 // Unix ns; 0: unknown
	queueUs                      int64 // the last attempt's queue wait; -1: not reported
	execUs                       int64 // the trace function's ExecutionTime; 0: not reported
	attempts                     int32
	code                         int16 // the attempt's HTTP status
	status                       uint8 // index in callStatuses; 0: no record read
	result                       bool  // the record has the attempt's result
	cold                         bool  // the attempt started a sandbox (X-Brisk-Timing)
}

var callStatuses = [...]async.Status{"", async.StatusQueued, async.StatusRunning, async.StatusSucceeded, async.StatusFailed, async.StatusDead}

func endOf(r *async.Record) callEnd {
	e := callEnd{submitted: r.SubmittedAt.UnixNano(), queueUs: -1, attempts: int32(r.Attempts)}
	if r.StartedAt != nil {
		e.started = r.StartedAt.UnixNano()
	}
	if r.FinishedAt != nil {
		e.finished = r.FinishedAt.UnixNano()
	}
	for i, st := range callStatuses[1:] {
		if r.Status == st {
			e.status = uint8(i + 1)
		}
	}
	if r.Result != nil {
		e.result, e.code = true, int16(r.Result.Status)
		if t := r.Result.Header.Get(loadgen.HeaderTiming); t != "" {
			e.queueUs, e.cold = loadgen.ParseTiming(t)
		}
		var rep loadgen.Reply
		loadgen.ParseReply(&rep, r.Result.Body)
		e.execUs = rep.ExecUs
	}
	return e
}

// Status is the call's end state ("" when no record was read).
func (e *callEnd) Status() async.Status { return callStatuses[e.status] }

// cpuTrace samples this process's CPU time until stopped, to read it at
// times known only afterwards (a call's FinishedAt).
type cpuTrace struct {
	mu   sync.Mutex
	t    []time.Time
	cpu  []time.Duration
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func startCPUTrace(every time.Duration) *cpuTrace {
	ct := &cpuTrace{done: make(chan struct{})}
	ct.sample()
	ct.wg.Go(func() {
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-ct.done:
				return
			case <-tk.C:
				ct.sample()
			}
		}
	})
	return ct
}

func (ct *cpuTrace) sample() {
	now, cpu := time.Now(), processCPU()
	ct.mu.Lock()
	ct.t, ct.cpu = append(ct.t, now), append(ct.cpu, cpu)
	ct.mu.Unlock()
}

func (ct *cpuTrace) stop() {
	ct.once.Do(func() {
		close(ct.done)
		ct.wg.Wait()
		ct.sample()
	})
}

// at is the CPU time at t, interpolated between the samples around it.
func (ct *cpuTrace) at(t time.Time) time.Duration {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	n := len(ct.t)
	if n == 0 {
		return 0
	}
	if !t.After(ct.t[0]) {
		return ct.cpu[0]
	}
	for i := 1; i < n; i++ {
		if !t.After(ct.t[i]) {
			span := ct.t[i].Sub(ct.t[i-1])
			if span <= 0 {
				return ct.cpu[i]
			}
			f := float64(t.Sub(ct.t[i-1])) / float64(span)
			return ct.cpu[i-1] + time.Duration(f*float64(ct.cpu[i]-ct.cpu[i-1]))
		}
	}
	return ct.cpu[n-1]
}

// phaseRecords are one phase's calls and their records.
type phaseRecords struct {
	phase string
	ids   []string
	recs  []callEnd
}

// writeCallsCSV writes one row per call: its phase, id, end state,
// attempts, and times (µs since the Unix epoch; empty when unknown) and
// the data plane's queue wait of the last attempt.
func writeCallsCSV(w io.Writer, phases []phaseRecords) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"phase", "call_id", "status", "attempts", "submitted_us", "started_us", "finished_us", "queue_us"})
	us := func(ns int64) string {
		if ns == 0 {
			return ""
		}
		return strconv.FormatInt(ns/1e3, 10)
	}
	for _, p := range phases {
		for i, id := range p.ids {
			r := &p.recs[i]
			if r.status == 0 {
				_ = cw.Write([]string{p.phase, id, "unknown", "", "", "", "", ""})
				continue
			}
			q := ""
			if r.queueUs >= 0 {
				q = strconv.FormatInt(r.queueUs, 10)
			}
			_ = cw.Write([]string{p.phase, id, string(r.Status()), strconv.Itoa(int(r.attempts)), us(r.submitted), us(r.started), us(r.finished), q})
		}
	}
	cw.Flush()
	return cw.Error()
}

// outcome counts how the calls ended.
func outcome(recs []callEnd) CallOutcome {
	o := CallOutcome{Accepted: len(recs)}
	for i := range recs {
		r := &recs[i]
		switch st := r.Status(); {
		case !st.Final():
			o.Unfinished++
		case st == async.StatusSucceeded:
			o.Succeeded++
		default:
			o.Failed++
		}
		if r.attempts > 1 {
			o.Retried++
		}
	}
	return o
}

// span returns the first and last SubmittedAt and the last FinishedAt of
// the finished calls.
func span(recs []callEnd) (first, lastSubmit, lastFinish time.Time) {
	var f, ls, lf int64
	for i := range recs {
		r := &recs[i]
		if r.finished == 0 {
			continue
		}
		if f == 0 || r.submitted < f {
			f = r.submitted
		}
		ls, lf = max(ls, r.submitted), max(lf, r.finished)
	}
	if f == 0 {
		return
	}
	return time.Unix(0, f), time.Unix(0, ls), time.Unix(0, lf)
}

// finishedBy counts the calls finished by t.
func finishedBy(recs []callEnd, t time.Time) int {
	n := 0
	for i := range recs {
		if f := recs[i].finished; f != 0 && f <= t.UnixNano() {
			n++
		}
	}
	return n
}

// lightPhase computes phase 2's latencies from the records.
func lightPhase(recs []callEnd, cfg AsyncConfig, acceptMs []float64) LightPhase {
	var over, disp, wait, e2e []float64
	noTiming := 0
	for i := range recs {
		r := &recs[i]
		if r.started == 0 || r.finished == 0 || !r.result || r.Status() != async.StatusSucceeded {
			continue
		}
		d := ms(time.Duration(r.started - r.submitted))
		q := 0.0
		if r.queueUs >= 0 {
			q = float64(r.queueUs) / 1000
		} else {
			noTiming++
		}
		disp, wait, over = append(disp, d), append(wait, q), append(over, d+q)
		e2e = append(e2e, ms(time.Duration(r.finished-r.submitted)))
	}
	return LightPhase{Count: cfg.LightCalls, GapMs: ms(cfg.LightGap), OverheadMs: workload.NewDist(over), DispatchMs: workload.NewDist(disp),
		QueueWaitMs: workload.NewDist(wait), EndToEndMs: workload.NewDist(e2e), LatencyMs: workload.NewDist(acceptMs), Outcome: outcome(recs), NoTiming: noTiming}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func formatOutcome(o CallOutcome) string {
	if o.Succeeded == o.Accepted {
		s := fmt.Sprintf("all %d succeeded", o.Accepted)
		if o.Retried > 0 {
			s += fmt.Sprintf(" (%d after a retry)", o.Retried)
		}
		return s
	}
	return fmt.Sprintf("%d of %d succeeded, %d failed, %d unfinished", o.Succeeded, o.Accepted, o.Failed, o.Unfinished)
}

func formatAccept(a *AcceptPhase) string {
	return fmt.Sprintf("accept:  %d clients, %.1f s: %d accepted of %d sent, %.0f/s; accept latency ms p50 %.3f p99 %.3f max %.3f\n"+
		"         %s; %d finished while submitting, the last %.1f s after the first submit",
		a.Clients, a.DurationS, a.Calls.Accepted, a.Sent, a.AcceptedPerS, a.LatencyMs.P50, a.LatencyMs.P99, a.LatencyMs.Max,
		formatOutcome(a.Calls), a.FinishedWhileSubmitting, a.DrainedS)
}

func formatPaced(p *PacedPhase) string {
	return fmt.Sprintf("paced:   %d clients offering %.0f/s, %.1f s: %d accepted of %d sent, %.0f/s; accept latency ms p50 %.3f p99 %.3f max %.3f (%d sent late, every client busy)\n"+
		"         %s",
		p.Clients, p.OfferedPerS, p.DurationS, p.Calls.Accepted, p.Sent, p.AcceptedPerS, p.LatencyMs.P50, p.LatencyMs.P99, p.LatencyMs.Max, p.Late, formatOutcome(p.Calls))
}

func formatLight(l *LightPhase) string {
	return fmt.Sprintf("light:   %d calls %g ms apart: accept→start ms p50 %.3f p99 %.3f max %.3f (dispatch p50 %.3f, data-plane queue p50 %.3f); submit→finish p50 %.3f; %s",
		l.Count, l.GapMs, l.OverheadMs.P50, l.OverheadMs.P99, l.OverheadMs.Max, l.DispatchMs.P50, l.QueueWaitMs.P50, l.EndToEndMs.P50, formatOutcome(l.Outcome))
}

func formatDrain(d *DrainPhase) string {
	if d.Paused {
		cpu := ""
		if d.SubmitCPUPerCallUs > 0 {
			cpu = fmt.Sprintf(", CPU %.1f µs per submit", d.SubmitCPUPerCallUs)
		}
		return fmt.Sprintf("drain:   backlog %d submitted with the queue paused in %.1f s (%.0f/s, accept latency ms p50 %.3f p99 %.3f%s); drained in %.1f s from the resume: %.0f calls/s; %s",
			d.Backlog, d.SubmitS, d.SubmitPerS, d.LatencyMs.P50, d.LatencyMs.P99, cpu, d.DrainS, d.DrainedPerS, formatOutcome(d.Calls))
	}
	return fmt.Sprintf("drain:   backlog %d submitted in %.1f s (%.0f/s, accept p99 %.3f ms) while the queue drained (only a --local cluster's queue can be paused,\n"+
		"         so the drain rate is at most the submit rate); drained in %.1f s from the first submit: %.0f calls/s (%.0f/s for the %d after the last submit); %s",
		d.Backlog, d.SubmitS, d.SubmitPerS, d.LatencyMs.P99, d.DrainS, d.DrainedPerS, d.TailPerS, d.TailCalls, formatOutcome(d.Calls))
}

// asyncGoals are the targets against the run.
func asyncGoals(s *AsyncSummary) []Goal {
	return []Goal{
		{Name: fmt.Sprintf("accepted per second, %d clients", s.Accept.Clients), Target: "≥ 10000", Measured: s.Accept.AcceptedPerS, Met: s.Accept.AcceptedPerS >= 10_000},
		{Name: fmt.Sprintf("accept latency p99, %d clients (ms)", s.Accept.Clients), Target: "≤ 5", Measured: s.Accept.LatencyMs.P99,
			Met: s.Accept.LatencyMs.N > 0 && s.Accept.LatencyMs.P99 <= 5 && s.Accept.AcceptedPerS >= 10_000},
		// Stricter than the goal: a schedule the clients keep, so
		// that a stall shows in every call due meanwhile.
		{Name: fmt.Sprintf("paced: accept latency p99 at %.0f/s offered (ms)", s.Paced.OfferedPerS), Target: "≤ 5", Measured: s.Paced.LatencyMs.P99,
			Met: s.Paced.LatencyMs.N > 0 && s.Paced.LatencyMs.P99 <= 5 && s.Paced.OfferedPerS >= 10_000 && s.Paced.AcceptedPerS >= 0.95*s.Paced.OfferedPerS},
		{Name: "accept→start p50 at light load (ms)", Target: "≤ 2", Measured: s.Light.OverheadMs.P50, Met: s.Light.OverheadMs.N > 0 && s.Light.OverheadMs.P50 <= 2},
		{Name: "drain rate / sync throughput", Target: "≥ 0.5", Measured: s.DrainOverSync, Met: s.DrainOverSync >= 0.5},
	}
}

func formatGoals(goals []Goal) string {
	var b strings.Builder
	b.WriteString("goals:")
	for _, g := range goals {
		mark := "not met"
		if g.Met {
			mark = "met"
		}
		fmt.Fprintf(&b, "\n  %-38s %-8s measured %-10.3f %s", g.Name, g.Target, g.Measured, mark)
	}
	return b.String()
}

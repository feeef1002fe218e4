package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// RegisterConfig is `brisk bench register`: closed-loop registrations by
// Options.Clients concurrent clients, then "N functions register and are
// invocable": fresh functions registered the same way, each invoked as soon
// as its registration is acknowledged, until all have answered.
type RegisterConfig struct {
	Functions int
	// Invocable is the number of functions of the second phase; 0 means
	// min(Functions, 1000), negative skips it.
	Invocable int
}

// RegisterSummary is summary.json of bench register. Issued, completed,
// failed, throughput_rps and latency_ms describe the registrations.
type RegisterSummary struct {
	Command       string        `json:"command"`
	Clients       int           `json:"clients"`
	Issued        int           `json:"issued"`
	Completed     int           `json:"completed"`
	Failed        int           `json:"failed"`
	ThroughputRPS float64       `json:"throughput_rps"` // acknowledged registrations per second
	LatencyMs     workload.Dist `json:"latency_ms"`     // POST to 201
	ElapsedS      float64       `json:"elapsed_s"`      // first POST to last acknowledgement
	Invocable     *Invocable    `json:"invocable,omitempty"`
	Host          HostInfo      `json:"host"`
}

// Invocable is the register-and-invoke phase.
type Invocable struct {
	Functions int `json:"functions"`
	// AllInvocableS is the time from the first POST until every function
	// has answered an invocation with 200.
	AllInvocableS float64 `json:"all_invocable_s"`
	// AckToReplyMs: from a function's acknowledged registration to its
	// first 200 (a cold start included).
	AckToReplyMs workload.Dist `json:"ack_to_reply_ms"`
	// NotFoundRetries counts 404s (data plane not yet told of the
	// function) that were retried.
	NotFoundRetries int64 `json:"not_found_retries"`
	Failed          int   `json:"failed"`
}

type regRow struct {
	name       string
	phase      int
	start, ack time.Duration // from the phase's start
	err        error
	replied    time.Duration // 0: never
	retries    int
	status     int
}

// Register runs bench register.
func Register(ctx context.Context, c *Cluster, o Options, cfg RegisterConfig) (*RegisterSummary, string, error) {
	if cfg.Functions <= 0 {
		return nil, "", fmt.Errorf("bench register: --functions %d must be positive", cfg.Functions)
	}
	if cfg.Invocable == 0 {
		cfg.Invocable = min(cfg.Functions, 1000)
	}
	id := runID()
	host := hostInfo()
	clients := o.clients()
	var names []string
	defer func() { cleanup(c, &o, names) }()

	mk := func(prefix string, n int) []*spec.Function {
		fns := make([]*spec.Function, n)
		for i := range fns {
			fns[i] = &spec.Function{Name: prefix + id + "-" + strconv.Itoa(i), Builtin: "trace", Concurrency: 1}
			names = append(names, fns[i].Name)
		}
		return fns
	}
	fns := mk("bench-reg-", cfg.Functions)
	o.logf("registering %d functions with %d clients", cfg.Functions, clients)
	var done atomic.Int64
	bar := loadgen.StartProgress(o.Progress, "register", int64(cfg.Functions), func() (int64, string) { return done.Load(), "" })
	t0 := time.Now()
	regs := registerAll(ctx, c.Client, fns, clients, false, &done)
	bar.Stop()
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	out := &RegisterSummary{Command: "bench register", Clients: clients, Issued: len(regs)}
	var rows []regRow
	var lat []float64
	var last time.Time
	for i, r := range regs {
		row := regRow{name: fns[i].Name, phase: 1, start: r.Start.Sub(t0), ack: r.Start.Add(r.Latency).Sub(t0), err: r.Err}
		rows = append(rows, row)
		if r.Err != nil {
			out.Failed++
			continue
		}
		out.Completed++
		lat = append(lat, float64(r.Latency.Microseconds())/1000)
		last = maxTime(last, r.Start.Add(r.Latency))
	}
	out.LatencyMs = workload.NewDist(lat)
	if out.Completed > 0 {
		out.ElapsedS = last.Sub(t0).Seconds()
		out.ThroughputRPS = float64(out.Completed) / out.ElapsedS
	}
	text := fmt.Sprintf("register: %d functions, %d clients: %d acknowledged, %d failed in %.3f s = %.0f registrations/s; latency ms p50 %.3f p90 %.3f p99 %.3f max %.3f",
		cfg.Functions, clients, out.Completed, out.Failed, out.ElapsedS, out.ThroughputRPS, out.LatencyMs.P50, out.LatencyMs.P90, out.LatencyMs.P99, out.LatencyMs.Max)

	if cfg.Invocable > 0 {
		inv, invRows, err := registerAndInvoke(ctx, c, &o, mk("bench-inv-", cfg.Invocable))
		if err != nil {
			return nil, "", err
		}
		out.Invocable, rows = inv, append(rows, invRows...)
		text += fmt.Sprintf("\ninvocable: %d functions registered and answered a call within %.3f s of the first POST (%d failed, %d 404 retries); ack to first reply ms p50 %.1f p99 %.1f",
			inv.Functions, inv.AllInvocableS, inv.Failed, inv.NotFoundRetries, inv.AckToReplyMs.P50, inv.AckToReplyMs.P99)
	}
	out.Host = host()
	text += "\n" + out.Host.String()
	err := writeRegOutputs(o.Out, out, rows, lat)
	var ferr error
	if out.Failed > 0 {
		ferr = fmt.Errorf("%d of %d registrations failed", out.Failed, out.Issued)
	}
	return out, text, errors.Join(ferr, err)
}

func registerAndInvoke(ctx context.Context, c *Cluster, o *Options, fns []*spec.Function) (*Invocable, []regRow, error) {
	invoker := &loadgen.HTTPInvoker{Client: loadgen.NewHTTPClient(o.HTTP), Route: loadgen.DataPlane(c.Invoke), Header: c.InvokeHeader()}
	rows := make([]regRow, len(fns))
	res := &Invocable{Functions: len(fns)}
	var retries atomic.Int64
	var next atomic.Int64
	var clients, invokes sync.WaitGroup
	// Calls are bounded: a function that has not answered in a minute has
	// failed.
	callCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	for range min(o.clients(), len(fns)) {
		clients.Add(1)
		go func() {
			defer clients.Done()
			for i := int(next.Add(1) - 1); i < len(fns) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				start := time.Now()
				_, err := c.Client.Create(ctx, fns[i])
				row := &rows[i]
				*row = regRow{name: fns[i].Name, phase: 2, start: start.Sub(t0), ack: time.Since(t0), err: err}
				if err != nil {
					continue
				}
				invokes.Add(1)
				go func() {
					defer invokes.Done()
					call := &loadgen.Call{Function: row.name}
					for callCtx.Err() == nil {
						rep := invoker.Invoke(callCtx, call)
						row.status = rep.Status
						if rep.Status == 200 && rep.Err == nil {
							row.replied = time.Since(t0)
							return
						}
						if rep.Status != 404 {
							return
						}
						// The data plane has not heard of the function yet.
						row.retries++
						retries.Add(1)
						select {
						case <-callCtx.Done():
						case <-time.After(time.Millisecond):
						}
					}
				}()
			}
		}()
	}
	clients.Wait()
	invokes.Wait()
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	res.NotFoundRetries = retries.Load()
	var ackToReply []float64
	var all time.Duration
	for i := range rows {
		r := &rows[i]
		if r.err != nil || r.replied == 0 {
			res.Failed++
			continue
		}
		all = max(all, r.replied)
		ackToReply = append(ackToReply, float64((r.replied-r.ack).Microseconds())/1000)
	}
	res.AllInvocableS = all.Seconds()
	res.AckToReplyMs = workload.NewDist(ackToReply)
	return res, rows, nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func writeRegOutputs(dir string, s *RegisterSummary, rows []regRow, lat []float64) error {
	if dir == "" {
		return nil
	}
	if err := writeOutputs(dir, s, nil, []plotSpec{{file: "latency_cdf.png", title: "registration latency (POST to 201)",
		xLabel: "latency (ms)", logX: true, series: []loadgen.Series{{Name: "register", Values: lat}}}}); err != nil {
		return err
	}
	return writeFile(dir+"/registrations.csv", func(w io.Writer) error {
		if _, err := io.WriteString(w, "function,phase,start_us,ack_us,latency_us,error,first_reply_us,status,not_found_retries\n"); err != nil {
			return err
		}
		for _, r := range rows {
			msg := ""
			if r.err != nil {
				msg = strings.NewReplacer(",", ";", "\n", " ", `"`, "'").Replace(r.err.Error())
			}
			if _, err := fmt.Fprintf(w, "%s,%d,%d,%d,%d,%s,%d,%d,%d\n", r.name, r.phase, r.start.Microseconds(), r.ack.Microseconds(),
				(r.ack - r.start).Microseconds(), msg, r.replied.Microseconds(), r.status, r.retries); err != nil {
				return err
			}
		}
		return nil
	})
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ScaleConfig is `brisk bench scale`, KubeDirect's harness (docs/benchmarks.md,
// "brisk bench scale"): K functions deployed at zero, then all set to min = N/K at once
// through PUT /v1/functions/NAME; the clock starts at the first update and
// each sandbox's ready time is when the control plane first announces it
// ready.
type ScaleConfig struct {
	Functions int // K
	Sandboxes int // N, spread evenly (the first N mod K functions get one more)
	Timeout   time.Duration
	// GRPC is the control plane's gRPC address for an existing cluster;
	// with it (and always with a local cluster) ready times come from the
	// endpoint stream, otherwise from polling the admin /metrics.
	GRPC string
}

// ScaleSummary is summary.json of bench scale. Times are seconds from the
// first update.
type ScaleSummary struct {
	Command   string `json:"command"`
	Functions int    `json:"functions"`
	Sandboxes int    `json:"sandboxes"`
	Workers   int    `json:"workers"`
	Ready     int    `json:"ready"`
	// ReadyS summarises per-sandbox ready times (p50, p90, max...).
	ReadyS workload.Dist `json:"ready_s"`
	// AllReadyS is when the last sandbox was ready; 0 if some never were.
	AllReadyS float64 `json:"all_ready_s"`
	// UpdatesAckedS is when the last PUT was acknowledged.
	UpdatesAckedS float64 `json:"updates_acked_s"`
	// Method is how ready times were taken: "endpoint stream" (exact) or
	// "metrics polling" (resolution PollIntervalMs).
	Method         string  `json:"method"`
	PollIntervalMs float64 `json:"poll_interval_ms,omitempty"`
	// CPPlaceToReadyMeanMs is the control plane's own mean of placement to
	// Ready over the run (brisk_controlplane_sandbox_ready_seconds).
	CPPlaceToReadyMeanMs float64  `json:"cp_place_to_ready_mean_ms"`
	SandboxesCreated     int64    `json:"sandboxes_created"`
	TimedOut             bool     `json:"timed_out"`
	Host                 HostInfo `json:"host"`
}

// Scale runs bench scale.
func Scale(ctx context.Context, c *Cluster, o Options, cfg ScaleConfig) (*ScaleSummary, string, error) {
	if cfg.Functions <= 0 || cfg.Sandboxes < cfg.Functions {
		return nil, "", fmt.Errorf("bench scale: --functions %d and --sandboxes %d: want 0 < functions ≤ sandboxes", cfg.Functions, cfg.Sandboxes)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if c.GRPC != "" {
		cfg.GRPC = c.GRPC
	}
	id := runID()
	host := hostInfo()
	names := make([]string, cfg.Functions)
	fns := make([]*spec.Function, cfg.Functions)
	want := make(map[string]int, cfg.Functions)
	for i := range fns {
		names[i] = "bench-scale-" + id + "-" + strconv.Itoa(i)
		fns[i] = &spec.Function{Name: names[i], Builtin: "trace", Concurrency: 1}
		want[names[i]] = cfg.Sandboxes / cfg.Functions
		if i < cfg.Sandboxes%cfg.Functions {
			want[names[i]]++
		}
	}
	defer cleanup(c, &o, names)
	o.logf("registering %d functions at zero", cfg.Functions)
	if err := firstError(registerAll(ctx, c.Client, fns, o.clients(), false, nil), "registering"); err != nil {
		return nil, "", err
	}
	st, err := c.Client.Status(ctx)
	if err != nil {
		return nil, "", err
	}
	out := &ScaleSummary{Command: "bench scale", Functions: cfg.Functions, Sandboxes: cfg.Sandboxes, Workers: len(st.Nodes)}
	readyCount0, readySum0 := c.readyHistogram(ctx)
	created0, _ := c.counter(ctx, "brisk_controlplane_sandbox_creations_total")

	var meter readyMeter
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if cfg.GRPC != "" {
		w, err := watchReady(watchCtx, cfg.GRPC, c.GRPCCreds, want, cfg.Sandboxes)
		if err != nil {
			return nil, "", err
		}
		meter, out.Method = w, "endpoint stream"
	} else {
		meter, out.Method = &readyPoller{c: c, base: readyCount0, total: cfg.Sandboxes, want: want}, "metrics polling"
	}

	updated := make([]*spec.Function, len(fns))
	for i, f := range fns {
		u := *f
		u.Scaling.Min = want[f.Name]
		updated[i] = &u
	}
	bar := loadgen.StartProgress(o.Progress, "ready", int64(cfg.Sandboxes), func() (int64, string) { return meter.count(), "" })
	t0 := time.Now()
	meter.start(t0)
	lastAck, updErr := updateAll(ctx, c, updated, o.clients(), t0)
	werr := meter.wait(ctx, t0.Add(cfg.Timeout))
	bar.Stop()
	stopWatch()
	if err := errors.Join(updErr...); err != nil {
		return nil, "", err
	}
	if werr != nil && !errors.Is(werr, errTimeout) {
		return nil, "", werr
	}
	readyAt := meter.ready()
	out.TimedOut = werr != nil
	out.Ready = len(readyAt)
	out.UpdatesAckedS = lastAck.Seconds()
	if p, ok := meter.(*readyPoller); ok && p.polls > 0 {
		out.PollIntervalMs = p.last * 1000 / float64(p.polls)
	}
	out.ReadyS = workload.NewDist(slices.Clone(readyAt))
	if !out.TimedOut {
		out.AllReadyS = out.ReadyS.Max
	}
	if n1, s1 := c.readyHistogram(ctx); n1 > readyCount0 {
		out.CPPlaceToReadyMeanMs = (s1 - readySum0) / (n1 - readyCount0) * 1000
	}
	if created1, err := c.counter(ctx, "brisk_controlplane_sandbox_creations_total"); err == nil {
		out.SandboxesCreated = int64(created1 - created0)
	}
	out.Host = host()
	text := fmt.Sprintf("scale: %d sandboxes of %d functions over %d workers: %d ready; ready s p50 %.3f p90 %.3f max %.3f (%s); updates acknowledged in %.3f s; control plane placement→ready mean %.1f ms",
		cfg.Sandboxes, cfg.Functions, out.Workers, out.Ready, out.ReadyS.P50, out.ReadyS.P90, out.ReadyS.Max, out.Method, out.UpdatesAckedS, out.CPPlaceToReadyMeanMs)
	if out.TimedOut {
		text += fmt.Sprintf("\n  TIMED OUT after %s with %d of %d ready", cfg.Timeout, out.Ready, cfg.Sandboxes)
	}
	text += "\n" + out.Host.String()
	err = writeScaleOutputs(o.Out, out, readyAt)
	if out.TimedOut {
		err = errors.Join(fmt.Errorf("bench scale: %d of %d sandboxes ready after %s", out.Ready, cfg.Sandboxes, cfg.Timeout), err)
	}
	return out, text, err
}

// updateAll PUTs every spec with n concurrent clients and returns when the
// last was acknowledged, measured from t0.
func updateAll(ctx context.Context, c *Cluster, fns []*spec.Function, n int, t0 time.Time) (time.Duration, []error) {
	var next, lastAck atomic.Int64
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(n, len(fns)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(fns) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if _, err := c.Client.Update(ctx, fns[i]); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("updating %s: %w", fns[i].Name, err))
					mu.Unlock()
				}
				d := int64(time.Since(t0))
				for old := lastAck.Load(); d > old && !lastAck.CompareAndSwap(old, d); old = lastAck.Load() {
				}
			}
		}()
	}
	wg.Wait()
	return time.Duration(lastAck.Load()), errs
}

// readyMeter takes per-sandbox ready times.
type readyMeter interface {
	start(t0 time.Time)
	wait(ctx context.Context, deadline time.Time) error
	ready() []float64
	count() int64
}

var (
	_ readyMeter = (*readyWatch)(nil)
	_ readyMeter = (*readyPoller)(nil)
)

// readyPoller is the fallback without the control plane's gRPC address:
// it polls the _count of brisk_controlplane_sandbox_ready_seconds on the
// admin /metrics — one line, where listing thousands of functions costs
// the control plane more than the scale-up it measures — each poll
// waiting twice the previous one's duration (at least 5 ms). When the
// count is reached, the function list confirms the sandboxes are ours (a
// shared cluster may scale others); if not, the list is polled instead.
type readyPoller struct {
	c      *Cluster
	base   float64
	total  int
	want   map[string]int
	t0     time.Time
	mu     sync.Mutex
	at     []float64
	polls  int
	last   float64
	listed bool
}

func (p *readyPoller) start(t0 time.Time) { p.t0 = t0 }

func (p *readyPoller) ours(ctx context.Context) (int, error) {
	list, err := p.c.Client.List(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range list {
		if w, ok := p.want[f.Name]; ok {
			n += min(f.Status.Ready, w)
		}
	}
	return n, nil
}

func (p *readyPoller) wait(ctx context.Context, deadline time.Time) error {
	for {
		pollStart := time.Now()
		var n int
		var err error
		if p.listed {
			n, err = p.ours(ctx)
		} else {
			var count float64
			count, _, err = p.c.readyHistogramErr(ctx)
			n = int(count - p.base)
		}
		if err != nil {
			return err
		}
		now := time.Since(p.t0).Seconds()
		p.mu.Lock()
		p.polls, p.last = p.polls+1, now
		for len(p.at) < min(n, p.total) {
			p.at = append(p.at, now)
		}
		done := len(p.at) >= p.total
		p.mu.Unlock()
		if done {
			if p.listed {
				return nil
			}
			if mine, err := p.ours(ctx); err != nil || mine >= p.total {
				return err
			}
			p.mu.Lock()
			p.listed, p.at = true, p.at[:0] // others were scaling too: count ours only
			p.mu.Unlock()
			continue
		}
		if time.Now().After(deadline) {
			return errTimeout
		}
		t := time.NewTimer(max(5*time.Millisecond, 2*time.Since(pollStart)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (p *readyPoller) ready() []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]float64(nil), p.at...)
}

func (p *readyPoller) count() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(len(p.at))
}

// readyHistogram reads the control plane's placement-to-ready histogram's
// count and sum; zeros if it cannot.
func (c *Cluster) readyHistogram(ctx context.Context) (count, sum float64) {
	count, sum, _ = c.readyHistogramErr(ctx)
	return count, sum
}

func (c *Cluster) readyHistogramErr(ctx context.Context) (count, sum float64, err error) {
	body, err := c.scrape(ctx, c.Admin)
	if err != nil {
		return 0, 0, err
	}
	return metricValues(body, "brisk_controlplane_sandbox_ready_seconds_count", "")[""],
		metricValues(body, "brisk_controlplane_sandbox_ready_seconds_sum", "")[""], nil
}

func writeScaleOutputs(dir string, s *ScaleSummary, readyAt []float64) error {
	if dir == "" {
		return nil
	}
	ms := make([]float64, len(readyAt))
	for i, v := range readyAt {
		ms[i] = v * 1000
	}
	if err := writeOutputs(dir, s, nil, []plotSpec{{file: "ready_cdf.png", title: fmt.Sprintf("%d sandboxes over %d workers", s.Sandboxes, s.Workers),
		xLabel: "time to ready since the first update (ms)", series: []loadgen.Series{{Name: "sandboxes", Values: ms}}}}); err != nil {
		return err
	}
	return writeFile(dir+"/ready.csv", func(w io.Writer) error {
		if _, err := io.WriteString(w, "sandbox,ready_us\n"); err != nil {
			return err
		}
		for i, v := range readyAt {
			if _, err := fmt.Fprintf(w, "%d,%d\n", i, int64(v*1e6)); err != nil {
				return err
			}
		}
		return nil
	})
}

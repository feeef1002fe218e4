package bench

import (
	"context"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// monitor samples, once per interval, the memory reserved by the run's
// sandboxes (from GET /v1/status: ready + pending sandboxes × the
// function's requested memory) and the part of it serving a request (from
// the data plane's brisk_dataplane_inflight{function} gauge: with
// concurrency 1 each in-flight request occupies one ready sandbox).
type monitor struct {
	c        *Cluster
	memMB    map[string]float64 // function → requested MiB per sandbox
	interval time.Duration

	samples   []workload.MemorySample
	failures  int
	lastError error
	peak      int // most sandboxes (ready + pending) seen at once
}

func (m *monitor) run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	start := time.Now()
	for {
		m.sample(ctx, time.Since(start).Seconds())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *monitor) sample(ctx context.Context, at float64) {
	st, err := m.c.Client.Status(ctx)
	if err != nil {
		m.failures, m.lastError = m.failures+1, err
		return
	}
	var inflight map[string]float64
	if body, err := m.c.scrape(ctx, m.c.Invoke); err == nil {
		inflight = metricValues(body, "brisk_dataplane_inflight", "function")
	} else {
		m.failures, m.lastError = m.failures+1, err
	}
	s := workload.MemorySample{At: at}
	live := 0
	for _, f := range st.Functions {
		mb, ok := m.memMB[f.Name]
		if !ok {
			continue
		}
		live += f.Ready + f.Pending
		s.ReservedMB += float64(f.Ready+f.Pending) * mb
		s.BusyMB += min(inflight[f.Name], float64(f.Ready)) * mb
	}
	m.peak = max(m.peak, live)
	m.samples = append(m.samples, s)
}

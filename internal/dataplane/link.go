package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// Reconnect backoff bounds and the per-RPC timeout of unary calls.
const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 500 * time.Millisecond // an HA control plane fails over in well under a second
	rpcTimeout = 5 * time.Second
)

// link is the data plane's side of the control-plane connection: the
// endpoint watch and the metric reports.
type link struct {
	d      *DataPlane
	client briskv1.ControlPlaneClient
	// sendMu makes the periodic and urgent reports reach the control
	// plane in the order they were collected (it steps on each before it
	// answers): a periodic report collected before a withdrawal and
	// arriving after the urgent one that lists the sandbox as draining
	// would clear its hold.
	sendMu sync.Mutex
}

func newLink(d *DataPlane, conn grpc.ClientConnInterface) *link {
	return &link{d: d, client: briskv1.NewControlPlaneClient(conn)}
}

// watch registers and follows WatchEndpoints until ctx ends, reconnecting
// with capped exponential backoff and jitter. Every session starts with a
// snapshot, which resynchronises whatever was missed while disconnected.
func (l *link) watch(ctx context.Context) {
	delay := backoffMin
	for {
		synced, err := l.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if synced {
			delay = backoffMin
		}
		l.d.log.Warn("control-plane link down; reconnecting", "control_plane", l.d.cfg.ControlPlane, "err", err)
		// Jitter in [delay/2, delay) spreads reconnecting data planes.
		wait := delay/2 + time.Duration(l.d.rnd()%uint64(delay/2))
		if !sleepCtx(ctx, wait) {
			return
		}
		delay = min(delay*2, backoffMax)
	}
}

// sleepCtx waits d, or less if ctx ends first; it reports whether the
// whole wait passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session runs one registration and watch; synced reports whether a
// snapshot was applied.
func (l *link) session(ctx context.Context) (synced bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	_, err = l.client.RegisterDataPlane(rctx, &briskv1.RegisterDataPlaneRequest{Id: l.d.ID(), Address: l.d.Addr()})
	cancel()
	if err != nil {
		return false, fmt.Errorf("register data plane %q: %w", l.d.ID(), err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := l.client.WatchEndpoints(sctx, &briskv1.WatchEndpointsRequest{DataPlaneId: l.d.ID()})
	if err != nil {
		return false, fmt.Errorf("watch endpoints: %w", err)
	}
	for {
		b, err := stream.Recv()
		if err != nil {
			return synced, fmt.Errorf("watch endpoints: %w", err)
		}
		if !synced && !b.GetSnapshot() {
			// Applying a delta to state from an earlier session could keep
			// sandboxes that are long gone; start over.
			return false, errors.New("watch endpoints: first batch is not a snapshot")
		}
		l.d.Apply(b)
		if !synced {
			synced = true
			// A control plane that has just (re)started or taken over
			// knows nothing of this data plane's calls: the next urgent
			// report lists every busy function again.
			l.d.forgetSent()
			l.d.log.Info("endpoints synchronised", "functions", len(b.GetFunctions()), "endpoints", len(b.GetAdded()), "tokens", len(b.GetAuth().GetTokens()))
		}
	}
}

// reportPeriodic sends one report every MetricsInterval.
func (l *link) reportPeriodic(ctx context.Context) {
	t := time.NewTicker(l.d.cfg.MetricsInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.report(ctx, func() *briskv1.MetricsReport { return l.d.collect(now, now.Sub(last)) })
			last = now
		}
	}
}

// reportUrgent sends a report whenever the doorbell rings; while one is in
// flight further rings coalesce into the next.
func (l *link) reportUrgent(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.d.urgentBell:
		}
		l.report(ctx, func() *briskv1.MetricsReport { return l.d.collectUrgent(time.Now()) })
	}
}

// report collects a report and sends it unless it says nothing, under
// sendMu: reports reach the control plane in the order collected.
func (l *link) report(ctx context.Context, collect func() *briskv1.MetricsReport) {
	l.sendMu.Lock()
	defer l.sendMu.Unlock()
	if rep := collect(); len(rep.Functions) > 0 || len(rep.Draining) > 0 {
		l.send(ctx, rep)
	}
}

func (l *link) send(ctx context.Context, rep *briskv1.MetricsReport) {
	rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	if _, err := l.client.ReportMetrics(rctx, rep); err != nil && ctx.Err() == nil {
		// The watch loop reports the link state; this is only detail.
		l.d.log.Debug("report metrics", "urgent", rep.GetUrgent(), "err", err)
	}
}

// collect closes the metric interval of every function on the active list
// (noteActive). A function is included if it had activity, has requests
// now, or has not yet reported its first idle interval; after that one it
// leaves the list until its next arrival.
func (d *DataPlane) collect(now time.Time, interval time.Duration) *briskv1.MetricsReport {
	rep := &briskv1.MetricsReport{
		DataPlaneId: d.ID(),
		UnixMs:      now.UnixMilli(),
		IntervalMs:  interval.Milliseconds(),
		Draining:    d.drainingIDs(true),
	}
	t := d.nanotime()
	d.activeMu.Lock()
	defer d.activeMu.Unlock()
	kept := d.active[:0]
	for _, fn := range d.active {
		name := fn.name
		if d.lookup(name) != fn { // deleted
			fn.listed = false
			continue
		}
		avg, requests, report := fn.stats.cut(t, interval.Nanoseconds())
		// Quiet now: off the list. An arrival that woke it since waits for
		// activeMu and lists it again.
		if fn.stats.isQuiet() {
			fn.listed = false
		} else {
			kept = append(kept, fn)
		}
		// Latencies of calls that ended in the interval: cut with the load,
		// from the counters the calls already keep for Prometheus.
		latency := fn.m.duration.cut()
		if !report && latency == nil {
			continue
		}
		queued, inFlight := fn.q.Len(), fn.inFlight()
		fn.sent = callCounts(inFlight, queued)
		rep.Functions = append(rep.Functions, &briskv1.FunctionMetric{
			Function:       name,
			AvgConcurrency: avg,
			Requests:       requests,
			Queued:         queued,
			NoCapacity:     queued > 0,
			LatencyBuckets: latency,
			InFlight:       inFlight,
		})
	}
	clear(d.active[len(kept):])
	d.active = kept
	return rep
}

// collectUrgent reports the functions with requests waiting and no free
// slot. avg_concurrency is the load now, and requests is 0: arrivals are
// counted once, by the periodic report. It also lists every other function
// whose calls in flight or queued changed since the last report carried
// them (those two counts only), so that the control plane making room for
// the waiting calls knows which sandboxes are busy at this moment, not as
// of the last periodic report. A function left out stands as last
// reported: the report and the control plane's work on it grow with what
// changed, not with every busy function, for one is sent whenever a call
// waits.
func (d *DataPlane) collectUrgent(now time.Time) *briskv1.MetricsReport {
	d.urgentMu.Lock()
	fns := d.urgentFns
	d.urgentFns = nil
	d.urgentMu.Unlock()
	rep := &briskv1.MetricsReport{DataPlaneId: d.ID(), UnixMs: now.UnixMilli(), Urgent: true, Draining: d.drainingIDs(false)}
	// A function with calls in flight or queued is not quiet: it is on
	// the active list, and its sent counts are guarded by activeMu.
	d.activeMu.Lock()
	defer d.activeMu.Unlock()
	for _, fn := range fns {
		fn.urgent.Store(false) // before reading queued: a later trigger re-queues fn
		queued := fn.q.Len()
		if queued == 0 {
			continue // served meanwhile
		}
		inFlight := fn.inFlight()
		fn.sent = callCounts(inFlight, queued)
		rep.Functions = append(rep.Functions, &briskv1.FunctionMetric{
			Function:       fn.name,
			AvgConcurrency: float64(fn.stats.current()),
			Queued:         queued,
			NoCapacity:     true,
			InFlight:       inFlight,
		})
	}
	if len(rep.Functions) == 0 {
		return rep
	}
	for _, fn := range d.active {
		inFlight, queued := fn.inFlight(), fn.q.Len()
		if c := callCounts(inFlight, queued); c != fn.sent && d.lookup(fn.name) == fn {
			fn.sent = c
			rep.Functions = append(rep.Functions, &briskv1.FunctionMetric{Function: fn.name, InFlight: inFlight, Queued: queued})
		}
	}
	return rep
}

// forgetSent marks every active function's counts as never reported.
func (d *DataPlane) forgetSent() {
	d.activeMu.Lock()
	defer d.activeMu.Unlock()
	for _, fn := range d.active {
		fn.sent = unsent
	}
}

// unsent is no function's packed counts (callCounts takes no negative
// counts), so a function marked with it is listed by the next report.
const unsent = ^uint64(0)

// callCounts packs a function's calls in flight and queued for comparison
// with what a report last carried.
func callCounts(inFlight, queued int32) uint64 {
	return uint64(uint32(inFlight))<<32 | uint64(uint32(queued))
}

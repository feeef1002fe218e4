package dataplane

import (
	"iter"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/telemetry"
)

// latencyBuckets span a sub-millisecond warm call to a function that runs for
// minutes. They are the wire's (FunctionMetric.latency_buckets), so that the
// reports to the control plane are cuts of the same counters.
var latencyBuckets = briskv1.LatencyBounds

const nBuckets = len(latencyBuckets)

// latencyBoundsNs are latencyBuckets in nanoseconds, for the hot path.
var latencyBoundsNs = func() (b [nBuckets]int64) {
	for i, s := range latencyBuckets {
		b[i] = int64(s * 1e9)
	}
	return b
}()

// promMetrics are the data plane's metrics. The per-function ones are not
// Prometheus vectors: each function keeps plain atomic counters (fnMetrics)
// and fnCollector turns them into series when scraped. A vector child per
// function and label set cost ~3.5 KB of heap per function — a third of the
// live heap with 10,000 functions, which every GC cycle marks — and its
// creation was 7 % of a registration's CPU.
type promMetrics struct {
	queueWait prometheus.Histogram
	// firstByte: request sent to the sandbox -> its reply head back.
	firstByte prometheus.Histogram
	// Connections the front end accepted, those of them it handed to the
	// net/http server, and those it closed at once for MaxConnections
	// (internal/dataplane/front).
	accepted, handedOff, refused prometheus.Counter
	errors                       *reasonCounters // brisk-generated errors by reason
	emergency                    *prometheus.CounterVec
	unknownWaits                 prometheus.Counter // calls that waited in awaitFunction
	reroutes                     prometheus.Counter // calls moved off a sandbox that refused them
	handler                      http.Handler       // /metrics; nil when the Registerer cannot be gathered
}

func newPromMetrics(reg prometheus.Registerer, fns func() iter.Seq2[string, *function], reading *atomic.Int64, extra []prometheus.Collector) (*promMetrics, error) {
	reg, handler := telemetry.Metrics(reg)
	errVec, errs := newReasonCounters()
	m := &promMetrics{
		errors:  errs,
		handler: handler,
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brisk_dataplane_queue_wait_seconds",
			Help:    "Time requests that found no free sandbox slot spent queued.",
			Buckets: latencyBuckets[:],
		}),
		firstByte: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brisk_dataplane_first_byte_seconds",
			Help:    "Time from a request's dispatch to its sandbox until the reply head came back (the function's time to first byte, network included).",
			Buckets: latencyBuckets[:],
		}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brisk_dataplane_connections_accepted_total",
			Help: "Client connections accepted on the invocation listener.",
		}),
		handedOff: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brisk_dataplane_connections_handed_off_total",
			Help: "Client connections the HTTP/1.1 front end handed to the net/http server (h2c, upgrades, Expect, chunked or large bodies, /metrics, unknown functions, input it would reject).",
		}),
		emergency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brisk_dataplane_emergency_calls_total",
			Help: "Calls of dual-mode functions sent to a worker's emergency track, by result: served, refused (by a worker, before reaching a sandbox: tried elsewhere or queued) or failed (after reaching it: answered 502/504, not retried).",
		}, []string{"result"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brisk_dataplane_connections_refused_total",
			Help: "Client connections closed as soon as accepted: the data plane had MaxConnections open.",
		}),
		reroutes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brisk_dataplane_reroutes_total",
			Help: "Calls moved to another sandbox because theirs refused the connection (it had died before its withdrawal reached this data plane).",
		}),
		unknownWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "brisk_dataplane_unknown_function_waits_total",
			Help: "Calls of a function this data plane did not know that waited for it to arrive (one registered a moment ago, or none: then a 404 after the wait).",
		}),
	}
	for _, c := range append(extra, m.queueWait, m.firstByte, m.emergency, m.accepted, m.handedOff, m.refused, m.unknownWaits, m.reroutes, errVec, newFnCollector(fns),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "brisk_dataplane_bodies_reading",
			Help: "Requests reading their body before they take a sandbox slot (slow uploads show here, not as busy sandboxes).",
		}, func() float64 { return float64(reading.Load()) })) {
		if err := telemetry.Register(reg, "data plane", c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// fnMetrics is one function's counters. Queue length and endpoint count
// are read from the function itself at scrape time.
type fnMetrics struct {
	used      atomic.Bool // exported once it had an endpoint or a call
	cold      atomic.Uint64
	emergency atomic.Uint64 // calls served on the emergency track
	inflight  atomic.Int64
	codes     codeCounts
	duration  latencyHisto
}

// codeCounts counts requests by status code: a few codes in lock-free
// slots, any further ones in a map.
type codeCounts struct {
	slots [6]struct {
		code atomic.Uint32
		n    atomic.Uint64
	}
	mu   sync.Mutex
	more map[int]uint64
}

func (c *codeCounts) inc(code int) {
	want := uint32(code)
	for i := range c.slots {
		s := &c.slots[i]
		got := s.code.Load()
		if got == 0 && s.code.CompareAndSwap(0, want) {
			got = want
		} else if got == 0 {
			got = s.code.Load()
		}
		if got == want {
			s.n.Add(1)
			return
		}
	}
	c.mu.Lock()
	if c.more == nil {
		c.more = make(map[int]uint64)
	}
	c.more[code]++
	c.mu.Unlock()
}

func (c *codeCounts) each(f func(code int, n uint64)) {
	for i := range c.slots {
		s := &c.slots[i]
		if code := s.code.Load(); code != 0 {
			f(int(code), s.n.Load())
		}
	}
	c.mu.Lock()
	more := make(map[int]uint64, len(c.more))
	for code, n := range c.more {
		more[code] = n
	}
	c.mu.Unlock()
	for code, n := range more { // f may block (a scrape's channel): not under mu
		f(code, n)
	}
}

// latencyHisto is a histogram over latencyBuckets: per-bucket counts (the
// last is +Inf) and the sum in nanoseconds. The counts only grow
// (Prometheus reads them); reported is what the metric reports to the
// control plane have carried so far.
type latencyHisto struct {
	counts   [nBuckets + 1]atomic.Uint64
	sumNs    atomic.Int64
	reported [nBuckets + 1]atomic.Uint64
}

func (h *latencyHisto) observe(ns int64) {
	i := 0
	for i < nBuckets && ns > latencyBoundsNs[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNs.Add(ns)
}

// cut returns the per-bucket counts observed since the last cut, without
// trailing empty buckets (nil when none), for a metric report. reported
// only moves forward, by compare-and-swap, so concurrent cuts share the
// counts out and none is reported twice; calls observed meanwhile fall in
// this cut or the next.
func (h *latencyHisto) cut() []uint64 {
	var delta [nBuckets + 1]uint64
	n := 0
	for i := range h.counts {
		for {
			prev, cur := h.reported[i].Load(), h.counts[i].Load()
			if cur <= prev {
				break
			}
			if h.reported[i].CompareAndSwap(prev, cur) {
				delta[i], n = cur-prev, i+1
				break
			}
		}
	}
	if n == 0 {
		return nil
	}
	return append([]uint64(nil), delta[:n]...)
}

// fnCollector exports every used function's counters.
type fnCollector struct {
	fns                                  func() iter.Seq2[string, *function]
	requests, duration, cold             *prometheus.Desc
	queued, inflight, endpoints, unknown *prometheus.Desc
}

func newFnCollector(fns func() iter.Seq2[string, *function]) *fnCollector {
	fn := []string{"function"}
	return &fnCollector{
		fns:       fns,
		requests:  prometheus.NewDesc("brisk_dataplane_requests_total", "Invocations by function and HTTP status code (499: the client went away).", []string{"function", "code"}, nil),
		duration:  prometheus.NewDesc("brisk_dataplane_request_duration_seconds", "Invocation latency seen by the data plane, queueing included.", fn, nil),
		cold:      prometheus.NewDesc("brisk_dataplane_cold_starts_total", "Invocations served by a sandbox that became ready after they arrived.", fn, nil),
		queued:    prometheus.NewDesc("brisk_dataplane_queued", "Requests waiting for a sandbox slot.", fn, nil),
		inflight:  prometheus.NewDesc("brisk_dataplane_inflight", "Requests holding a sandbox slot (being proxied).", fn, nil),
		endpoints: prometheus.NewDesc("brisk_dataplane_endpoints", "Ready sandboxes known to the data plane.", fn, nil),
	}
}

func (c *fnCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.requests, c.duration, c.cold, c.queued, c.inflight, c.endpoints} {
		ch <- d
	}
}

func (c *fnCollector) Collect(ch chan<- prometheus.Metric) {
	for name, fn := range c.fns() {
		m := &fn.m
		if !m.used.Load() {
			continue
		}
		m.codes.each(func(code int, n uint64) {
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n), name, strconv.Itoa(code))
		})
		// A map per histogram: the const metric keeps it, and the registry
		// reads it while this loop goes on.
		buckets := make(map[float64]uint64, nBuckets)
		var cum uint64
		for i, le := range latencyBuckets {
			cum += m.duration.counts[i].Load()
			buckets[le] = cum
		}
		cum += m.duration.counts[nBuckets].Load()
		ch <- prometheus.MustNewConstHistogram(c.duration, cum, float64(m.duration.sumNs.Load())/1e9, buckets, name)
		ch <- prometheus.MustNewConstMetric(c.cold, prometheus.CounterValue, float64(m.cold.Load()), name)
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(fn.q.Len()), name)
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(m.inflight.Load()), name)
		var eps int
		if set := fn.set.Load(); set != nil {
			eps = len(set.Endpoints)
		}
		ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(eps), name)
	}
}

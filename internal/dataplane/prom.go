package dataplane

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/brisk-faas/brisk/internal/httpx"
)

// latencyBuckets span a sub-millisecond warm call to a function that runs for
// minutes.
var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

type promMetrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	queueWait prometheus.Histogram
	cold      *prometheus.CounterVec
	queued    *prometheus.GaugeVec
	inflight  *prometheus.GaugeVec
	endpoints *prometheus.GaugeVec
	handler   http.Handler // /metrics; nil when the Registerer cannot be gathered
}

func newPromMetrics(reg prometheus.Registerer) (*promMetrics, error) {
	var gatherer prometheus.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		reg, gatherer = r, r
	} else if g, ok := reg.(prometheus.Gatherer); ok {
		gatherer = g
	}
	m := &promMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brisk_dataplane_requests_total",
			Help: "Invocations by function and HTTP status code (499: the client went away).",
		}, []string{"function", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "brisk_dataplane_request_duration_seconds",
			Help:    "Invocation latency seen by the data plane, queueing included.",
			Buckets: latencyBuckets,
		}, []string{"function"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "brisk_dataplane_queue_wait_seconds",
			Help:    "Time requests that found no free sandbox slot spent queued.",
			Buckets: latencyBuckets,
		}),
		cold: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brisk_dataplane_cold_starts_total",
			Help: "Invocations served by a sandbox that became ready after they arrived.",
		}, []string{"function"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brisk_dataplane_queued",
			Help: "Requests waiting for a sandbox slot.",
		}, []string{"function"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brisk_dataplane_inflight",
			Help: "Requests holding a sandbox slot (being proxied).",
		}, []string{"function"}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "brisk_dataplane_endpoints",
			Help: "Ready sandboxes known to the data plane.",
		}, []string{"function"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.queueWait, m.cold, m.queued, m.inflight, m.endpoints} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, errors.New("dataplane: metrics already registered; give each data plane its own Registerer (prometheus.WrapRegistererWith)")
			}
			return nil, err
		}
	}
	if gatherer != nil {
		m.handler = promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{})
	}
	return m, nil
}

// fnMetrics caches one function's metric children so the hot path never
// hashes label values. They are made at the function's first call or first
// endpoint, not when it is registered: registering thousands of functions a
// second spent 7 % of its CPU making series nobody had used yet.
type fnMetrics struct {
	p         *promMetrics
	name      string
	made      atomic.Bool
	mu        sync.Mutex
	retired   bool // the function was deleted: late calls count nowhere
	duration  prometheus.Observer
	cold      prometheus.Counter
	queued    prometheus.Gauge
	inflight  prometheus.Gauge
	endpoints prometheus.Gauge

	codes httpx.CodeCounters
}

func (m *fnMetrics) init(p *promMetrics, name string) { m.p, m.name = p, name }

// ensure makes the children once; every user of them calls it first.
func (m *fnMetrics) ensure() {
	if !m.made.Load() {
		m.make()
	}
}

func (m *fnMetrics) make() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.made.Load() {
		return
	}
	p, name := m.p, m.name
	if m.retired {
		p = discardMetrics()
	}
	m.duration = p.duration.WithLabelValues(name)
	m.cold = p.cold.WithLabelValues(name)
	m.queued = p.queued.WithLabelValues(name)
	m.inflight = p.inflight.WithLabelValues(name)
	m.endpoints = p.endpoints.WithLabelValues(name)
	m.codes.Vec, m.codes.Label = p.requests, name
	m.made.Store(true)
}

func (m *fnMetrics) requests(code int) prometheus.Counter { return m.codes.Get(code) }

// retire drops the function's series; calls still in flight for it, or
// racing its deletion, count into metrics nobody exports.
func (m *fnMetrics) retire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.made.Load() && !m.retired {
		m.p.deleteFunction(m.name)
	}
	m.retired = true
}

// discardMetrics is an unexported set for retired functions.
var discardMetrics = sync.OnceValue(func() *promMetrics {
	p, err := newPromMetrics(prometheus.NewRegistry())
	if err != nil {
		panic("dataplane: discard metrics: " + err.Error()) // a fresh registry cannot clash
	}
	return p
})

func (p *promMetrics) deleteFunction(name string) {
	l := prometheus.Labels{"function": name}
	p.requests.DeletePartialMatch(l)
	p.duration.DeletePartialMatch(l)
	p.cold.DeletePartialMatch(l)
	p.queued.DeletePartialMatch(l)
	p.inflight.DeletePartialMatch(l)
	p.endpoints.DeletePartialMatch(l)
}

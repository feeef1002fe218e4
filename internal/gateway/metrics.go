package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brisk-faas/brisk/internal/telemetry"
)

// noDataPlane is the dataplane label of requests no data plane could take.
const noDataPlane = "none"

type promMetrics struct {
	reg       prometheus.Registerer
	requests  *prometheus.CounterVec
	failovers *prometheus.CounterVec
	handler   http.Handler // /metrics; nil when the Registerer cannot be gathered
}

func newPromMetrics(reg prometheus.Registerer) (*promMetrics, error) {
	reg, handler := telemetry.Metrics(reg)
	m := &promMetrics{
		reg:     reg,
		handler: handler,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brisk_gateway_requests_total",
			Help: "Requests proxied, by data plane and HTTP status code (dataplane=\"none\": 503, no data plane available; 499: the client went away).",
		}, []string{"dataplane", "code"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "brisk_gateway_connect_failures_total",
			Help: "Connections to a data plane that failed; each marks it down and moves the request to the next data plane.",
		}, []string{"dataplane"}),
	}
	if err := m.register(m.requests); err != nil {
		return nil, err
	}
	if err := m.register(m.failovers); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *promMetrics) register(c prometheus.Collector) error {
	return telemetry.Register(m.reg, "gateway", c)
}

// upGauge exports b.up as brisk_gateway_dataplane_up{dataplane}. Reading the
// flag at scrape time keeps the gauge equal to it however health checks and
// failed connections race to flip it.
func (m *promMetrics) upGauge(b *backend) error {
	return m.register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "brisk_gateway_dataplane_up",
		Help:        "1 when the data plane is healthy and receives functions, else 0.",
		ConstLabels: prometheus.Labels{"dataplane": b.addr},
	}, func() float64 {
		if b.up.Load() {
			return 1
		}
		return 0
	}))
}

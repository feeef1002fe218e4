package controlplane

import "github.com/prometheus/client_golang/prometheus"

type cpMetrics struct {
	reg               *prometheus.Registry
	functions         prometheus.Gauge
	dataPlanes        prometheus.Gauge
	creations         prometheus.Counter
	placementFailures prometheus.Counter
	sandboxFailures   *prometheus.CounterVec
	desired           *prometheus.GaugeVec
	panic             *prometheus.GaugeVec
	readyLatency      prometheus.Histogram
	handshakes        *prometheus.CounterVec
	handshakeSeconds  prometheus.Histogram
}

func newMetrics() *cpMetrics {
	m := &cpMetrics{
		reg:        prometheus.NewRegistry(),
		functions:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "brisk_controlplane_functions", Help: "Registered functions."}),
		dataPlanes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "brisk_controlplane_dataplanes_connected", Help: "Data planes watching endpoints."}),
		creations: prometheus.NewCounter(prometheus.CounterOpts{Name: "brisk_controlplane_sandbox_creations_total",
			Help: "Sandboxes placed (Creates sent to workers)."}),
		placementFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "brisk_controlplane_placement_failures_total",
			Help: "Placements that found no node with capacity."}),
		sandboxFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_controlplane_sandbox_failures_total",
			Help: "Sandboxes that failed to start or exited on their own."}, []string{"function"}),
		desired: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "brisk_function_desired_sandboxes",
			Help: "Autoscaler decision per function."}, []string{"function"}),
		panic: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "brisk_function_panic_mode",
			Help: "1 while the function's autoscaler is in panic mode."}, []string{"function"}),
		readyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "brisk_controlplane_sandbox_ready_seconds",
			Help: "Placement to Ready, per sandbox.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_controlplane_handshakes_total",
			Help: "Worker link handshakes by mode."}, []string{"mode"}),
		handshakeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "brisk_controlplane_handshake_seconds",
			Help: "Duration of worker link handshakes.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
	}
	m.reg.MustRegister(m.functions, m.dataPlanes, m.creations, m.placementFailures, m.sandboxFailures, m.desired,
		m.panic, m.readyLatency, m.handshakes, m.handshakeSeconds,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

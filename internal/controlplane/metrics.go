package controlplane

import "github.com/prometheus/client_golang/prometheus"

type cpMetrics struct {
	reg               *prometheus.Registry
	functions         prometheus.Gauge
	dataPlanes        prometheus.Gauge
	creations         prometheus.Counter
	placementFailures prometheus.Counter
	evictions         prometheus.Counter
	sandboxFailures   *prometheus.CounterVec
	readyLatency      prometheus.Histogram
	startPhases       *prometheus.HistogramVec
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
		evictions: prometheus.NewCounter(prometheus.CounterOpts{Name: "brisk_controlplane_keepalive_evictions_total",
			Help: "Idle sandboxes of keep-alive gd functions evicted to make room for new ones."}),
		sandboxFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_controlplane_sandbox_failures_total",
			Help: "Sandboxes that failed to start or exited on their own."}, []string{"function"}),
		readyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "brisk_controlplane_sandbox_ready_seconds",
			Help: "Placement to Ready, per sandbox.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		startPhases: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "brisk_controlplane_cold_start_phase_seconds",
			Help:    "Sandbox starts by phase: creation (the worker's runtime creating it), readiness (created to answering on its port), link (placement to Ready less the worker's part: dispatch, the report back, queueing on the link).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20)}, []string{"phase"}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_controlplane_handshakes_total",
			Help: "Worker link handshakes by mode."}, []string{"mode"}),
		handshakeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "brisk_controlplane_handshake_seconds",
			Help: "Duration of worker link handshakes.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
	}
	m.reg.MustRegister(m.functions, m.dataPlanes, m.creations, m.placementFailures, m.evictions, m.sandboxFailures, m.readyLatency, m.startPhases, m.handshakes, m.handshakeSeconds,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// functionCollector exports each function's autoscaler state at scrape
// time from the cluster's table: a gauge vector child per function was
// ~700 B of heap per function and a label hash per registration.
type functionCollector struct {
	c                             *Cluster
	desired, panicking, condition *prometheus.Desc
}

func newFunctionCollector(c *Cluster) *functionCollector {
	fn := []string{"function"}
	return &functionCollector{c: c,
		desired:   prometheus.NewDesc("brisk_function_desired_sandboxes", "Autoscaler decision per function.", fn, nil),
		panicking: prometheus.NewDesc("brisk_function_panic_mode", "1 while the function's autoscaler is in panic mode.", fn, nil),
		condition: prometheus.NewDesc("brisk_function_condition", "1 for each function and condition it is in: function-failing (its sandboxes fail to start), no-capacity, quota-exceeded.", []string{"function", "condition"}, nil),
	}
}

func (f *functionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.desired
	ch <- f.panicking
	ch <- f.condition
}

func (f *functionCollector) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		name      string
		desired   int
		panicking bool
	}
	f.c.mu.Lock()
	var rows []row
	f.c.r.Autoscaler(func(name string, desired int, panicking bool) {
		rows = append(rows, row{name, desired, panicking})
	})
	var conds [][2]string
	f.c.r.Conditions(func(name, reason string) { conds = append(conds, [2]string{name, reason}) })
	f.c.mu.Unlock()
	for _, c := range conds {
		ch <- prometheus.MustNewConstMetric(f.condition, prometheus.GaugeValue, 1, c[0], c[1])
	}
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(f.desired, prometheus.GaugeValue, float64(r.desired), r.name)
		ch <- prometheus.MustNewConstMetric(f.panicking, prometheus.GaugeValue, boolFloat(r.panicking), r.name)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

package trigger

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// lagHistograms: how late firings are queued, by kind.
type lagHistograms struct{ vec *prometheus.HistogramVec }

func newLagHistograms() *lagHistograms {
	return &lagHistograms{vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "brisk_trigger_lag_seconds",
		Help:    "Trigger firing lag: a cron tick's scheduled time, or a JetStream message's store time, to its call queued.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}, []string{"kind"})}
}

func (l *lagHistograms) observe(kind string, d time.Duration) {
	l.vec.WithLabelValues(kind).Observe(max(d, 0).Seconds())
}

var (
	firedDesc  = prometheus.NewDesc("brisk_trigger_fired_total", "Calls a trigger queued since this control plane runs it.", []string{"namespace", "trigger", "kind"}, nil)
	failedDesc = prometheus.NewDesc("brisk_trigger_failed_total", "Firings and subscriptions of a trigger that failed since this control plane runs it.", []string{"namespace", "trigger", "kind"}, nil)
)

// Describe and Collect export the runner's triggers' counts at scrape
// time (a deleted trigger's series go with it) and the lag histograms.
func (r *Runner) Describe(ch chan<- *prometheus.Desc) {
	ch <- firedDesc
	ch <- failedDesc
	r.lag.vec.Describe(ch)
}

func (r *Runner) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	for _, j := range r.jobs {
		t := &j.e.Trigger
		ns := spec.TriggerNamespace(t)
		ch <- prometheus.MustNewConstMetric(firedDesc, prometheus.CounterValue, float64(j.stats.fired.Load()), ns, t.Name, t.Kind())
		ch <- prometheus.MustNewConstMetric(failedDesc, prometheus.CounterValue, float64(j.stats.failed.Load()), ns, t.Name, t.Kind())
	}
	r.mu.Unlock()
	r.lag.vec.Collect(ch)
}

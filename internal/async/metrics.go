package async

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	accepted  *prometheus.CounterVec
	delivered *prometheus.CounterVec
	retried   *prometheus.CounterVec
	deferred  *prometheus.CounterVec
	dead      *prometheus.CounterVec
	callbacks *prometheus.CounterVec
	depth     *prometheus.GaugeVec
	age       *prometheus.GaugeVec
	// resultsDropped counts reads of records whose result body was gone
	// from its namespace's budget (a call read twice counts twice).
	resultsDropped *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_accepted_total",
			Help: "Asynchronous calls stored in the queue (answered 202)."}, []string{"function"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_delivered_total",
			Help: "Asynchronous calls finished by this process, by outcome (succeeded, failed)."}, []string{"function", "outcome"}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_retried_total",
			Help: "Attempts of asynchronous calls that failed and were queued again (and calls re-queued by hand)."}, []string{"function"}),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_deferred_total",
			Help: "Deliveries of asynchronous calls put back for a moment because their function was at its async.concurrency on this data plane (not attempts)."}, []string{"function"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_dead_lettered_total",
			Help: "Asynchronous calls moved to the dead-letter stream after their last attempt."}, []string{"function"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_callbacks_total",
			Help: "Callbacks of finished asynchronous calls, by result (delivered, failed)."}, []string{"result"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "brisk_async_queue_depth",
			Help: "Asynchronous calls waiting or running, per function (refreshed every 5s)."}, []string{"function"}),
		age: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "brisk_async_queue_oldest_seconds",
			Help: "Age of the oldest queued asynchronous call, per function (refreshed every 5s)."}, []string{"function"}),
		resultsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "brisk_async_result_body_misses_total",
			Help: "Reads of asynchronous calls' records whose result body their namespace's result budget had dropped (oldest first); a call read twice counts twice."}, []string{"namespace"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.accepted, m.delivered, m.retried, m.deferred, m.dead, m.callbacks, m.depth, m.age, m.resultsDropped} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}

// Collectors are the queue's metrics, for a registry Open was not given.
func (q *Queue) Collectors() []prometheus.Collector {
	m := q.m
	return []prometheus.Collector{m.accepted, m.delivered, m.retried, m.deferred, m.dead, m.callbacks, m.depth, m.age, m.resultsDropped}
}

// Depth returns the calls waiting or running per function.
func (q *Queue) Depth(ctx context.Context) (map[string]uint64, error) {
	info, err := q.calls.Info(ctx, jetstream.WithSubjectFilter(callsPrefix+">"))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for s, n := range info.State.Subjects {
		if fn, _, ok := splitSubject(s); ok {
			out[fn] += n
		}
	}
	return out, nil
}

// watchDepth refreshes the depth and age gauges every 5 s.
func (q *Queue) watchDepth(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		before := q.sharesBefore()
		depth, err := q.Depth(ctx)
		if err != nil {
			continue
		}
		q.refreshShares(depth, before)
		q.m.depth.Reset()
		q.m.age.Reset()
		now := q.now()
		for fn, n := range depth {
			q.m.depth.WithLabelValues(fn).Set(float64(n))
			if m, err := q.calls.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(callsPrefix+fnToken(fn)+".*")); err == nil {
				q.m.age.WithLabelValues(fn).Set(now.Sub(m.Time).Seconds())
			}
		}
	}
}

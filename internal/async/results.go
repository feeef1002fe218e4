package async

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Result bodies longer than inlineResult are kept apart from their status
// records, in one stream per namespace (ResultsStreamPrefix+NAMESPACE,
// subjects brisk.results.NAMESPACE.ID) holding at most
// Config.NamespaceResultBytes, the oldest dropped first: one tenant's large
// results cannot fill the disk for the result retention, nor push out
// another tenant's. Short bodies, most results, stay in the record: one
// write per call, as before.
const (
	ResultsStreamPrefix = "BRISK_RESULTS_"
	resultsPrefix       = "brisk.results."
	inlineResult        = 4 << 10
)

// resultStreams caches the per-namespace results streams a queue has
// made or found.
type resultStreams struct {
	mu sync.Mutex
	m  map[string]jetstream.Stream
}

// NamespaceOfFunction is the namespace a function's full name says, which
// the queue's per-namespace budgets go by
// (NAME.NAMESPACE, spec.Qualify; a bare name is the default namespace's,
// and so are the bare names functions made before names were per
// namespace kept, whose results share the default namespace's budget).
func NamespaceOfFunction(fn string) string {
	if base, _, ok := spec.SplitOf(fn); ok {
		fn = base
	}
	return cmp.Or(spec.NameNamespace(fn), spec.DefaultNamespace)
}

// resultsStream returns namespace ns's results stream, made on first use
// (create) or looked up (a reader).
func (q *Queue) resultsStream(ctx context.Context, ns string, create bool) (jetstream.Stream, error) {
	q.results.mu.Lock()
	defer q.results.mu.Unlock()
	if st := q.results.m[ns]; st != nil {
		return st, nil
	}
	var st jetstream.Stream
	var err error
	if create {
		st, err = q.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:              ResultsStreamPrefix + ns,
			Description:       "brisk: result bodies of namespace " + ns + "'s asynchronous calls",
			Subjects:          []string{resultsPrefix + ns + ".*"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          q.cfg.Replicas,
			MaxAge:            q.cfg.ResultTTL,
			MaxBytes:          q.cfg.NamespaceResultBytes,
			MaxMsgsPerSubject: 1, // a call's last result
			Discard:           jetstream.DiscardOld,
		})
	} else {
		st, err = q.js.Stream(ctx, ResultsStreamPrefix+ns)
	}
	if err != nil {
		return nil, err
	}
	if q.results.m == nil {
		q.results.m = map[string]jetstream.Stream{}
	}
	q.results.m[ns] = st
	return st, nil
}

// stored is rec as its status record keeps it: a result body longer than
// inlineResult is written to its namespace's results stream and left out
// (BodyBytes says it has one). Should that write fail, the body stays in
// the record (it is within the per-call MaxResultBytes).
func (q *Queue) stored(ctx context.Context, rec *Record) *Record {
	res := rec.Result
	if res == nil || len(res.Body) <= inlineResult {
		return rec
	}
	ns := NamespaceOfFunction(rec.Function)
	_, err := q.resultsStream(ctx, ns, true)
	if err == nil {
		_, err = q.js.Publish(ctx, resultsPrefix+ns+"."+rec.ID, res.Body)
	}
	if err != nil {
		q.cfg.Logger.Warn("async: result body kept in its record: the results stream refused it", "call", rec.ID, "namespace", ns, "err", err)
		return rec
	}
	cp, r := *rec, *res
	r.Body, r.BodyBytes = nil, len(res.Body)
	cp.Result = &r
	return &cp
}

// loadBody puts back the body of r's result from its namespace's results
// stream; one the namespace's budget dropped (or that expired) is marked
// BodyDropped and counted.
func (q *Queue) loadBody(ctx context.Context, r *Record) error {
	res := r.Result
	if res == nil || len(res.Body) > 0 || res.BodyBytes == 0 {
		return nil
	}
	ns := NamespaceOfFunction(r.Function)
	st, err := q.resultsStream(ctx, ns, false)
	var m *jetstream.RawStreamMsg
	if err == nil {
		m, err = st.GetLastMsgForSubject(ctx, resultsPrefix+ns+"."+r.ID)
	}
	switch {
	case err == nil:
		res.Body = m.Data
	case errors.Is(err, jetstream.ErrMsgNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		res.BodyDropped = true
		q.m.resultsDropped.WithLabelValues(ns).Inc()
	default:
		return fmt.Errorf("async: result body of %s: %w", r.ID, err)
	}
	return nil
}

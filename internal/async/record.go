package async

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/pkg/api"
)

// A call's status and result are pkg/api's types (clients read them).
type (
	Status = api.CallStatus
	Record = api.CallRecord
	Result = api.CallResult
)

// The statuses (api.CallStatus).
const (
	StatusQueued    = api.CallQueued
	StatusRunning   = api.CallRunning
	StatusSucceeded = api.CallSucceeded
	StatusFailed    = api.CallFailed
	StatusDead      = api.CallDead
)

func (q *Queue) putStatus(ctx context.Context, r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// A key-value put is a publish to the key's subject: the hand-read
	// publish (meta.go) spares the client's ack decoding.
	return q.publish(ctx, &nats.Msg{Subject: kvPrefix + r.ID, Data: b})
}

// putStatusAsync writes a transient state without waiting: losing it
// loses only a progress report.
func (q *Queue) putStatusAsync(r *Record) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	_, _ = q.js.PublishAsync(kvPrefix+r.ID, b)
}

// Get returns the status of call id.
func (q *Queue) Get(ctx context.Context, id string) (*Record, error) {
	if !ValidID(id) {
		return nil, ErrBadID
	}
	r, err := q.record(ctx, id)
	if err == nil {
		return r, q.loadBody(ctx, r)
	}
	if !errors.Is(err, ErrNotFound) {
		return r, err
	}
	// No record (a data-plane id not yet attempted, or its record lost or
	// expired): the streams say.
	if r, err := q.inStreams(ctx, id); !errors.Is(err, ErrNotFound) {
		return r, err
	}
	// The call may have ended between the two reads: its record is written
	// before it leaves the calls stream.
	if r, err = q.record(ctx, id); err != nil {
		return r, err
	}
	return r, q.loadBody(ctx, r)
}

// record reads call id's status record; ErrNotFound when it has none.
func (q *Queue) record(ctx context.Context, id string) (*Record, error) {
	e, err := q.status.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, fmt.Errorf("async: %w", err)
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, fmt.Errorf("async: record %s: %w", id, err)
	}
	return &r, nil
}

// inStreams finds call id in the calls stream (queued) or the dead-letter
// stream; ErrNotFound when in neither.
func (q *Queue) inStreams(ctx context.Context, id string) (*Record, error) {
	if m, err := q.calls.GetLastMsgForSubject(ctx, callsPrefix+"*."+id); err == nil {
		c, err := decodeCall(m.Subject, m.Header, nil)
		if err != nil {
			return nil, err
		}
		return &Record{ID: id, Function: c.Function, FunctionUID: c.FunctionUID, Status: StatusQueued, SubmittedAt: c.Submitted, CallbackURL: c.CallbackURL}, nil
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("async: %w", err)
	}
	if m, err := q.dead.GetLastMsgForSubject(ctx, deadPrefix+"*."+id); err == nil {
		c, err := decodeCall(m.Subject, m.Header, nil)
		if err != nil {
			return nil, err
		}
		return &Record{ID: id, Function: c.Function, FunctionUID: c.FunctionUID, Status: StatusDead, SubmittedAt: c.Submitted, Error: m.Header.Get(hdrDeadReason)}, nil
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("async: %w", err)
	}
	return nil, ErrNotFound
}

// Filter selects calls for List; zero fields match all.
type Filter struct {
	Function string
	Status   Status
	Limit    int // default 100, at most MaxList
}

// MaxList bounds the records one List returns.
const MaxList = 1000

// List returns the status records matching f, newest first: the status
// bucket's, and for queued calls submitted with a data-plane id (which
// have no record until their first attempt ends) the calls stream's —
// those of the queue's head, the next f.Limit to run (listWaiting).
func (q *Queue) List(ctx context.Context, f Filter) ([]Record, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	f.Limit = min(f.Limit, MaxList)
	out, err := q.listRecords(ctx, f)
	if err != nil {
		return nil, err
	}
	if f.Status == "" || f.Status == StatusQueued {
		waiting, err := q.listWaiting(ctx, f.Function, f.Limit)
		if err != nil {
			return nil, err
		}
		listed := make(map[string]bool, len(out))
		for _, r := range out {
			listed[r.ID] = true
		}
		for _, r := range waiting {
			if listed[r.ID] {
				continue
			}
			// A call with a record is the record's (listed above, or not
			// matching f): only record-less calls are added.
			if _, err := q.status.Get(ctx, r.ID); !errors.Is(err, jetstream.ErrKeyNotFound) {
				if err != nil && ctx.Err() != nil {
					return nil, ctx.Err()
				}
				continue
			}
			out = append(out, r)
		}
	}
	return newest(out, f.Limit), nil
}

// listRecords returns the status bucket's records matching f.
func (q *Queue) listRecords(ctx context.Context, f Filter) ([]Record, error) {
	w, err := q.status.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("async: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []Record
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e == nil {
			return out, nil // the initial values are all in
		}
		var r Record
		if json.Unmarshal(e.Value(), &r) != nil {
			continue
		}
		if (f.Function == "" || r.Function == f.Function) && (f.Status == "" || r.Status == f.Status) {
			out = append(out, r)
		}
		if len(out) >= 2*f.Limit {
			out = newest(out, f.Limit) // records hold results: keep only those that may be listed
		}
	}
}

// listWaiting returns, as queued records, the first limit calls of fn
// ("" = all) in the calls stream: the head of the queue, the next to run.
// Each read is the next stored call of fn at or after a sequence number
// (the server skips other functions' calls and acknowledged ones), so a
// list costs about limit reads however long the queue; a call put back
// at the queue's tail (requeue) is there twice for a moment and listed
// once.
func (q *Queue) listWaiting(ctx context.Context, fn string, limit int) ([]Record, error) {
	subj := callsPrefix + ">"
	if fn != "" {
		subj = callsPrefix + fnToken(fn) + ".*"
	}
	var out []Record
	seen := make(map[string]bool, limit)
	for seq, reads := uint64(1), 0; len(out) < limit && reads < 2*limit+16; reads++ {
		m, err := q.calls.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("async: %w", err)
		}
		seq = m.Sequence + 1
		c, err := decodeCall(m.Subject, m.Header, nil)
		if err != nil || seen[c.ID] {
			continue
		}
		seen[c.ID] = true
		out = append(out, Record{ID: c.ID, Function: c.Function, FunctionUID: c.FunctionUID, Status: StatusQueued, SubmittedAt: c.Submitted, CallbackURL: c.CallbackURL})
	}
	return out, nil
}

// newest sorts rs newest first and keeps n.
func newest(rs []Record, n int) []Record {
	slices.SortFunc(rs, func(a, b Record) int { return b.SubmittedAt.Compare(a.SubmittedAt) })
	if len(rs) > n {
		clear(rs[n:])
		rs = rs[:n]
	}
	return rs
}

// Retry queues failed or dead call id of function fn again with its
// attempts reset; it leaves the dead-letter stream. fn is the function the
// caller may retry calls of: a dead letter of another function under the
// same id (its record expired, and the id was used again) is not this call.
func (q *Queue) Retry(ctx context.Context, id, fn string) (*Record, error) {
	if !ValidID(id) || !ValidFunction(fn) {
		return nil, ErrBadID
	}
	m, err := q.dead.GetLastMsgForSubject(ctx, subject(deadPrefix, fn, id))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, fmt.Errorf("async: %w", err)
	}
	c, err := decodeCall(m.Subject, m.Header, m.Data)
	if err != nil {
		return nil, err
	}
	out := nats.NewMsg(subject(callsPrefix, c.Function, c.ID))
	out.Header.Set(hdrCall, m.Header.Get(hdrCall))
	// '.' is in no call id: a submit's message id (its call id) cannot be
	// this one and have the retry de-duplicated away.
	out.Header.Set(jetstream.MsgIDHeader, c.ID+".retry."+strconv.FormatUint(m.Sequence, 10))
	out.Data = m.Data
	r := &Record{ID: c.ID, Function: c.Function, FunctionUID: c.FunctionUID, Status: StatusQueued, SubmittedAt: c.Submitted, CallbackURL: c.CallbackURL}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	// The record says queued before the call is stored: the consumer
	// that takes it must not find it settled (and drop it). A refused
	// retry puts the record back as it was.
	var prevRec []byte
	var rev uint64
	if e, err := q.status.Get(ctx, id); err == nil {
		prevRec = e.Value()
		rev, err = q.status.Update(ctx, id, b, e.Revision())
		if err != nil {
			return nil, fmt.Errorf("async: call %s changed meanwhile; retry again: %w", id, err)
		}
	} else if rev, err = q.status.Create(ctx, id, b); err != nil {
		return nil, fmt.Errorf("async: %w", err)
	}
	if _, err := q.js.PublishMsg(ctx, out); err != nil {
		restore := context.WithoutCancel(ctx)
		if prevRec != nil {
			_, _ = q.status.Update(restore, id, prevRec, rev)
		} else {
			_ = q.status.Delete(restore, id, jetstream.LastRevision(rev))
		}
		if isLimit(err) {
			return nil, ErrQueueFull
		}
		return nil, fmt.Errorf("async: %w", err)
	}
	if err := q.dead.DeleteMsg(ctx, m.Sequence); err != nil {
		q.cfg.Logger.Warn("async: retried call stays in the dead-letter stream", "call", id, "err", err)
	}
	q.m.retried.WithLabelValues(c.Function).Inc()
	return r, nil
}

// Purge drops the queued calls (or, with dead, the dead letters) of fn
// ("" = every function) and returns how many.
func (q *Queue) Purge(ctx context.Context, fn string, dead bool) (uint64, error) {
	if fn != "" && !ValidFunction(fn) {
		return 0, ErrBadID // subject tokens: no wildcards
	}
	st, prefix := q.calls, callsPrefix
	if dead {
		st, prefix = q.dead, deadPrefix
	}
	subj := prefix + ">"
	if fn != "" {
		subj = prefix + fnToken(fn) + ".*"
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return 0, fmt.Errorf("async: %w", err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return 0, fmt.Errorf("async: %w", err)
	}
	// Their records would say queued (or dead) until they expire.
	for s := range info.State.Subjects {
		if _, id, ok := splitSubject(s); ok {
			_ = q.status.Delete(ctx, id)
		}
	}
	return n, nil
}

package async

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Namespace shares of the queue: one tenant filling the queue (its
// MaxQueued calls or MaxQueuedBytes) would refuse every tenant's submits,
// so a namespace may hold at most Config.NamespaceShare of either. The
// calls a namespace has waiting are those of the last depth reading
// (every 5 s, by watchDepth or a submit) plus the ones accepted here since; its bytes
// are that count times the mean size of its calls submitted here. Both
// are estimates, on the side of refusing early; the queue's own limits
// stay exact.

// nsShare is one namespace's standing; its fields are read and written
// without a lock on the submit path.
type nsShare struct {
	waiting atomic.Int64  // at the last depth reading
	added   atomic.Int64  // accepted here since
	mean    atomic.Uint64 // float64 bits: the moving mean of its calls' sizes
}

// shares maps namespaces to their standing: an immutable map replaced
// whole when a namespace is added, so the submit path reads it without a
// lock or an allocation.
type shares struct {
	mu sync.Mutex // writers
	m  atomic.Pointer[map[string]*nsShare]
	// at is when the last depth reading was taken (unix ns); refreshing
	// says one is under way. A queue that runs no consumer (a control
	// plane's, for triggers) has no watchDepth: its submits take readings
	// (admitShare).
	at         atomic.Int64
	refreshing atomic.Bool
}

// sharesStale is how old a depth reading may be before a submit asks for
// another.
const sharesStale = 5 * time.Second

func (s *shares) of(ns string) *nsShare {
	if m := s.m.Load(); m != nil {
		if v := (*m)[ns]; v != nil {
			return v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string]*nsShare{}
	if m := s.m.Load(); m != nil {
		if v := (*m)[ns]; v != nil {
			return v
		}
		for k, v := range *m {
			next[k] = v
		}
	}
	v := &nsShare{}
	next[ns] = v
	s.m.Store(&next)
	return v
}

// admitShare reports whether namespace ns may queue one more call of size
// bytes; the caller counts it (s.added) once it is stored, so that a depth
// reading taken meanwhile does not both hold it and have it subtracted.
func (q *Queue) admitShare(ns string, size int) (ok bool, s *nsShare) {
	share := q.cfg.NamespaceShare
	if share >= 1 {
		return true, nil
	}
	if now := q.now(); now.UnixNano()-q.shares.at.Load() > int64(sharesStale) && q.shares.refreshing.CompareAndSwap(false, true) {
		go func() {
			defer q.shares.refreshing.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), sharesStale)
			defer cancel()
			before := q.sharesBefore()
			if depth, err := q.Depth(ctx); err == nil {
				q.refreshShares(depth, before)
			}
		}()
	}
	s = q.shares.of(ns)
	mean := math.Float64frombits(s.mean.Load())
	if mean == 0 {
		mean = float64(size)
	} else {
		mean += (float64(size) - mean) / 16
	}
	s.mean.Store(math.Float64bits(mean))
	n := float64(s.waiting.Load()+s.added.Load()) + 1
	if n > share*float64(q.cfg.MaxQueued) || n*mean > share*float64(q.cfg.MaxQueuedBytes) {
		return false, nil
	}
	return true, s
}

// sharesBefore notes each namespace's calls accepted here so far, before
// a depth reading: those are in the reading, the ones accepted while it
// is taken are not (refreshShares).
func (q *Queue) sharesBefore() map[string]int64 {
	out := map[string]int64{}
	if m := q.shares.m.Load(); m != nil {
		for ns, s := range *m {
			out[ns] = s.added.Load()
		}
	}
	return out
}

// refreshShares takes a depth reading (calls waiting per function), with
// the counts sharesBefore noted just before it was read.
func (q *Queue) refreshShares(depth map[string]uint64, before map[string]int64) {
	q.shares.at.Store(q.now().UnixNano())
	per := map[string]int64{}
	for fn, n := range depth {
		per[NamespaceOfFunction(fn)] += int64(n)
	}
	if m := q.shares.m.Load(); m != nil {
		for ns, s := range *m {
			s.waiting.Store(per[ns])
			s.added.Add(-before[ns])
		}
	}
	for ns, n := range per {
		q.shares.of(ns).waiting.Store(n)
	}
}

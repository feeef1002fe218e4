package async

import (
	"math"
	"sync"
	"sync/atomic"
)

// Namespace shares of the queue: one tenant filling the queue (its
// MaxQueued calls or MaxQueuedBytes) would refuse every tenant's submits,
// so a namespace may hold at most Config.NamespaceShare of either. The
// calls a namespace has waiting are those of the last depth reading
// (every 5 s, watchDepth) plus the ones accepted here since; its bytes
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
}

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
// bytes, and counts it if so.
func (q *Queue) admitShare(ns string, size int) bool {
	share := q.cfg.NamespaceShare
	if share >= 1 {
		return true
	}
	s := q.shares.of(ns)
	mean := math.Float64frombits(s.mean.Load())
	if mean == 0 {
		mean = float64(size)
	} else {
		mean += (float64(size) - mean) / 16
	}
	s.mean.Store(math.Float64bits(mean))
	n := float64(s.waiting.Load()+s.added.Load()) + 1
	if n > share*float64(q.cfg.MaxQueued) || n*mean > share*float64(q.cfg.MaxQueuedBytes) {
		return false
	}
	s.added.Add(1)
	return true
}

// refreshShares takes a depth reading (calls waiting per function).
func (q *Queue) refreshShares(depth map[string]uint64) {
	per := map[string]int64{}
	for fn, n := range depth {
		per[NamespaceOfFunction(fn)] += int64(n)
	}
	if m := q.shares.m.Load(); m != nil {
		for ns, s := range *m {
			s.waiting.Store(per[ns])
			s.added.Store(0)
		}
	}
	for ns, n := range per {
		q.shares.of(ns).waiting.Store(n)
	}
}

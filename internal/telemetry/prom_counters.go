package telemetry

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// CodeCounters caches the request counters of one label value (a function,
// a data plane) by status code, so the hot path never hashes label values.
// Vec's labels are (Label, code). Copy-on-write: one label value sees a
// handful of codes. Set Vec and Label before the first Get; do not copy.
type CodeCounters struct {
	Vec   *prometheus.CounterVec
	Label string
	mu    sync.Mutex
	cs    atomic.Pointer[[]codeCounter]
}

type codeCounter struct {
	code int
	c    prometheus.Counter
}

// Get returns the counter for code, creating it on first use.
func (m *CodeCounters) Get(code int) prometheus.Counter {
	if c := m.find(m.cs.Load(), code); c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.cs.Load()
	if c := m.find(old, code); c != nil {
		return c
	}
	var cs []codeCounter
	if old != nil {
		cs = append(cs, *old...)
	}
	c := m.Vec.WithLabelValues(m.Label, strconv.Itoa(code))
	cs = append(cs, codeCounter{code, c})
	m.cs.Store(&cs)
	return c
}

func (m *CodeCounters) find(cs *[]codeCounter, code int) prometheus.Counter {
	if cs == nil {
		return nil
	}
	for _, cc := range *cs {
		if cc.code == code {
			return cc.c
		}
	}
	return nil
}

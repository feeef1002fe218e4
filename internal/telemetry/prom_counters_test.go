package telemetry

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCodeCountersCacheOneCounterPerCode(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_requests_total"}, []string{"fn", "code"})
	m := &CodeCounters{Vec: vec, Label: "f"}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, code := range []int{200, 404, 200, 503} {
				m.Get(code).Inc()
			}
		}()
	}
	wg.Wait()
	if a, b := m.Get(200), m.Get(200); a != b {
		t.Fatal("two counters for one code")
	}
	for code, want := range map[string]float64{"200": 16, "404": 8, "503": 8} {
		if got := testutil.ToFloat64(vec.WithLabelValues("f", code)); got != want {
			t.Errorf("code %s: %v, want %v", code, got, want)
		}
	}
	if n := testutil.CollectAndCount(vec); n != 3 {
		t.Errorf("%d series, want 3", n)
	}
}

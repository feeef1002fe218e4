package telemetry

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A nil registerer gets a registry of its own, served with the Go
// collectors; a second registration of the same metric names the fix.
func TestMetricsRegistry(t *testing.T) {
	reg, h := Metrics(nil)
	if h == nil {
		t.Fatal("no /metrics handler for an own registry")
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "brisk_test_total", Help: "test"})
	if err := Register(reg, "widget", c); err != nil {
		t.Fatal(err)
	}
	c.Inc()
	err := Register(reg, "widget", prometheus.NewCounter(prometheus.CounterOpts{Name: "brisk_test_total", Help: "test"}))
	if err == nil || !strings.Contains(err.Error(), "give each widget its own Registerer") {
		t.Fatalf("second registration: %v", err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); !strings.Contains(body, "brisk_test_total 1") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics:\n%s", body)
	}
	if _, h := Metrics(prometheus.WrapRegistererWith(nil, prometheus.NewRegistry())); h != nil {
		t.Fatal("a handler for a registerer that cannot be gathered")
	}
}

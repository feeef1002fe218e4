package telemetry

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics resolves a proxy's Prometheus registerer: nil means a registry of
// its own with the Go and process collectors. handler serves /metrics; it
// is nil when reg cannot be gathered (the embedder serves it).
func Metrics(reg prometheus.Registerer) (_ prometheus.Registerer, handler http.Handler) {
	if reg == nil {
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		reg = r
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		handler = promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	}
	return reg, handler
}

// Register registers c, turning a name clash into advice for the embedder
// of component (two instances sharing one registerer).
func Register(reg prometheus.Registerer, component string, c prometheus.Collector) error {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			return errors.New(component + ": metrics already registered; give each " + component + " its own Registerer (prometheus.WrapRegistererWith)")
		}
		return err
	}
	return nil
}

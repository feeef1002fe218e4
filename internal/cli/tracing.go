package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"

	"github.com/brisk-faas/brisk/internal/telemetry"
)

// traceFlags configure OpenTelemetry tracing of calls (internal/telemetry).
type traceFlags struct {
	endpoint string
	ratio    float64
}

func (f *traceFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.endpoint, "otlp-endpoint", "", "export each call's spans (queueing, cold start: placement, creation, readiness; first byte) over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing). Traced calls skip the data plane's fast path")
	c.Flags().Float64Var(&f.ratio, "trace-sample-ratio", 1, "fraction of traces recorded, (0, 1], decided by trace id (a caller's traceparent joins its trace but does not decide)")
}

// tracer returns the data plane's tracer (nil: tracing off) and a shutdown
// that flushes buffered spans.
func (f *traceFlags) tracer(ctx context.Context, service string) (trace.Tracer, func(), error) {
	if f.ratio <= 0 || f.ratio > 1 {
		return nil, nil, usageError{fmt.Errorf("--trace-sample-ratio %g: want (0, 1]", f.ratio)}
	}
	tp, shutdown, err := telemetry.Setup(ctx, telemetry.Config{Endpoint: f.endpoint, SampleRatio: f.ratio, Service: service})
	if err != nil {
		return nil, nil, usageError{err}
	}
	return telemetry.Tracer(tp, "dataplane"), func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}, nil
}

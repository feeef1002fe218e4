// Package telemetry is what brisk's components report with: the
// Prometheus registry a proxy serves and per-code request counters for its
// hot path (prom_*.go), and OpenTelemetry tracing: the data plane's
// invocation spans (queueing, the cold start a call waited for, the
// sandbox's first byte), exported over OTLP/HTTP when an endpoint is
// configured. Without one, tracing is off and costs nothing.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says where spans go.
type Config struct {
	// Endpoint is the OTLP/HTTP collector's base URL, e.g.
	// http://127.0.0.1:4318 (spans go to /v1/traces). Empty: the standard
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
	// variables; none of them: tracing off.
	Endpoint string
	// SampleRatio is the fraction of traces recorded, (0, 1], decided by
	// trace id, whatever a caller's traceparent says. 0 means 1.
	SampleRatio float64
	// Service names the process in its spans (service.name).
	Service string
}

// Enabled reports whether cfg (or the environment) names a collector.
func (cfg Config) Enabled() bool {
	return cfg.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Setup returns a tracer provider exporting to the configured collector and
// its shutdown (which flushes what is buffered), or nil and a no-op when
// tracing is off.
func Setup(ctx context.Context, cfg Config) (*sdktrace.TracerProvider, func(context.Context) error, error) {
	if !cfg.Enabled() {
		return nil, func(context.Context) error { return nil }, nil
	}
	if cfg.SampleRatio < 0 || cfg.SampleRatio > 1 {
		return nil, nil, fmt.Errorf("trace sample ratio %v: want (0, 1]", cfg.SampleRatio)
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("OTLP endpoint %q: want http(s)://host:port", cfg.Endpoint)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	}
	opts = append(opts, otlptracehttp.WithTimeout(5*time.Second))
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP exporter: %w", err)
	}
	ratio := cfg.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	svc := cfg.Service
	if svc == "" {
		svc = "brisk"
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)),
		// A caller's traceparent joins its trace, but its sampled flag
		// does not decide: callers could otherwise have every call
		// recorded (or hide theirs). Local parents are followed.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio),
			sdktrace.WithRemoteParentSampled(sdktrace.TraceIDRatioBased(ratio)),
			sdktrace.WithRemoteParentNotSampled(sdktrace.TraceIDRatioBased(ratio)))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", svc))),
	)
	return tp, tp.Shutdown, nil
}

// Tracer returns tp's tracer for a component, nil when tp is nil (off).
func Tracer(tp *sdktrace.TracerProvider, component string) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer("github.com/brisk-faas/brisk/" + component)
}

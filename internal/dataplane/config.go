package dataplane

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/pki"
)

// Config configures one data plane. The zero value plus a ControlPlane address
// is a working configuration; Default fills the rest.
type Config struct {
	// ID names this data plane to the control plane. Default: "dp-<hostname>-<port>".
	ID string
	// Listen is the invocation address. Default 127.0.0.1:8080.
	Listen string
	// TLS, when set, serves the invocation listener over HTTPS (its
	// Certificates; Run forces TLS 1.2 or later and ALPN http/1.1 only: the
	// front end speaks HTTP/1.1, and neither h2 nor h2c is offered over
	// TLS). The handshake counts against ReadHeaderTimeout. Nil: plain
	// HTTP/1.1 and h2c.
	TLS *tls.Config
	// ControlPlane is the gRPC target of the ControlPlane service. Empty runs
	// the data plane without a control plane: state comes only from Apply.
	ControlPlane string
	// Identity is the data plane's certificate (brisk://dataplane/ID) and
	// the cluster CA, for mutual TLS with the control plane. Join, when
	// Identity is nil, gets it when Run starts (join token or stored
	// certificate). Neither: plaintext gRPC (--insecure-no-tls, tests).
	Identity *pki.Identity
	Join     *pki.Joiner
	// MetricsInterval is the period of ReportMetrics. Default 1s.
	MetricsInterval time.Duration
	// MaxBodyBytes limits request bodies. Default 6 MiB, Lambda's synchronous
	// payload limit.
	MaxBodyBytes int64
	// BodyBufferBytes is how much of a request body is read before the call
	// takes a sandbox slot, so a slow client holds a connection, not a
	// sandbox. Default: MaxBodyBytes (every body is read first).
	BodyBufferBytes int64
	// BodyBufferTotal bounds the memory all buffered bodies hold at once;
	// past it, bodies stream. Default 512 MiB.
	BodyBufferTotal int64
	// MinBodyRate is the rate (bytes/s) a body streamed past the buffer
	// must keep up, after 2 s of grace; slower clients get 408. Default 64 KiB/s.
	MinBodyRate int64
	// EmergencyPercentile is the dual track's metric filter: an emergency
	// call counts toward regular scaling when the function's keep-alive
	// exceeds this percentile of its inter-arrival times over the last
	// hour. Default 50 (PulseNet's choice).
	EmergencyPercentile float64
	// Async is the queue of asynchronous calls (internal/async): with it
	// the data plane accepts them (/async-function/NAME, Prefer:
	// respond-async), serves /v1/calls and runs a consumer. Nil: those
	// answer 501.
	Async *async.Queue
	// System serves the OpenFaaS gateway's management API (/system/...,
	// internal/compat/openfaas) on the invocation listener, for requests
	// whose Host names no function; nil answers those 501.
	System http.Handler
	// Tracer records each call as OpenTelemetry spans (tracing.go;
	// internal/telemetry builds it). Nil: no spans, no cost. Calls of a
	// traced data plane take the net/http path, not the fast path.
	Tracer trace.Tracer

	// HTTP server limits. WriteTimeout bounds a whole response, so by default
	// it is above the default function timeout plus queue timeout; requests of
	// functions with longer limits get their write deadline extended.
	ReadHeaderTimeout time.Duration // default 10s
	ReadTimeout       time.Duration // default 2m (a 6 MiB body over a slow link)
	WriteTimeout      time.Duration // default 6m
	IdleTimeout       time.Duration // default 2m
	MaxHeaderBytes    int           // default 64 KiB
	// MaxConnections bounds the client connections open at once; more are
	// closed as they are accepted. Default 50,000.
	MaxConnections int
	// ShutdownTimeout bounds the graceful drain when Run's ctx ends. Default 30s.
	ShutdownTimeout time.Duration

	// Logger receives operational logs. Default: discard.
	Logger *slog.Logger
	// Registerer receives the data plane's Prometheus metrics. Nil uses a
	// private registry served at /metrics; a Registerer that is also a
	// Gatherer (a *prometheus.Registry) is served at /metrics too.
	Registerer prometheus.Registerer
}

// Defaults.
const (
	DefaultListen            = "127.0.0.1:8080"
	DefaultMetricsInterval   = time.Second
	DefaultMaxBodyBytes      = 6 << 20
	DefaultBodyBufferTotal   = 512 << 20
	DefaultMinBodyRate       = 64 << 10
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 2 * time.Minute
	DefaultWriteTimeout      = 6 * time.Minute
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxConnections    = 50_000
	DefaultShutdownTimeout   = 30 * time.Second
)

// Default returns c with zero fields set to their defaults.
func (c Config) Default() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MetricsInterval == 0 {
		c.MetricsInterval = DefaultMetricsInterval
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.BodyBufferBytes == 0 {
		c.BodyBufferBytes = c.MaxBodyBytes
	}
	if c.BodyBufferTotal == 0 {
		c.BodyBufferTotal = DefaultBodyBufferTotal
	}
	if c.EmergencyPercentile == 0 {
		c.EmergencyPercentile = 50
	}
	if c.MinBodyRate == 0 {
		c.MinBodyRate = DefaultMinBodyRate
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks a defaulted config; errors name the field and the value.
func (c Config) Validate() error {
	positive := []struct {
		name string
		v    time.Duration
	}{
		{"metrics_interval", c.MetricsInterval},
		{"read_header_timeout", c.ReadHeaderTimeout},
		{"read_timeout", c.ReadTimeout},
		{"write_timeout", c.WriteTimeout},
		{"idle_timeout", c.IdleTimeout},
		{"shutdown_timeout", c.ShutdownTimeout},
	}
	for _, p := range positive {
		if p.v < 0 {
			return fmt.Errorf("dataplane config: %s %s must not be negative", p.name, p.v)
		}
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("dataplane config: max_body_bytes %d must not be negative", c.MaxBodyBytes)
	}
	if c.BodyBufferBytes < 0 || c.BodyBufferTotal < 0 || c.MinBodyRate < 0 {
		return fmt.Errorf("dataplane config: body_buffer_bytes %d, body_buffer_total %d and min_body_rate %d must not be negative",
			c.BodyBufferBytes, c.BodyBufferTotal, c.MinBodyRate)
	}
	if c.MaxHeaderBytes < 0 {
		return fmt.Errorf("dataplane config: max_header_bytes %d must not be negative", c.MaxHeaderBytes)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("dataplane config: max_connections %d must not be negative", c.MaxConnections)
	}
	return nil
}

package gateway

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a gateway. DataPlanes is required; Default fills the rest.
type Config struct {
	// Listen is the address clients call. Default 127.0.0.1:8088.
	Listen string
	// TLS, when set, serves Listen over HTTPS (its Certificates; Run forces
	// TLS 1.2 or later and ALPN http/1.1 only, as the data plane does: h2
	// and h2c are not offered over TLS). The gateway still calls the data
	// planes over plain HTTP. Nil: plain HTTP/1.1 and h2c.
	TLS *tls.Config
	// DataPlanes are the host:port invocation addresses of the data planes
	// (`brisk dataplane --invoke`). At least one, no duplicates. A data
	// plane's address is its identity in the hash, so every gateway of a
	// cluster must spell the addresses the same way; their order is free.
	DataPlanes []string
	// HealthInterval is the period of the GET /healthz probe of each data
	// plane. Default 200ms.
	HealthInterval time.Duration
	// MetricsToken, when set, is the bearer token /metrics asks for; unset,
	// /metrics answers loopback clients only (the gateway knows none of
	// the cluster's tokens).
	MetricsToken string
	// Logger receives operational logs. Default: discard.
	Logger *slog.Logger
	// Registerer receives the gateway's Prometheus metrics. Nil uses a
	// private registry served at /metrics; a Registerer that is also a
	// Gatherer is served at /metrics too.
	Registerer prometheus.Registerer
}

// Defaults, and the HTTP server limits, which are the data plane's: the
// gateway sees the same requests first.
const (
	DefaultListen         = "127.0.0.1:8088"
	DefaultHealthInterval = 200 * time.Millisecond

	readHeaderTimeout = 10 * time.Second
	readTimeout       = 2 * time.Minute // a 6 MiB body over a slow link
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	shutdownTimeout   = 30 * time.Second
	dialTimeout       = time.Second
	maxHealthTimeout  = time.Second
)

// Default returns c with zero fields set to their defaults.
func (c Config) Default() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks a defaulted config; errors name the field and the value.
func (c Config) Validate() error {
	if len(c.DataPlanes) == 0 {
		return fmt.Errorf("gateway config: data_planes: at least one data plane address (host:port) is required")
	}
	seen := make(map[string]bool, len(c.DataPlanes))
	for _, a := range c.DataPlanes {
		if err := checkHostPort(a); err != nil {
			return fmt.Errorf("gateway config: data_planes: %q: %v", a, err)
		}
		if seen[a] {
			return fmt.Errorf("gateway config: data_planes: %q listed twice", a)
		}
		seen[a] = true
	}
	if c.HealthInterval < 0 {
		return fmt.Errorf("gateway config: health_interval %s must be positive", c.HealthInterval)
	}
	return nil
}

func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("want host:port")
	}
	if host == "" {
		return fmt.Errorf("want host:port, the host is empty")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q: want 1-65535", port)
	}
	return nil
}

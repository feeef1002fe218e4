package tracefn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Server timeouts for Serve. The write timeout must outlast the longest
// request the function accepts.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = time.Minute
	writeTimeout      = MaxMillis*time.Millisecond + time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	// shutdownGrace is how long Serve lets in-flight requests finish once
	// ctx ends. The process runtime's kill grace (1 s by default) usually
	// cuts it short anyway.
	shutdownGrace = 2 * time.Second
)

// Serve runs the trace function's HTTP server on addr until ctx ends, then
// shuts it down gracefully. It returns nil after a clean shutdown and an error
// if addr cannot be bound or the server fails.
func Serve(ctx context.Context, addr string, cfg Config) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("tracefn: %w", err)
	}
	return serve(ctx, l, cfg)
}

func serve(ctx context.Context, l net.Listener, cfg Config) error {
	var h http.Handler = New(cfg)
	if cfg.FProcess != "" {
		var err error
		if h, err = NewWatchdog(cfg.FProcess, cfg.getenv, os.Stderr); err != nil {
			return err
		}
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("tracefn: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close() // in-flight requests outlived the grace; cut them
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("tracefn: serve: %w", err)
	}
	return nil
}

// Environment variables a runtime sets for every sandbox.
const (
	EnvPort      = "PORT"
	EnvSandboxID = "BRISK_SANDBOX_ID"
	EnvFunction  = "BRISK_FUNCTION"
	// EnvListenHost overrides the listen host, 127.0.0.1 by default.
	EnvListenHost = "BRISK_LISTEN_HOST"
)

// FromEnv builds Serve's arguments from the environment a runtime gives a
// sandbox: it listens on $BRISK_LISTEN_HOST:$PORT, the host defaulting to
// 127.0.0.1 because the process runtime's sandboxes share the host network
// and must stay off external interfaces, and reports $BRISK_SANDBOX_ID and
// $BRISK_FUNCTION. getenv is usually os.Getenv.
func FromEnv(getenv func(string) string) (addr string, cfg Config, err error) {
	p := getenv(EnvPort)
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", Config{}, fmt.Errorf("tracefn: %s=%q is not a port in [1, 65535]", EnvPort, p)
	}
	host := getenv(EnvListenHost)
	if host == "" {
		host = "127.0.0.1"
	}
	cfg = Config{SandboxID: getenv(EnvSandboxID), Function: getenv(EnvFunction)}
	if getenv(EnvBuiltin) == Watchdog {
		if cfg.FProcess = getenv("fprocess"); cfg.FProcess == "" {
			return "", Config{}, fmt.Errorf("tracefn: the watchdog needs fprocess in its environment")
		}
		cfg.getenv = getenv
	}
	return net.JoinHostPort(host, p), cfg, nil
}

// BinaryName is the lean binary serving the trace function (cmd/brisk-trace),
// which `make build` puts next to brisk.
const BinaryName = "brisk-trace"

// Subcommand is the hidden brisk subcommand serving the trace function.
const Subcommand = "__trace"

// Command returns the argv that serves the trace function for the brisk
// executable exe: BinaryName beside exe when it is there, because it starts
// several times faster, otherwise exe's hidden subcommand.
func Command(exe string) []string {
	lean := filepath.Join(filepath.Dir(exe), BinaryName)
	if st, err := os.Stat(lean); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return []string{lean}
	}
	return []string{exe, Subcommand}
}

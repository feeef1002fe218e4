package async

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ServerConfig configures an embedded NATS server with JetStream.
type ServerConfig struct {
	// Dir holds JetStream's files (Dir/jetstream). Required.
	Dir string
	// Listen is a host:port for clients in other processes; empty serves
	// only in-process connections (brisk up), so there is no listener at all.
	Listen string
	// Token, required with Listen, is what clients must present
	// (nats://TOKEN@host:port).
	Token string
	// SyncAlways makes JetStream fsync every write before acknowledging
	// it: accepted calls then survive a power loss, at the cost of accept
	// throughput. By default writes are flushed to the OS at once (they
	// survive kill -9 of every process) and synced every SyncInterval.
	SyncAlways bool
	// MaxPayload bounds one message; default 8 MiB (a 6 MiB body plus its
	// request head).
	MaxPayload int32
}

// DefaultMaxPayload leaves room for a 6 MiB body and its head.
const DefaultMaxPayload = 8 << 20

// Server is an embedded NATS server.
type Server struct {
	ns    *server.Server
	token string
}

// StartServer starts a NATS server with JetStream storing under cfg.Dir and
// waits until it accepts connections.
func StartServer(cfg ServerConfig) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("async: embedded NATS needs a data directory")
	}
	if cfg.Listen != "" && cfg.Token == "" {
		return nil, errors.New("async: an embedded NATS server that listens needs a token (--nats-token-file)")
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = DefaultMaxPayload
	}
	dir := filepath.Join(cfg.Dir, "jetstream")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("async: %w", err)
	}
	opts := &server.Options{
		ServerName:    "brisk",
		JetStream:     true,
		StoreDir:      dir,
		SyncAlways:    cfg.SyncAlways,
		MaxPayload:    cfg.MaxPayload,
		NoSigs:        true,
		NoLog:         true,
		DontListen:    cfg.Listen == "",
		Host:          "127.0.0.1",
		Port:          -1,
		HTTPPort:      0,
		WriteDeadline: 10 * time.Second,
	}
	if cfg.Listen != "" {
		host, port, err := splitHostPort(cfg.Listen)
		if err != nil {
			return nil, err
		}
		if port == 0 {
			port = -1 // any free port (NATS reads 0 as its default, 4222)
		}
		opts.Host, opts.Port = host, port
		opts.Authorization = cfg.Token
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("async: nats server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("async: embedded nats server did not start within 30s")
	}
	return &Server{ns: ns, token: cfg.Token}, nil
}

// Connect opens a client connection to the server: in-process when it has
// no listener.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{nats.InProcessServer(s.ns), nats.Name(name), nats.MaxReconnects(-1)}
	if s.token != "" { // in-process clients authenticate too
		opts = append(opts, nats.Token(s.token))
	}
	return nats.Connect("", opts...)
}

// ClientURL is the address clients in other processes dial ("" without a
// listener).
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Shutdown stops the server; JetStream flushes its files.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

func splitHostPort(addr string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err == nil {
		var p int
		if p, err = strconv.Atoi(ps); err == nil && p >= 0 && p <= 65535 {
			return host, p, nil
		}
	}
	return "", 0, fmt.Errorf("async: nats listen address %q: want host:port", addr)
}

package replica

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// streamLayer is raft's TCP stream layer over a listener we bind ourselves
// (raft.NewTCPTransport binds inside and cannot take a pre-bound socket,
// which tests need to avoid racing for free ports). It advertises the raft
// address exactly as the peer list spells it, so the address raft reports
// for the leader matches the configuration.
// With TLS set, the stream is mutual TLS: a replica accepts and dials only
// peers holding a control-plane certificate of the cluster CA, so nothing
// else that reaches the raft port can append to the log.
type streamLayer struct {
	net.Listener
	advertise string
	tls       *Identity
}

// Identity is a replica's TLS for the raft stream: the server side (peer
// certificates required) and the dialling side.
type Identity struct {
	Server, Client *tls.Config
}

func (s *streamLayer) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil || s.tls == nil {
		return c, err
	}
	return tls.Server(c, s.tls.Server), nil
}

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(addr))
	}
	return tls.DialWithDialer(&d, "tcp", string(addr), s.tls.Client)
}

func (s *streamLayer) Addr() net.Addr { return textAddr(s.advertise) }

type textAddr string

func (a textAddr) Network() string { return "tcp" }
func (a textAddr) String() string  { return string(a) }

// newRaftLogger routes raft's hclog output to slog at Warn and above: raft
// is chatty at Info (every election step), and leader changes are logged
// by the Registry itself.
func newRaftLogger(l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Warn,
		Output:      &slogWriter{l: l},
		DisableTime: true,
	})
}

// slogWriter receives one formatted hclog line per LevelWrite.
type slogWriter struct{ l *slog.Logger }

var _ hclog.LevelWriter = (*slogWriter)(nil)

func (w *slogWriter) Write(p []byte) (int, error) { return w.LevelWrite(hclog.Info, p) }

func (w *slogWriter) LevelWrite(level hclog.Level, p []byte) (int, error) {
	n := len(p)
	// Drop hclog's "[WARN]  " header: slog has its own level.
	line := bytes.TrimSpace(p)
	if len(line) > 0 && line[0] == '[' {
		if i := bytes.IndexByte(line, ']'); i > 0 {
			line = bytes.TrimSpace(line[i+1:])
		}
	}
	lvl := slog.LevelInfo
	switch {
	case level >= hclog.Error:
		lvl = slog.LevelError
	case level == hclog.Warn:
		lvl = slog.LevelWarn
	case level <= hclog.Debug:
		lvl = slog.LevelDebug
	}
	w.l.Log(context.Background(), lvl, string(line), "component", "raft")
	return n, nil
}

// ownNameWait bounds how long Open waits for the name of its own raft
// address to resolve. On Kubernetes that name is a StatefulSet Pod's DNS
// record, which appears only once the Pod's address is published: after
// its container may have started.
const ownNameWait = 30 * time.Second

// listenOwn binds addr with listen, retrying while its host does not
// resolve (a DNS error) for up to wait; any other error is returned at
// once.
func listenOwn(listen func(network, addr string) (net.Listener, error), addr string, wait time.Duration, log *slog.Logger) (net.Listener, error) {
	deadline := time.Now().Add(wait)
	for logged := false; ; logged = true {
		ln, err := listen("tcp", addr)
		var dnsErr *net.DNSError
		if err == nil || !errors.As(err, &dnsErr) || !time.Now().Before(deadline) {
			return ln, err
		}
		if !logged {
			log.Info("replica: own raft address does not resolve yet; waiting", "addr", addr, "err", err, "for", wait)
		}
		time.Sleep(200 * time.Millisecond) // no event to wait on: DNS is asked again
	}
}

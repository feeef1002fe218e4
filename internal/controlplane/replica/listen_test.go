package replica

import (
	"errors"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestListenOwnWaitsForName: the replica's own name not resolving yet (a
// StatefulSet Pod whose DNS record is not published) is waited for; other
// errors, and a name that never resolves within the wait, are returned.
func TestListenOwnWaitsForName(t *testing.T) {
	notFound := &net.DNSError{Err: "no such host", Name: "cp-0.cp.ns.svc", IsNotFound: true}
	real, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	calls := 0
	ln, err := listenOwn(func(_, _ string) (net.Listener, error) {
		if calls++; calls < 3 {
			return nil, &net.OpError{Op: "listen", Net: "tcp", Err: notFound}
		}
		return real, nil
	}, "cp-0.cp.ns.svc:7100", time.Minute, slog.Default())
	if err != nil || ln != real || calls != 3 {
		t.Fatalf("listenOwn: %v, %v after %d calls; want the listener on the third", ln, err, calls)
	}

	calls = 0
	inUse := &net.OpError{Op: "listen", Net: "tcp", Err: syscall.EADDRINUSE}
	if _, err := listenOwn(func(_, _ string) (net.Listener, error) { calls++; return nil, inUse }, "cp-0:7100", time.Minute, slog.Default()); !errors.Is(err, syscall.EADDRINUSE) || calls != 1 {
		t.Errorf("address in use: %v after %d calls; want the error at once", err, calls)
	}

	calls = 0
	_, err = listenOwn(func(_, _ string) (net.Listener, error) {
		calls++
		return nil, &net.OpError{Op: "listen", Net: "tcp", Err: notFound}
	}, "cp-0.cp.ns.svc:7100", 0, slog.Default())
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || calls != 1 {
		t.Errorf("no wait left: %v after %d calls; want the DNS error", err, calls)
	}
}

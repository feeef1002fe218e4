package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// firstDial wraps the real connect and closes probing once the probe has made
// its first attempt, so a test can act "after the probe has begun" without
// sleeping.
func firstDial() (dial func(context.Context, string) error, probing <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return func(ctx context.Context, addr string) error {
		once.Do(func() { close(ch) })
		return DialTCP(ctx, addr)
	}, ch
}

func TestWaitReadyWhenListenerAppearsLater(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	dial, probing := firstDial()
	errc := make(chan error, 1)
	go func() { errc <- waitReady(context.Background(), addr, nil, dial) }()

	<-probing
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	defer l.Close()
	if err := <-errc; err != nil {
		t.Fatalf("WaitReady = %v, want nil once %s listens", err, addr)
	}
}

func TestWaitReadyImmediately(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := WaitReady(context.Background(), l.Addr().String(), make(chan struct{})); err != nil {
		t.Fatalf("WaitReady on a listening address = %v", err)
	}
}

func TestWaitReadyErrorsWhenSandboxExits(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	dial, probing := firstDial()
	exited := make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- waitReady(context.Background(), addr, exited, dial) }()

	<-probing
	close(exited)
	if err := <-errc; !errors.Is(err, ErrExited) {
		t.Fatalf("WaitReady after exit = %v, want ErrExited", err)
	}
}

func TestWaitReadyErrorsWhenAlreadyExited(t *testing.T) {
	// Even a listening address is not "ready" once the sandbox is known dead:
	// the port may belong to someone else by now.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	exited := make(chan struct{})
	close(exited)
	if err := WaitReady(context.Background(), l.Addr().String(), exited); !errors.Is(err, ErrExited) {
		t.Fatalf("WaitReady = %v, want ErrExited", err)
	}
}

func TestWaitReadyErrorsWhenContextEnds(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	dial, probing := firstDial()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- waitReady(ctx, addr, nil, dial) }()

	<-probing
	cancel()
	err := <-errc
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady after cancel = %v, want context.Canceled", err)
	}
	if errors.Is(err, ErrExited) {
		t.Fatalf("WaitReady after cancel = %v, must not claim the sandbox exited", err)
	}
}

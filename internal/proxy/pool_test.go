package proxy

import (
	"context"
	"errors"
	"math"
	"net"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// listen accepts connections on loopback until the test ends and counts them.
func listen(t *testing.T) (addr string, accepted chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			accepted <- c
		}
	}()
	return ln.Addr().String(), accepted
}

func TestPoolReusesPrunesAndCloses(t *testing.T) {
	addr, accepted := listen(t)
	p := NewPool(addr, 1, 4096)
	ctx := context.Background()
	c, reused, err := p.Take(ctx, 0, false)
	if err != nil || reused {
		t.Fatalf("first take: reused %v, %v", reused, err)
	}
	<-accepted
	c.Put(false)
	c2, reused, err := p.Take(ctx, 0, false)
	if err != nil || !reused || c2 != c {
		t.Fatalf("second take: reused %v (same %v), %v", reused, c2 == c, err)
	}
	// A replay never takes a pooled connection.
	c.Put(false)
	c3, reused, err := p.Take(ctx, 1, false)
	if err != nil || reused || c3 == c {
		t.Fatalf("replay: reused %v, %v", reused, err)
	}
	<-accepted
	// Past maxIdle a returned connection is closed.
	c3.Put(false)
	if n := len(p.idle); n != 1 {
		t.Fatalf("%d idle, want 1 (maxIdle)", n)
	}
	p.Prune(math.MaxInt64)
	if n := len(p.idle); n != 0 {
		t.Fatalf("%d idle after pruning all", n)
	}
	p.Close()
	if _, _, err := p.Take(ctx, 0, false); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("take after close: %v", err)
	}
}

// A connection the upstream closed while it idled is probed, dropped, and
// a new one dialled.
func TestPoolProbesStaleConnections(t *testing.T) {
	addr, accepted := listen(t)
	old := CheckIdleAfter
	CheckIdleAfter = 0
	defer func() { CheckIdleAfter = old }()
	p := NewPool(addr, 4, 4096)
	c, _, err := p.Take(context.Background(), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	(<-accepted).Close() // the upstream closes it
	c.Put(false)
	testutil.Eventually(t, 5*time.Second, func() bool { return !c.alive() }) // the FIN has arrived
	c2, reused, err := p.Take(context.Background(), 0, false)
	if err != nil || reused || c2 == c {
		t.Fatalf("take after the upstream's close: reused %v, %v", reused, err)
	}
}

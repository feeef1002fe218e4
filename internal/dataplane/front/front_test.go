package front

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// idleSession serves nothing: the tests drive the connection's states.
type idleSession struct{}

func (idleSession) Serve()      {}
func (idleSession) ClientGone() {}
func (idleSession) Release()    {}

var start = time.Now()

func monotonic() int64 { return int64(time.Since(start)) }

func newServer() *Server {
	return New(Config{MaxConnections: 10, ReadHeaderTimeout: time.Second, ReadTimeout: time.Second, IdleTimeout: time.Second,
		Now: monotonic, NewSession: func(*Conn) Session { return idleSession{} }}, &http.Server{})
}

// newServerWithConn is newServer with one idle connection it watches.
func newServerWithConn(t *testing.T) (*Server, *Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { b.Close() })
	f := newServer()
	c := f.newConn(a)
	f.conns[c] = struct{}{}
	return f, c
}

// The reaper judges a state by its own clock only: a connection that
// moves between states whose clocks would condemn each other is never
// closed.
func TestReaperSeesConsistentStates(t *testing.T) {
	f, c := newServerWithConn(t)
	const long = time.Hour
	stop := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		for {
			select {
			case <-stop:
				return
			default:
			}
			// Idle for a long while (well within its limit), then reading
			// with a fresh clock: paired wrongly, the idle state's age and
			// the read state's limit would close the connection.
			now := monotonic()
			if _, ok := c.Move(InIdle, StRead, now, long); !ok {
				return
			}
			if _, ok := c.Move(InRead, StIdle, now-int64(long), 2*long); !ok {
				return
			}
		}
	}()
	for range 20000 {
		f.Sweep()
		if c.state() == StGone {
			break
		}
	}
	close(stop)
	<-moved
	if c.state() == StGone {
		t.Fatal("the reaper closed a connection by another state's clock")
	}
}

// A connection past its state's limit is closed by the next sweep, and
// Count sees the states.
func TestSweepClosesAConnectionPastItsLimit(t *testing.T) {
	f, c := newServerWithConn(t)
	if n := f.Count(StIdle); n != 1 {
		t.Fatalf("%d idle connections, want 1", n)
	}
	if _, ok := c.Move(InIdle, StRead, monotonic()-int64(time.Minute), time.Second); !ok {
		t.Fatal("move to read")
	}
	f.Sweep()
	if c.state() != StGone || f.Count(StRead) != 0 {
		t.Fatalf("state %d after a sweep past the limit, want closed", c.state())
	}
}

package dataplane

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The invocation listener's front end. net/http's server costs a warm call
// more CPU than the rest of the data plane: a Request, a header map, a
// ResponseWriter and a cancel context per call, and a background read (a
// goroutine, a read and a deadline) so that the context ends when the client
// leaves (docs/benchmarks.md, "The saturation target"). The front end reads
// the common call itself on the connection's goroutine — HTTP/1.1, a known
// function named by path or Host, a body of known length up to 64 KiB — and
// proxies it with no per-call allocation of its own. A connection whose
// request is anything else (h2c, an upgrade, Expect, a chunked or large
// body, /metrics, /healthz, an unknown function, input it would have to
// reject) is handed, with the bytes read so far, to the net/http server for
// the rest of its life; that server serves Handler, so every behaviour
// stays one implementation away.
//
// Timeouts are kept by a reaper instead of a deadline per call: each
// connection publishes its state and when it entered it, and the reaper
// closes the ones past their limit. The reaper also starts the client
// watch of a call that has run for watchAfter: a goroutine that reads
// the client connection and ends the call if the client left.

const (
	frontBufSize = 4 << 10
	// reapEvery is the reaper's period, and so the granularity of the
	// front end's timeouts.
	reapEvery = 25 * time.Millisecond
	// watchAfter: a call running longer has its client watched.
	watchAfter = 50 * time.Millisecond
)

// Connection states. The connection's goroutine moves between the live
// ones; the reaper moves any of them to stGone (and closes the connection)
// and stCall to stWatch (and starts the watch). Both use compare-and-swap,
// so a connection is never closed for a state it has left.
const (
	stIdle  int32 = iota // waiting for a request; limit: IdleTimeout (the header timeout for the first)
	stRead               // reading a request; limit: header or read timeout
	stCall               // in a call (queue, sandbox, reply); limit: the write timeout
	stWatch              // stCall with the client watched
	stGone               // closed or handed off
)

var (
	errFrontClosed = errors.New("dataplane: front end closed")
	bufReaders     = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, frontBufSize) }}
	bufWriters     = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, frontBufSize) }}
)

type frontEnd struct {
	d        *DataPlane
	fallback *http.Server
	handoff  *handoffListener

	// open counts the client connections not yet closed, handed-off ones
	// included (Config.MaxConnections).
	open atomic.Int64

	mu      sync.Mutex
	ln      net.Listener
	conns   map[*frontConn]struct{}
	closing atomic.Bool
	conWG   sync.WaitGroup // connection goroutines
	done    chan struct{}  // closed when the front end stops: ends the reaper
	stop    sync.Once
}

func (d *DataPlane) newFrontEnd(fallback *http.Server) *frontEnd {
	return &frontEnd{
		d:        d,
		fallback: fallback,
		conns:    make(map[*frontConn]struct{}),
		done:     make(chan struct{}),
	}
}

// serve accepts connections on ln until the front end is shut down or
// closed; it then returns http.ErrServerClosed, or the accept error that
// ended it.
func (f *frontEnd) serve(ln net.Listener) error {
	f.mu.Lock()
	if f.closing.Load() {
		f.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	f.ln = ln
	f.handoff = newHandoffListener(ln.Addr())
	f.mu.Unlock()
	fallbackErr := make(chan error, 1)
	go func() { fallbackErr <- f.fallback.Serve(f.handoff) }()
	go f.reap()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if f.closing.Load() {
				return http.ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: net/http's backoff.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			f.d.log.Warn("accept failed; retrying", "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-f.done:
				return http.ErrServerClosed
			case err := <-fallbackErr:
				return err
			}
			continue
		}
		backoff = 0
		f.d.prom.accepted.Inc()
		if f.open.Add(1) > int64(f.d.cfg.MaxConnections) {
			f.open.Add(-1)
			f.d.prom.refused.Inc()
			nc.Close()
			continue
		}
		c := f.newConn(nc)
		if !f.track(c) {
			f.open.Add(-1)
			nc.Close()
			continue
		}
		go c.serve()
	}
}

func (f *frontEnd) newConn(nc net.Conn) *frontConn {
	c := &frontConn{f: f, nc: nc, watchDone: make(chan struct{}, 1)}
	c.br = bufReaders.Get().(*bufio.Reader)
	c.br.Reset(nc)
	c.bw = bufWriters.Get().(*bufio.Writer)
	c.bw.Reset(nc)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.remote = nc.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(c.remote); err == nil {
		c.remote = host
	}
	// A new connection has the header timeout to send its first request
	// (net/http's rule); between requests the idle timeout applies.
	c.limit.Store(int64(min(f.d.cfg.ReadHeaderTimeout, f.d.cfg.ReadTimeout)))
	c.since.Store(f.d.nanotime())
	return c
}

func (f *frontEnd) track(c *frontConn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing.Load() {
		return false
	}
	f.conns[c] = struct{}{}
	f.conWG.Add(1)
	return true
}

// untrack removes c from the reaper's view. Once it returns the reaper
// starts no watch on c any more (it works under f.mu).
func (f *frontEnd) untrack(c *frontConn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// reap enforces the connections' time limits and starts client watches,
// every reapEvery, until the front end stops.
func (f *frontEnd) reap() {
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		f.sweep()
	}
}

func (f *frontEnd) sweep() {
	now := f.d.nanotime()
	closing := f.closing.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		s := c.state.Load()
		age := now - c.since.Load()
		switch s {
		case stIdle:
			if closing || age > c.limit.Load() {
				c.kill(stIdle)
			}
		case stRead, stWatch:
			if age > c.limit.Load() {
				c.kill(s)
			}
		case stCall:
			if age > c.limit.Load() {
				c.kill(s)
			} else if age >= int64(watchAfter) && c.state.CompareAndSwap(stCall, stWatch) {
				c.watches.Add(1)
				go c.watch()
			}
		}
	}
}

// shutdown stops accepting, closes idle connections, lets calls in flight
// finish (their replies say Connection: close) and returns when every
// connection is gone, or closes the rest when ctx ends.
func (f *frontEnd) shutdown(ctx context.Context) error {
	f.closing.Store(true)
	f.mu.Lock()
	if f.ln != nil {
		f.ln.Close()
	}
	f.mu.Unlock()
	fallbackDone := make(chan error, 1)
	go func() { fallbackDone <- f.fallback.Shutdown(ctx) }()
	f.sweep() // idle ones now; the reaper repeats it for calls that end
	drained := make(chan struct{})
	go func() { f.conWG.Wait(); close(drained) }()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	f.close()
	if ferr := <-fallbackDone; err == nil && ferr != nil {
		err = ferr
	}
	return err
}

// close closes the listener and every connection at once.
func (f *frontEnd) close() {
	f.closing.Store(true)
	f.stop.Do(func() { close(f.done) })
	f.mu.Lock()
	if f.ln != nil {
		f.ln.Close()
	}
	for c := range f.conns {
		if s := c.state.Load(); s != stGone {
			c.kill(s)
		}
	}
	f.mu.Unlock()
	_ = f.fallback.Close()
}

// frontConn is one client connection served by the front end.
type frontConn struct {
	f  *frontEnd
	nc net.Conn
	br *bufio.Reader
	bw *bufio.Writer

	state atomic.Int32
	since atomic.Int64 // DataPlane.nanotime when the state was entered
	limit atomic.Int64 // ns the state may last (stRead, stCall, stWatch)

	// The client watch (watch). up is the sandbox connection of the call
	// in flight, which a watch that finds the client gone aborts; watches
	// counts the watches the reaper started, seen the ones this
	// goroutine has waited for.
	up        atomic.Pointer[upConn]
	gone      atomic.Bool
	watches   atomic.Int32
	seen      int32
	watchDone chan struct{}
	ctx       context.Context // ends when the client leaves: ends a queue wait
	cancel    context.CancelFunc

	remote string // the client's address for X-Forwarded-For

	head   []byte // the request head, copied out of br
	body   []byte
	req    frontReq
	rbuf   []byte // a reply head, copied out of the sandbox connection
	rhdrs  []hdrSpan
	st     reqState
	callID [32]byte
}

// kill closes c if it is still in state s.
func (c *frontConn) kill(s int32) {
	if c.state.CompareAndSwap(s, stGone) {
		c.nc.Close()
	}
}

// enter moves c from state from to to, which may last limit; false: the
// reaper closed c.
func (c *frontConn) enter(from, to int32, limit time.Duration) bool {
	c.limit.Store(int64(limit))
	c.since.Store(c.f.d.nanotime())
	return c.state.CompareAndSwap(from, to)
}

func (c *frontConn) serve() {
	defer c.f.conWG.Done()
	handed := false
	defer func() {
		if !handed {
			c.finish()
		}
	}()
	for {
		fn, act := c.next()
		switch act {
		case actClose:
			return
		case actHandoff:
			handed = c.handOff()
			return
		}
		if !c.call(fn) || c.f.closing.Load() {
			return
		}
	}
}

// finish closes the connection and recycles its buffers, once no watch
// can touch them.
func (c *frontConn) finish() {
	c.f.untrack(c)
	c.state.Store(stGone)
	c.nc.Close()
	c.f.open.Add(-1)
	c.cancel()
	for c.seen < c.watches.Load() {
		<-c.watchDone
		c.seen++
	}
	c.br.Reset(nil)
	bufReaders.Put(c.br)
	c.bw.Reset(nil)
	bufWriters.Put(c.bw)
}

// handOff passes the connection, and what was read of it, to the net/http
// server. It reports whether the server took it.
func (c *frontConn) handOff() bool {
	c.f.untrack(c)
	if !c.state.CompareAndSwap(stRead, stGone) { // timed out meanwhile
		return false
	}
	c.cancel()
	c.f.d.prom.handedOff.Inc()
	hc := &handedConn{Conn: c.nc, open: &c.f.open}
	if c.br.Buffered() > 0 {
		hc.br = c.br // the server reads these bytes first
	} else {
		c.br.Reset(nil)
		bufReaders.Put(c.br)
	}
	c.bw.Reset(nil)
	bufWriters.Put(c.bw)
	if !c.f.handoff.give(hc) {
		hc.Close()
	}
	return true
}

// leaveCall ends the call state: it waits for the client watch, if one
// started, and reports whether the connection is still usable.
func (c *frontConn) leaveCall() bool {
	for {
		s := c.state.Load()
		if s == stGone {
			return false
		}
		c.limit.Store(int64(c.f.d.cfg.IdleTimeout))
		c.since.Store(c.f.d.nanotime())
		if !c.state.CompareAndSwap(s, stIdle) {
			continue // the reaper started a watch meanwhile
		}
		if s == stWatch {
			c.stopWatch()
		}
		return !c.gone.Load()
	}
}

// watch reads the client connection while a call runs; an end of stream or
// an error other than stopWatch's deadline means the client left: the queue
// wait or the sandbox exchange ends at once, so the slot comes back.
func (c *frontConn) watch() {
	_, err := c.br.Peek(1)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.gone.Store(true)
		c.cancel()
		if up := c.up.Load(); up != nil {
			up.abort()
		}
	}
	c.watchDone <- struct{}{}
}

func (c *frontConn) stopWatch() {
	_ = c.nc.SetReadDeadline(longAgo)
	<-c.watchDone
	c.seen++
	_ = c.nc.SetReadDeadline(time.Time{})
}

// handedConn is a connection handed to the net/http server: the bytes the
// front end read ahead come first.
type handedConn struct {
	net.Conn
	br     *bufio.Reader
	open   *atomic.Int64 // frontEnd.open, counted down once on Close
	closed atomic.Bool
}

func (c *handedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

func (c *handedConn) Read(p []byte) (int, error) {
	if c.br != nil {
		if c.br.Buffered() > 0 {
			return c.br.Read(p)
		}
		c.br.Reset(nil)
		bufReaders.Put(c.br)
		c.br = nil
	}
	return c.Conn.Read(p)
}

// CloseWrite lets the server half-close before closing, as it does on its
// own connections, so that a client still sending a body it will not read
// gets the reply rather than a reset.
func (c *handedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// handoffListener gives handed-off connections to the net/http server.
type handoffListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// give passes c to the server; false once the server stopped accepting.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

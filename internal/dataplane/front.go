package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/h1"
)

// The invocation listener's front end. net/http's server costs a warm call
// more CPU than the rest of the data plane: a Request, a header map, a
// ResponseWriter and a cancel context per call, and a background read (a
// goroutine, a read and a deadline) so that the context ends when the client
// leaves (docs/benchmarks.md, "Warm calls"). The front end reads
// the common call itself on the connection's goroutine — HTTP/1.1, a known
// function named by path or Host, a body of known length up to 64 KiB — and
// proxies it with no per-call allocation of its own. A connection whose
// request is anything else (h2c, an upgrade, Expect, a chunked or large
// body, /metrics, /healthz, an unknown function, input it would have to
// reject) is handed, with the bytes read so far, to the net/http server for
// the rest of its life; that server serves Handler, so every behaviour
// stays one implementation away.
//
// Over TLS (Config.TLS) the listener hands out *tls.Conn: the front end
// and the net/http server behind it read and write decrypted bytes. The
// handshake runs first on the connection's goroutine, in the idle state
// of a new connection, so the header timeout bounds it like the first
// request's head; the reaper closes the TCP connection under it.
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
// ones (move); the reaper moves any of them to stGone (and closes the
// connection) and stCall to stWatch (and starts the watch). The state sits
// in the low bits of a word whose high bits count the goroutine's moves,
// and the goroutine holds stBusy while it sets the state's clock (since,
// limit): the reaper acts only through a compare-and-swap on the word it
// read before the clock, so it never closes a connection for a state it
// has left, nor judges a state by another's clock.
const (
	stIdle  int32 = iota // waiting for a request; limit: IdleTimeout (the header timeout for the first)
	stRead               // reading a request; limit: header, then read timeout
	stCall               // in a call (queue, sandbox, reply); limit: the write timeout
	stWatch              // stCall with the client watched
	stReply              // the slot is free, the end of the reply goes out; limit: the call's
	stBusy               // the goroutine is setting the clock: the reaper waits
	stGone               // closed or handed off

	stBits = 3
	stMask = 1<<stBits - 1
)

// Masks of states for move.
const (
	inIdle  uint8 = 1 << stIdle
	inRead  uint8 = 1 << stRead
	inCall  uint8 = 1<<stCall | 1<<stWatch
	inReply uint8 = 1 << stReply
)

var (
	bufReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, frontBufSize) }}
	bufWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, frontBufSize) }}
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
	c := &frontConn{f: f, nc: nc, raw: nc, watchDone: make(chan struct{}, 1)}
	if tc, ok := nc.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	c.br = bufReaders.Get().(*bufio.Reader)
	c.br.Reset(nc)
	c.bw = bufWriters.Get().(*bufio.Writer)
	c.out.nc = nc
	c.bw.Reset(&c.out)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.remote = nc.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(c.remote); err == nil {
		c.remote = host
	}
	// A new connection has the header timeout to send its first request
	// (net/http's rule); between requests the idle timeout applies.
	c.limit.Store(int64(min(f.d.cfg.ReadHeaderTimeout, f.d.cfg.ReadTimeout)))
	c.since.Store(f.d.nanotime())
	c.word.Store(uint64(stIdle))
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
		w := c.word.Load()
		s := int32(w & stMask)
		if s == stBusy || s == stGone {
			continue
		}
		age := now - c.since.Load()
		switch {
		case age > c.limit.Load(), s == stIdle && closing:
			c.killIf(w)
		case s == stCall && age >= int64(watchAfter):
			if c.word.CompareAndSwap(w, w&^stMask|uint64(stWatch)) {
				c.watches.Add(1)
				go c.watch()
			}
		}
	}
}

// shutdown stops accepting, closes idle connections and lets calls in
// flight finish (their replies say Connection: close); then the net/http
// server behind does the same with the connections it was handed, those
// handed over meanwhile included. It returns when every connection is
// gone, or closes the rest when ctx ends.
func (f *frontEnd) shutdown(ctx context.Context) error {
	f.closing.Store(true)
	f.mu.Lock()
	if f.ln != nil {
		f.ln.Close()
	}
	f.mu.Unlock()
	f.sweep() // idle ones now; the reaper repeats it for calls that end
	drained := make(chan struct{})
	go func() { f.conWG.Wait(); close(drained) }()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if ferr := f.fallback.Shutdown(ctx); err == nil {
		err = ferr
	}
	f.close()
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
		for {
			w := c.word.Load()
			if s := int32(w & stMask); s == stGone || (s != stBusy && c.killIf(w)) {
				break
			}
			runtime.Gosched() // a move in progress: a few instructions
		}
	}
	f.mu.Unlock()
	_ = f.fallback.Close()
}

// frontConn is one client connection served by the front end.
type frontConn struct {
	f  *frontEnd
	nc net.Conn
	// raw is the TCP connection under nc (nc itself without TLS): what
	// the reaper closes, at once, with no TLS alert to write.
	raw net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer // writes to out
	// out counts what reached the client connection, so that a reply cut
	// off before any of it left can still be answered with a 502.
	out countingConn
	// charged is what the request in hand holds of the body budget.
	charged int64

	word  atomic.Uint64 // moves<<stBits | state
	since atomic.Int64  // DataPlane.nanotime when the state's clock started
	limit atomic.Int64  // ns the state may last

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
	rhdrs  []h1.Header
	st     reqState
	callID [32]byte
	// accepting ends the submit in hand's Queue.Accepting (fastasync.go).
	accepting func()
}

// killIf closes c if its word is still w; it reports whether it did.
func (c *frontConn) killIf(w uint64) bool {
	if c.word.CompareAndSwap(w, w&^stMask|uint64(stGone)) {
		c.raw.Close()
		return true
	}
	return false
}

// move takes c from one of the states in from to state to, whose clock
// starts at since and runs limit. It returns the state c left, and false
// when c was in none of them (the reaper closed it).
func (c *frontConn) move(from uint8, to int32, since int64, limit time.Duration) (int32, bool) {
	for {
		w := c.word.Load()
		s := int32(w & stMask)
		if from&(1<<s) == 0 {
			return s, false
		}
		busy := (w>>stBits+1)<<stBits | uint64(stBusy)
		if c.word.CompareAndSwap(w, busy) {
			c.since.Store(since)
			c.limit.Store(int64(limit))
			c.word.Store((busy>>stBits+1)<<stBits | uint64(to))
			return s, true
		}
	}
}

func (c *frontConn) serve() {
	defer c.f.conWG.Done()
	handed := false
	defer func() {
		if !handed {
			c.finish()
		}
	}()
	if tc, ok := c.nc.(*tls.Conn); ok && !c.handshake(tc) {
		return
	}
	for {
		fn, act := c.next()
		if act != actCall && c.accepting != nil {
			c.accepting()
			c.accepting = nil
		}
		switch act {
		case actClose:
			return
		case actHandoff:
			if c.f.closing.Load() {
				// net/http, shutting down, would drop it unanswered.
				c.refuse(failure{http.StatusServiceUnavailable, reasonShuttingDown, "the data plane is shutting down: call again"})
				return
			}
			handed = c.handOff()
			return
		}
		if !c.call(fn) || c.f.closing.Load() {
			return
		}
	}
}

// handshake runs the TLS handshake of a new connection. It is in stIdle
// with the header timeout as its limit (newConn), so a client that never
// sends a ClientHello, or stalls in the middle, is closed by the reaper
// like one that never sends a request. A client speaking plain HTTP to the
// port gets net/http's answer to that.
func (c *frontConn) handshake(tc *tls.Conn) bool {
	err := tc.Handshake()
	if err == nil {
		return true
	}
	var re tls.RecordHeaderError
	if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader[:]) {
		_ = re.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
	}
	c.f.d.log.Debug("TLS handshake failed", "remote", c.remote, "err", err)
	return false
}

// looksLikeHTTP reports whether the first bytes of a connection are a
// plain HTTP request (net/http's test).
func looksLikeHTTP(hdr []byte) bool {
	switch string(hdr) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "CONNE", "TRACE":
		return true
	}
	return false
}

// finish closes the connection and recycles its buffers, once no watch
// can touch them.
func (c *frontConn) finish() {
	c.uncharge()
	c.f.untrack(c)
	c.word.Store(uint64(stGone))
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

// refuse answers the request being read with a brisk error and closes the
// connection the way net/http does: its write side first, then a short wait
// for what the client still sends, so that the answer is not lost to a
// reset.
func (c *frontConn) refuse(f failure) {
	if !c.writeError(f, nil, false, false) {
		return
	}
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.Copy(io.Discard, io.LimitReader(c.nc, 256<<10))
	}
}

// handOff passes the connection, and what was read of it, to the net/http
// server. It reports whether the connection left the front end (false: the
// reaper closed it first, and it is still the front end's to finish).
func (c *frontConn) handOff() bool {
	c.f.untrack(c)
	if _, ok := c.move(inRead, stGone, 0, 0); !ok { // timed out meanwhile
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

// endCall ends the call state once the sandbox is done with: it waits for
// the client watch, if one started, and reports whether the connection is
// still usable. What is left of the reply goes out in stReply, which the
// reaper bounds by the call's limit.
func (c *frontConn) endCall() bool {
	left, ok := c.move(inCall, stReply, c.since.Load(), time.Duration(c.limit.Load()))
	if left == stWatch {
		c.stopWatch()
	}
	return ok && !c.gone.Load()
}

// idle makes c wait for its next request.
func (c *frontConn) idle() bool {
	_, ok := c.move(inReply, stIdle, c.f.d.nanotime(), c.f.d.cfg.IdleTimeout)
	return ok
}

// leaveCall ends a call whose answer is written: endCall, then idle.
func (c *frontConn) leaveCall() bool {
	return c.endCall() && c.idle()
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
			up.Abort()
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

// countingConn writes to a connection and counts the bytes written.
type countingConn struct {
	nc net.Conn
	n  int64
}

func (w *countingConn) Write(p []byte) (int, error) {
	n, err := w.nc.Write(p)
	w.n += int64(n)
	return n, err
}

// Package front is the data plane's invocation listener: its connections,
// their states and time limits, and the handoff to net/http. net/http's
// server costs a warm call more CPU than the rest of the data plane: a
// Request, a header map, a ResponseWriter and a cancel context per call,
// and a background read (a goroutine, a read and a deadline) so that the
// context ends when the client leaves (docs/benchmarks.md, "Warm calls").
// Here each connection's Session (the data plane's) reads the common call
// itself on the connection's goroutine — HTTP/1.1, a known function named
// by path or Host, a body of known length up to 64 KiB — and proxies it
// with no per-call allocation of its own. A connection whose request is
// anything else (h2c, an upgrade, Expect, a chunked or large body,
// /metrics, /healthz, an unknown function, input it would have to reject)
// is handed (Conn.HandOff), with the bytes read so far, to the net/http
// server for the rest of its life; that server serves the data plane's
// Handler, so every behaviour stays one implementation away.
//
// Over TLS (the data plane's Config.TLS) the listener hands out *tls.Conn:
// the session and the net/http server behind it read and write decrypted
// bytes. The handshake runs first on the connection's goroutine, in the
// idle state of a new connection, so the header timeout bounds it like the
// first request's head; the reaper closes the TCP connection under it.
//
// Timeouts are kept by a reaper instead of a deadline per call: each
// connection publishes its state and when it entered it, and the reaper
// closes the ones past their limit. The reaper also starts the client
// watch of a call that has run for WatchAfter: a goroutine that reads the
// client connection and, if the client left, ends the call
// (Session.ClientGone).
package front

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/proxy"
)

const (
	// BufSize is a connection's read and write buffer.
	BufSize = 4 << 10
	// ReapEvery is the reaper's period, and so the granularity of the
	// front end's timeouts.
	ReapEvery = 25 * time.Millisecond
	// WatchAfter: a call running longer has its client watched.
	WatchAfter = 50 * time.Millisecond
)

// Connection states. The connection's goroutine moves between the live
// ones (Move); the reaper moves any of them to StGone (and closes the
// connection) and StCall to stWatch (and starts the watch). The state sits
// in the low bits of a word whose high bits count the goroutine's moves,
// and the goroutine holds stBusy while it sets the state's clock (since,
// limit): the reaper acts only through a compare-and-swap on the word it
// read before the clock, so it never closes a connection for a state it
// has left, nor judges a state by another's clock.
const (
	StIdle  int32 = iota // waiting for a request; limit: IdleTimeout (the header timeout for the first)
	StRead               // reading a request; limit: header, then read timeout
	StCall               // in a call (queue, sandbox, reply); limit: the write timeout
	stWatch              // StCall with the client watched
	StReply              // the slot is free, the end of the reply goes out; limit: the call's
	stBusy               // the goroutine is setting the clock: the reaper waits
	StGone               // closed or handed off

	stBits = 3
	stMask = 1<<stBits - 1
)

// Masks of states for Move.
const (
	InIdle  uint8 = 1 << StIdle
	InRead  uint8 = 1 << StRead
	InCall  uint8 = 1<<StCall | 1<<stWatch
	InReply uint8 = 1 << StReply
)

var (
	bufReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, BufSize) }}
	bufWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, BufSize) }}
)

// Counter is a metric the front end counts into (a Prometheus counter).
type Counter interface{ Inc() }

type noCount struct{}

func (noCount) Inc() {}

// Config is the front end's: its limits, its clock, and the session that
// serves each connection's requests.
type Config struct {
	// MaxConnections bounds the client connections open at once, handed-off
	// ones included; one over it is closed at once.
	MaxConnections int
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout as net/http's, but
	// required: zero closes a connection at the reaper's next pass.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout time.Duration
	// Now is the monotonic clock (ns) of the states' limits.
	Now func() int64
	Log *slog.Logger
	// Accepted, Refused (over MaxConnections) and HandedOff count
	// connections.
	Accepted, Refused, HandedOff Counter
	// NewSession makes the session that serves a new connection's
	// requests.
	NewSession func(*Conn) Session
}

// Session serves one connection's requests on the connection's goroutine.
type Session interface {
	// Serve reads and answers requests until the connection is to close,
	// or it hands the connection to net/http (Conn.HandOff): the front end
	// closes it unless it was handed off.
	Serve()
	// ClientGone is called from the client watch when the client left in
	// the middle of a call: the call's sandbox exchange should end now.
	ClientGone()
	// Release gives back what the session holds, as its connection closes.
	Release()
}

// Server is the front end: it accepts connections on the invocation
// listener, keeps their time limits and hands the ones it does not serve
// to fallback.
type Server struct {
	cfg      Config
	fallback *http.Server
	handoff  *handoffListener

	// open counts the client connections not yet closed, handed-off ones
	// included (Config.MaxConnections).
	open atomic.Int64

	mu      sync.Mutex
	ln      net.Listener
	conns   map[*Conn]struct{}
	closing atomic.Bool
	conWG   sync.WaitGroup // connection goroutines
	done    chan struct{}  // closed when the front end stops: ends the reaper
	stop    sync.Once
}

// New makes a front end whose handed-off connections go to fallback.
// Config.NewSession is required; a nil Now counts from New, nil counters
// count nothing.
func New(cfg Config, fallback *http.Server) *Server {
	if cfg.NewSession == nil {
		panic("front: Config.NewSession is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		start := time.Now()
		cfg.Now = func() int64 { return int64(time.Since(start)) }
	}
	for _, c := range []*Counter{&cfg.Accepted, &cfg.Refused, &cfg.HandedOff} {
		if *c == nil {
			*c = noCount{}
		}
	}
	return &Server{
		cfg:      cfg,
		fallback: fallback,
		conns:    make(map[*Conn]struct{}),
		done:     make(chan struct{}),
	}
}

// Count is how many of the front end's connections are in state now (a
// call whose client is watched counts as StCall).
func (f *Server) Count(state int32) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for c := range f.conns {
		s := c.state()
		if s == stWatch {
			s = StCall
		}
		if s == state {
			n++
		}
	}
	return n
}

// Open is how many client connections are open, handed-off ones included.
func (f *Server) Open() int64 { return f.open.Load() }

// Closing reports whether the front end is shutting down or closed.
func (f *Server) Closing() bool { return f.closing.Load() }

// Serve accepts connections on ln until the front end is shut down or
// closed; it then returns http.ErrServerClosed, or the accept error that
// ended it.
func (f *Server) Serve(ln net.Listener) error {
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
			f.cfg.Log.Warn("accept failed; retrying", "err", err, "in", backoff)
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
		f.cfg.Accepted.Inc()
		if f.open.Add(1) > int64(f.cfg.MaxConnections) {
			f.open.Add(-1)
			f.cfg.Refused.Inc()
			nc.Close()
			continue
		}
		c := f.newConn(nc)
		if !f.track(c) {
			f.open.Add(-1)
			nc.Close()
			continue
		}
		go f.serveConn(c)
	}
}

func (f *Server) newConn(nc net.Conn) *Conn {
	c := &Conn{f: f, NC: nc, raw: nc, watchDone: make(chan struct{}, 1)}
	if tc, ok := nc.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	c.BR = bufReaders.Get().(*bufio.Reader)
	c.BR.Reset(nc)
	c.BW = bufWriters.Get().(*bufio.Writer)
	c.Out.nc = nc
	c.BW.Reset(&c.Out)
	c.Ctx, c.Cancel = context.WithCancel(context.Background())
	c.Remote = nc.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(c.Remote); err == nil {
		c.Remote = host
	}
	// A new connection has the header timeout to send its first request
	// (net/http's rule); between requests the idle timeout applies.
	c.limit.Store(int64(min(f.cfg.ReadHeaderTimeout, f.cfg.ReadTimeout)))
	c.since.Store(f.cfg.Now())
	c.word.Store(uint64(StIdle))
	c.sess = f.cfg.NewSession(c)
	return c
}

func (f *Server) track(c *Conn) bool {
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
func (f *Server) untrack(c *Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// reap enforces the connections' time limits and starts client watches,
// every ReapEvery, until the front end stops.
func (f *Server) reap() {
	t := time.NewTicker(ReapEvery)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		f.Sweep()
	}
}

// Sweep enforces the connections' time limits and starts client watches
// now, as the reaper does every ReapEvery.
func (f *Server) Sweep() {
	now := f.cfg.Now()
	closing := f.closing.Load()
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		w := c.word.Load()
		s := int32(w & stMask)
		if s == stBusy || s == StGone {
			continue
		}
		age := now - c.since.Load()
		switch {
		case age > c.limit.Load(), s == StIdle && closing:
			c.killIf(w)
		case s == StCall && age >= int64(WatchAfter):
			if c.word.CompareAndSwap(w, w&^stMask|uint64(stWatch)) {
				c.watches.Add(1)
				go c.watch()
			}
		}
	}
}

// Shutdown stops accepting, closes idle connections and lets calls in
// flight finish (their replies say Connection: close); then the net/http
// server behind does the same with the connections it was handed, those
// handed over meanwhile included. It returns when every connection is
// gone, or closes the rest when ctx ends.
func (f *Server) Shutdown(ctx context.Context) error {
	f.closing.Store(true)
	f.mu.Lock()
	if f.ln != nil {
		f.ln.Close()
	}
	f.mu.Unlock()
	f.Sweep() // idle ones now; the reaper repeats it for calls that end
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
	f.Close()
	return err
}

// Close closes the listener and every connection at once.
func (f *Server) Close() {
	f.closing.Store(true)
	f.stop.Do(func() { close(f.done) })
	f.mu.Lock()
	if f.ln != nil {
		f.ln.Close()
	}
	for c := range f.conns {
		for {
			w := c.word.Load()
			if s := int32(w & stMask); s == StGone || (s != stBusy && c.killIf(w)) {
				break
			}
			runtime.Gosched() // a move in progress: a few instructions
		}
	}
	f.mu.Unlock()
	_ = f.fallback.Close()
}

// Conn is one client connection served by the front end; its Session
// reads requests from BR and writes replies to BW.
type Conn struct {
	f  *Server
	NC net.Conn
	// raw is the TCP connection under NC (NC itself without TLS): what
	// the reaper closes, at once, with no TLS alert to write.
	raw net.Conn
	BR  *bufio.Reader
	BW  *bufio.Writer // writes to Out
	// Out counts what reached the client connection, so that a reply cut
	// off before any of it left can still be answered with a 502.
	Out countingConn

	word  atomic.Uint64 // moves<<stBits | state
	since atomic.Int64  // Config.Now when the state's clock started
	limit atomic.Int64  // ns the state may last

	// The client watch (watch): watches counts the watches the reaper
	// started, seen the ones this goroutine has waited for. Gone: a watch
	// found the client gone.
	Gone      atomic.Bool
	watches   atomic.Int32
	seen      int32
	watchDone chan struct{}
	// Ctx ends when the client leaves (or the connection closes): it ends
	// a queue wait.
	Ctx    context.Context
	Cancel context.CancelFunc

	Remote string // the client's address, for X-Forwarded-For
	sess   Session
	handed bool // HandOff passed it to net/http
}

// Closing reports whether c's front end is shutting down or closed.
func (c *Conn) Closing() bool { return c.f.closing.Load() }

// Since is when the current state's clock started (Config.Now).
func (c *Conn) Since() int64 { return c.since.Load() }

// state is c's state now.
func (c *Conn) state() int32 { return int32(c.word.Load() & stMask) }

// killIf closes c if its word is still w; it reports whether it did.
func (c *Conn) killIf(w uint64) bool {
	if c.word.CompareAndSwap(w, w&^stMask|uint64(StGone)) {
		c.raw.Close()
		return true
	}
	return false
}

// Move takes c from one of the states in from to state to, whose clock
// starts at since and runs limit. It returns the state c left, and false
// when c was in none of them (the reaper closed it).
func (c *Conn) Move(from uint8, to int32, since int64, limit time.Duration) (int32, bool) {
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

// serveConn runs c's session on c's goroutine, after the TLS handshake,
// and closes c unless the session handed it off.
func (f *Server) serveConn(c *Conn) {
	defer f.conWG.Done()
	if tc, ok := c.NC.(*tls.Conn); ok && !c.handshake(tc) {
		c.finish()
		return
	}
	c.sess.Serve()
	if !c.handed {
		c.finish()
	}
}

// handshake runs the TLS handshake of a new connection. It is in StIdle
// with the header timeout as its limit (newConn), so a client that never
// sends a ClientHello, or stalls in the middle, is closed by the reaper
// like one that never sends a request. A client speaking plain HTTP to the
// port gets net/http's answer to that.
func (c *Conn) handshake(tc *tls.Conn) bool {
	err := tc.Handshake()
	if err == nil {
		return true
	}
	var re tls.RecordHeaderError
	if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader[:]) {
		_ = re.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
	}
	c.f.cfg.Log.Debug("TLS handshake failed", "remote", c.Remote, "err", err)
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
func (c *Conn) finish() {
	c.sess.Release()
	c.f.untrack(c)
	c.word.Store(uint64(StGone))
	c.NC.Close()
	c.f.open.Add(-1)
	c.Cancel()
	for c.seen < c.watches.Load() {
		<-c.watchDone
		c.seen++
	}
	c.BR.Reset(nil)
	bufReaders.Put(c.BR)
	c.BW.Reset(nil)
	bufWriters.Put(c.BW)
}

// HandOff passes the connection, and what was read of it, to the net/http
// server. It reports whether the connection left the front end (false: the
// reaper closed it first, and it is still the front end's to finish).
func (c *Conn) HandOff() bool {
	c.f.untrack(c)
	if _, ok := c.Move(InRead, StGone, 0, 0); !ok { // timed out meanwhile
		return false
	}
	c.Cancel()
	c.f.cfg.HandedOff.Inc()
	hc := &handedConn{Conn: c.NC, open: &c.f.open}
	if c.BR.Buffered() > 0 {
		hc.br = c.BR // the server reads these bytes first
	} else {
		c.BR.Reset(nil)
		bufReaders.Put(c.BR)
	}
	c.BW.Reset(nil)
	bufWriters.Put(c.BW)
	if !c.f.handoff.give(hc) {
		hc.Close()
	}
	c.handed = true
	return true
}

// EndCall ends the call state once the sandbox is done with: it waits for
// the client watch, if one started, and reports whether the connection is
// still usable. What is left of the reply goes out in StReply, which the
// reaper bounds by the call's limit.
func (c *Conn) EndCall() bool {
	left, ok := c.Move(InCall, StReply, c.since.Load(), time.Duration(c.limit.Load()))
	if left == stWatch {
		c.stopWatch()
	}
	return ok && !c.Gone.Load()
}

// Idle makes c wait for its next request.
func (c *Conn) Idle() bool {
	_, ok := c.Move(InReply, StIdle, c.f.cfg.Now(), c.f.cfg.IdleTimeout)
	return ok
}

// LeaveCall ends a call whose answer is written: EndCall, then Idle.
func (c *Conn) LeaveCall() bool {
	return c.EndCall() && c.Idle()
}

// watch reads the client connection while a call runs; an end of stream or
// an error other than stopWatch's deadline means the client left: the queue
// wait or the sandbox exchange ends at once, so the slot comes back.
func (c *Conn) watch() {
	_, err := c.BR.Peek(1)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		c.Gone.Store(true)
		c.Cancel()
		c.sess.ClientGone()
	}
	c.watchDone <- struct{}{}
}

func (c *Conn) stopWatch() {
	_ = c.NC.SetReadDeadline(proxy.LongAgo) // ends the watch's read now
	<-c.watchDone
	c.seen++
	_ = c.NC.SetReadDeadline(time.Time{})
}

// handedConn is a connection handed to the net/http server: the bytes the
// front end read ahead come first.
type handedConn struct {
	net.Conn
	br     *bufio.Reader
	open   *atomic.Int64 // Server.open, counted down once on Close
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

// N is the bytes written.
func (w *countingConn) N() int64 { return w.n }

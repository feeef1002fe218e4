package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/brisk-faas/brisk/internal/h1"
)

// DialTimeout bounds a connection's set-up to an upstream.
const DialTimeout = time.Second

// ErrPoolClosed: the upstream left (its pool was closed) while a call
// wanted a connection to it.
var ErrPoolClosed = errors.New("the upstream left the routing table")

// CheckIdleAfter: a pooled connection idle longer is probed before reuse
// (the upstream may have closed it: Node's keep-alive timeout is 5 s,
// gunicorn's 2 s). Busier connections are not, which saves a system call
// per call. A variable for tests.
var CheckIdleAfter = 500 * time.Millisecond

var monoEpoch = time.Now()

// MonoNow is the monotonic clock the pools keep idle times on, in
// nanoseconds since the process started.
func MonoNow() int64 { return int64(time.Since(monoEpoch)) }

var dialer = net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}

// Pool holds the idle keep-alive connections to one upstream address. The
// hot path takes and returns connections under the pool's own mutex: no
// lock wider than one address.
type Pool struct {
	addr    string
	maxIdle int
	bufSize int
	mu      sync.Mutex
	idle    []*Conn // oldest first
	closed  bool
}

// NewPool makes the pool of addr: at most maxIdle idle connections (more
// are closed when returned), each with read and write buffers of bufSize.
func NewPool(addr string, maxIdle, bufSize int) *Pool {
	return &Pool{addr: addr, maxIdle: maxIdle, bufSize: bufSize}
}

// Addr is the upstream's host:port.
func (p *Pool) Addr() string { return p.addr }

// Conn is one keep-alive connection to an upstream: the caller writes a
// request to BW and reads the reply from BR on its own goroutine.
type Conn struct {
	NC     net.Conn
	BR     *bufio.Reader
	BW     *bufio.Writer
	pool   *Pool
	rbuf   []byte           // the reply head ReadHead read
	reply  h1.ReplyHead     // its parse
	chunks h1.ChunkedReader // CopyChunked's decoder
	// Head: the call in flight is a HEAD, whose reply has no body.
	Head bool
	// suspect: the last reply had no body (HEAD, 204, 304), the kind an
	// upstream may wrongly follow with one: probe before reuse.
	suspect bool
	idleAt  int64  // MonoNow when it was last returned to the pool
	abort   func() // ends the exchange in flight (Watch)
}

// Take returns the connection for a call's attempt. The first attempt
// takes an idle one, probed first when it idled past CheckIdleAfter or
// when probe is set (the call could not be sent again on a fresh
// connection), or dials; a replay (attempt > 0) always dials, so that it
// cannot meet another connection the upstream closed.
func (p *Pool) Take(ctx context.Context, attempt int, probe bool) (c *Conn, reused bool, err error) {
	for attempt == 0 {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return nil, false, ErrPoolClosed
			}
			break
		}
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if (!probe && !c.suspect && MonoNow()-c.idleAt < int64(CheckIdleAfter)) || c.alive() {
			c.suspect = false
			return c, true, nil
		}
		c.NC.Close()
	}
	nc, err := dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, false, err
	}
	c = &Conn{NC: nc, BR: bufio.NewReaderSize(nc, p.bufSize), BW: bufio.NewWriterSize(nc, p.bufSize), pool: p}
	c.abort = func() { _ = nc.SetDeadline(LongAgo) } // made once, not per call
	return c, false, nil
}

// alive reports whether an idle connection is still open (stray bytes
// mean it is done).
func (c *Conn) alive() bool { return c.BR.Buffered() == 0 && PeekAlive(c.NC) }

// Put returns c to its pool after a reply; bodiless says the reply had no
// body. Bytes already read past the reply's end are not a reply to
// anything: a connection holding them is closed, never reused, or the
// next caller would read them as its answer.
func (c *Conn) Put(bodiless bool) {
	p := c.pool
	c.idleAt, c.suspect = MonoNow(), bodiless
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.maxIdle || c.BR.Buffered() > 0 {
		p.mu.Unlock()
		c.NC.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// Prune closes the connections idle since before cutoff (MonoNow's
// units). The stack is oldest first, so they are a prefix.
func (p *Pool) Prune(cutoff int64) {
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && p.idle[n].idleAt < cutoff {
		n++
	}
	old := make([]*Conn, n)
	copy(old, p.idle[:n])
	rest := copy(p.idle, p.idle[n:])
	clear(p.idle[rest:])
	p.idle = p.idle[:rest]
	p.mu.Unlock()
	for _, c := range old {
		c.NC.Close()
	}
}

// Close drops the idle connections and makes later returns close theirs:
// the upstream left.
func (p *Pool) Close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		c.NC.Close()
	}
}

// Abort ends the exchange in flight on c (its deadline passes at once).
func (c *Conn) Abort() { c.abort() }

// Watch ends the exchange on c when ctx ends (net/http cancels a request's
// context when its client's connection closes): the upstream sees its
// connection close at once, rather than when it finishes or times out.
// The returned func stops the watch and reports whether c is still
// usable (false once the watch fired). It costs 5 allocations per call.
func (c *Conn) Watch(ctx context.Context) func() bool {
	if ctx.Done() == nil {
		return alwaysUsable
	}
	return context.AfterFunc(ctx, c.abort)
}

var alwaysUsable = func() bool { return true }

// ReadHead reads the reply's head (ReadReply), relaying interim replies
// to w.
func (c *Conn) ReadHead(h *Reply, w http.ResponseWriter) error {
	return ReadReply(c.BR, &c.rbuf, &c.reply, c.Head, h, w)
}

var copyBufs BufferPool

// CopyBody copies a reply body of n bytes, or up to the connection's close
// when n < 0. It reports whether the whole body arrived and went out.
func (c *Conn) CopyBody(cw *ClientWriter, n int64) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	return CopyTo(cw, c.BR, n, buf)
}

// CopyChunked copies a chunked reply body piece by piece (decoded by
// h1.ChunkedReader), then its trailers (declared or not, less hop-by-hop
// ones) as the client's trailers.
func (c *Conn) CopyChunked(cw *ClientWriter, h http.Header) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	cr := &c.chunks
	cr.Reset(c.BR)
	if !CopyTo(cw, cr, -1, buf) {
		return false
	}
	CopyTrailers(h, cr)
	return true
}

// Reap closes the connections of pools() idle longer than idle, every
// third of it, until ctx ends.
func Reap(ctx context.Context, idle time.Duration, pools func() []*Pool) {
	t := time.NewTicker(idle / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cutoff := MonoNow() - int64(idle)
		for _, p := range pools() {
			p.Prune(cutoff)
		}
	}
}

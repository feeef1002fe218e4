package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/brisk-faas/brisk/internal/h1"
	"github.com/brisk-faas/brisk/internal/httpx"
)

// The warm path's upstream client. httputil.ReverseProxy over
// http.Transport hands every call to two goroutines per connection through
// channels, allocates a cancel context per call and clones the request and
// its headers; that made the data plane cost as much CPU per call as the
// load generator and the sandbox together (docs/benchmarks.md). forward
// instead writes the request and reads the reply on the handler's own
// goroutine over a keep-alive connection from the pool of the sandbox's
// address, with the function timeout as the connection's deadline. Requests it does not handle
// (protocol upgrades, request trailers) take the ReverseProxy path.

const (
	// maxIdlePerAddr bounds the idle connections to one address; more
	// are closed when returned.
	maxIdlePerAddr = 4096
	// replayableBody is the largest request body read in full before the
	// call, so that it can be sent again on a fresh connection when a
	// reused one turns out closed by the sandbox.
	replayableBody  = 64 << 10
	upstreamBufSize = 4 << 10
	dialTimeout     = time.Second
)

var errPoolClosed = errors.New("sandbox left the routing table")

// connPool holds the idle keep-alive connections to one sandbox address
// (DataPlane.refPools says why per address). The hot path takes and returns
// connections under the pool's own mutex, no data-plane-wide lock.
type connPool struct {
	addr   string
	refs   int // published endpoints at addr; guarded by DataPlane.applyMu
	mu     sync.Mutex
	idle   []*upConn
	closed bool
}

type upConn struct {
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	pool   *connPool
	rbuf   []byte           // the reply head readHead read
	reply  h1.ReplyHead     // its parse
	chunks h1.ChunkedReader // copyChunked's decoder
	head   bool             // the call in flight is a HEAD: its reply has no body
	// suspect: the last reply had no body (HEAD, 204, 304), the kind a
	// function may wrongly follow with one: probe before reuse.
	suspect bool
	idleAt  int64  // monoNow when it was last returned to the pool
	abort   func() // ends the exchange in flight (watchClient)
}

const (
	// idleTimeout: the reaper closes connections idle longer.
	idleTimeout = 90 * time.Second
)

// checkIdleAfter: a connection idle longer is probed before reuse (a
// function's server may have closed it: Node's keep-alive timeout is 5 s,
// gunicorn's 2 s). Busier connections are not, which saves a system call
// per warm call. A variable for tests.
var checkIdleAfter = 500 * time.Millisecond

var monoEpoch = time.Now()

func monoNow() int64 { return int64(time.Since(monoEpoch)) }

func newConnPool(addr string) *connPool { return &connPool{addr: addr} }

// get returns an idle connection (reused) or dials one. An idle connection
// is probed first when it idled past checkIdleAfter or when probe is set
// (the call could not be sent again on a fresh connection).
func (p *connPool) get(probe bool) (c *upConn, reused bool, err error) {
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			break
		}
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if (!probe && !c.suspect && monoNow()-c.idleAt < int64(checkIdleAfter)) || c.alive() {
			c.suspect = false
			return c, true, nil
		}
		c.nc.Close()
	}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, false, errPoolClosed
	}
	c, err = p.dial()
	return c, false, err
}

// alive reports whether an idle connection is still open (stray bytes
// mean it is done).
func (c *upConn) alive() bool {
	return c.br.Buffered() == 0 && httpx.PeekAlive(c.nc)
}

// take returns the connection for a call's attempt: a pooled one for the
// first (get), a new one for a replay, which must not meet another
// connection the sandbox closed.
func (p *connPool) take(attempt int, probe bool) (c *upConn, reused bool, err error) {
	if attempt == 0 {
		return p.get(probe)
	}
	c, err = p.dial()
	return c, false, err
}

func (p *connPool) dial() (*upConn, error) {
	nc, err := net.DialTimeout("tcp", p.addr, dialTimeout)
	if err != nil {
		return nil, err
	}
	c := &upConn{nc: nc, br: bufio.NewReaderSize(nc, upstreamBufSize), bw: bufio.NewWriterSize(nc, upstreamBufSize), pool: p}
	c.abort = func() { _ = nc.SetDeadline(longAgo) } // made once, not per call
	return c, nil
}

// put returns a connection whose last exchange completed cleanly.
// put returns c to the pool after a reply; bodiless says the reply had no
// body. Bytes already read past the reply's end are not a reply to
// anything: a connection holding them is closed, never reused, or the
// next caller would read them as its answer (and the function's answer to
// it would go to the caller after).
func (p *connPool) put(c *upConn, bodiless bool) {
	c.idleAt, c.suspect = monoNow(), bodiless
	p.mu.Lock()
	if p.closed || len(p.idle) >= maxIdlePerAddr || c.br.Buffered() > 0 {
		p.mu.Unlock()
		c.nc.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// prune closes the connections idle since before cutoff. The stack is
// oldest first, so they are a prefix.
func (p *connPool) prune(cutoff int64) {
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && p.idle[n].idleAt < cutoff {
		n++
	}
	old := make([]*upConn, n)
	copy(old, p.idle[:n])
	rest := copy(p.idle, p.idle[n:])
	clear(p.idle[rest:])
	p.idle = p.idle[:rest]
	p.mu.Unlock()
	for _, c := range old {
		c.nc.Close()
	}
}

// close drops the idle connections and makes later returns close theirs:
// the sandbox left the routing table.
func (p *connPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

var copyBufs httpx.BufferPool

// forward sends r to st.ep and copies the reply to w. It returns the status
// counted for the call.
func (d *DataPlane) forward(w http.ResponseWriter, r *http.Request, st *reqState, rb *reqBody) int {
	if strings.ContainsAny(st.rawRest, " \r\n") || strings.ContainsAny(r.URL.RawQuery, " \r\n") {
		return d.failWith(w, st, failure{http.StatusBadRequest, reasonBadRequest, "invalid characters in the request path or query"})
	}
	// The body was read before the call (readBody): in full, so that the
	// call can be sent again on a fresh connection if a reused one was
	// closed by the sandbox meanwhile; or its rest streams.
	body, buffered := rb.data, rb.rest == nil
	var cb *clientBody
	switch {
	case !buffered:
		cb = &clientBody{r: io.MultiReader(bytes.NewReader(body), rb.rest)}
	case len(body) > replayableBody:
		// A large body goes out beside the reply's reading, as a streamed
		// one does: a function may answer before it has read it all (its
		// own 413), and that answer must reach the client.
		buffered = false
		cb = &clientBody{r: bytes.NewReader(body)}
	}

	deadline := time.Now().Add(st.conf.timeout)
	ctx := r.Context()
	var c *upConn
	var resp httpx.Reply
	var unwatch func() bool
	var streaming chan error // a streamed body's writer, when one runs
	reroutes := 0
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		c, reused, err = st.ep.conns.take(attempt, !buffered)
		if err != nil {
			d.connectFailed(st, err)
			if d.reroute(ctx, st, err, &reroutes) {
				attempt = -1
				continue
			}
			return d.failUpstream(w, st, err)
		}
		st.proxyStart = d.nanotime()
		_ = c.nc.SetDeadline(deadline)
		unwatch = watchClient(ctx, c)
		err = d.writeRequest(c, r, st, body, buffered, cb)
		sent := err == nil
		if sent && cb != nil {
			// A streamed body goes out while the reply is read: a
			// function may answer before it has read it all (a 413 or
			// 401 of its own), or stream its answer as it reads.
			_ = http.NewResponseController(w).EnableFullDuplex()
			streaming = make(chan error, 1)
			go streamBody(streaming, c, r, cb) // not a closure: its captures would escape on every call
		}
		if sent {
			err = c.readHead(&resp, w)
		}
		if err == nil {
			st.firstByte = d.nanotime()
			d.prom.firstByte.Observe(seconds(st.firstByte - st.proxyStart))
			break
		}
		unwatch()
		c.nc.Close()
		if streaming != nil {
			<-streaming // the closed connection ends its writes
		}
		if cb != nil && cb.err != nil { // the client's body failed, not the sandbox
			return d.failBody(w, r, st, cb.err)
		}
		if ctx.Err() != nil { // the client left: nothing to answer, nothing to retry
			st.code = statusClientGone
			return st.code
		}
		// A reused connection the sandbox had closed: the call goes once
		// more on a new one, if it can be sent again and either did not
		// reach the sandbox whole or may run twice (http.Transport's rule).
		if reused && buffered && !resp.Started && httpx.ClosedByPeer(err) && (!sent || httpx.Idempotent(r)) {
			continue
		}
		return d.failUpstream(w, st, err)
	}

	// A small reply of known length is read in full before its status goes
	// out: when the sandbox dies in the middle of it, the client gets a
	// 502 saying so, not a connection closed on it.
	sb := copyBufs.Get()
	defer copyBufs.Put(sb)
	small, err := httpx.ReadSmallBody(c.br, &resp, sb)
	if err != nil {
		unwatch()
		c.nc.Close()
		if streaming != nil {
			<-streaming
		}
		if ctx.Err() != nil {
			st.code = statusClientGone
			return st.code
		}
		return d.failWith(w, st, d.sandboxFailure(st, fmt.Errorf("reply broken off: %w", err)))
	}

	h := w.Header()
	conn := resp.Header["Connection"]
	for k, v := range resp.Header {
		if !httpx.HopByHop(k) && (conn == nil || !httpx.ListedIn(conn, k)) {
			h[k] = v
		}
	}
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil // a proxy adds no type of its own: no sniffing
	}
	h["X-Call-Id"] = st.callID
	h["X-Brisk-Sandbox"] = st.ep.idHdr
	h["X-Brisk-Timing"] = []string{timing(st.queueNs/1e3, st.cold, (d.nanotime()-st.proxyStart)/1e3)}
	h["X-Start-Time"] = []string{strconv.FormatInt(d.epochNs+st.arrival, 10)}
	if resp.Length < 0 {
		delete(h, "Content-Length")
	}
	st.code = resp.Code
	w.WriteHeader(resp.Code)

	cw := httpx.ClientWriter{W: w, Flush: resp.Length < 0}
	ok := true
	switch {
	case resp.NoBody:
	case small != nil:
		_, err := cw.Write(small)
		ok = err == nil
	case resp.Chunked:
		ok = c.copyChunked(&cw, h)
	default:
		ok = c.copyBody(&cw, resp.Length)
	}
	// A streamed body the function did not read to the end is cut off
	// (the writer's next write fails); the connection then cannot carry
	// another call.
	bodySent := httpx.AwaitBodySent(streaming, c.nc)
	// The deadline stays set while the connection idles: every use sets
	// its own. A connection whose deadline the client's leaving moved is
	// not reused.
	if unwatch() && ok && resp.KeepAlive && bodySent {
		c.pool.put(c, resp.NoBody)
	} else {
		c.nc.Close()
	}
	if !ok {
		st.code = http.StatusBadGateway // the sandbox's reply broke off
		if cw.Err != nil || ctx.Err() != nil {
			st.code = statusClientGone
		}
		// The status already went out: abort the client's connection so
		// that a truncated reply shows as one.
		panic(http.ErrAbortHandler)
	}
	return st.code
}

// watchClient ends the exchange on c when the client leaves (net/http
// cancels the request's context when its connection closes): the sandbox
// sees its connection close and the slot comes back at once, rather than
// when the function finishes or times out. The returned func stops the
// watch and reports whether c is still usable. The watch costs 5
// allocations (~0.5 KB) per call, within the noise of BenchmarkHotPath's
// time per call.
func watchClient(ctx context.Context, c *upConn) func() bool {
	if ctx.Done() == nil {
		return alwaysUsable
	}
	return context.AfterFunc(ctx, c.abort)
}

var (
	longAgo      = httpx.LongAgo
	alwaysUsable = func() bool { return true }
)

// clientBody reads the client's request body and keeps its error apart from
// the sandbox connection's.
type clientBody struct {
	r   io.Reader
	err error
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// failBody answers a call whose request body could not be read: too large
// (413), too slow (408), the client gone (nothing to answer), or malformed
// (400). After a body it could not read to its end the connection cannot
// carry another request (its framing is lost), so the answer closes it:
// net/http would otherwise parse the rest of the body as the next request
// and answer that with a 400 of its own.
func (d *DataPlane) failBody(w http.ResponseWriter, r *http.Request, st *reqState, err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errBodyTooSlow): // before the context: the timeout ended it
		w.Header()["Connection"] = hdrClose
		return d.failWith(w, st, fail(http.StatusRequestTimeout, reasonBodyTooSlow, "%v (%d bytes/s)", err, d.cfg.MinBodyRate))
	case r.Context().Err() != nil:
		st.code = statusClientGone
		return st.code
	case errors.As(err, &mbe):
		return d.failWith(w, st, failure{http.StatusRequestEntityTooLarge, reasonBodyTooLarge, d.bodyTooLarge})
	}
	w.Header()["Connection"] = hdrClose
	return d.failWith(w, st, failure{http.StatusBadRequest, reasonBadRequest, "reading the request body: " + err.Error()})
}

var hdrClose = []string{"close"}

func (d *DataPlane) failUpstream(w http.ResponseWriter, st *reqState, err error) int {
	return d.failWith(w, st, d.upstreamError(st, err))
}

// upstreamError maps a failed sandbox exchange to its answer: 504 when the
// function ran out of time, 502 otherwise.
func (d *DataPlane) upstreamError(st *reqState, err error) failure {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !httpx.IsDialError(err) {
		return d.timeoutFailure(st)
	}
	return d.sandboxFailure(st, err)
}

// writeRequest writes r's head and body to c: the path the sandbox sees,
// the client's headers without hop-by-hop ones, X-Forwarded-*, the call id
// and sandbox id (as the ReverseProxy path does).
func (d *DataPlane) writeRequest(c *upConn, r *http.Request, st *reqState, body []byte, buffered bool, cb *clientBody) error {
	bw := c.bw
	c.head = r.Method == http.MethodHead
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	if st.rawRest != "" {
		bw.WriteString(st.rawRest)
	} else {
		writeEscapedPath(bw, st.rest)
	}
	if r.URL.RawQuery != "" {
		bw.WriteByte('?')
		bw.WriteString(r.URL.RawQuery)
	}
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(st.ep.addr)
	bw.WriteString("\r\n")
	// The call and sandbox ids are the data plane's own (writeForwarding).
	remote := httpx.WriteForwardedHeaders(bw, r.Header, r.RemoteAddr, "X-Call-Id", "X-Brisk-Sandbox")
	writeForwarding(bw, remote, r.Host, d.fwdProto, st.ep.id, st.callID[0])
	switch {
	case buffered:
		writeBody(bw, r.Method, body)
	case r.ContentLength > 0: // streamed by streamBody
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(r.ContentLength, 10))
		bw.WriteString("\r\n\r\n")
	default: // length unknown: chunked, bounded by MaxBytesReader (forward)
		bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	}
	return bw.Flush()
}

// streamBody sends the client's body behind the head writeRequest wrote
// (forward runs it beside the reply's reading) and reports on done. When
// the client's body fails (too large, the client gone), it ends the
// reply's reading too: the data plane answers the call itself. When the
// sandbox stops taking the body, the reply it may have sent is still read.
func streamBody(done chan<- error, c *upConn, r *http.Request, cb *clientBody) {
	err := sendBody(c, r, cb)
	if err != nil && cb.err != nil {
		_ = c.nc.SetReadDeadline(longAgo)
	}
	done <- err
}

func sendBody(c *upConn, r *http.Request, cb *clientBody) error {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	return httpx.SendBody(c.bw, r.ContentLength, cb, buf)
}

// writeForwarding ends the head of a request to a sandbox (after any
// X-Forwarded-For values the client sent, already written): the client's
// address, X-Forwarded-Host and -Proto, the sandbox and call ids. Host and
// call id come as strings (the net/http path) or bytes (the front end).
func writeForwarding[S string | []byte](bw *bufio.Writer, remote string, host S, proto, sandbox string, callID S) {
	bw.WriteString(remote)
	bw.WriteString("\r\nX-Forwarded-Host: ")
	bw.Write(append(bw.AvailableBuffer(), host...))
	bw.WriteString("\r\nX-Forwarded-Proto: ")
	bw.WriteString(proto)
	bw.WriteString("\r\nX-Brisk-Sandbox: ")
	bw.WriteString(sandbox)
	bw.WriteString("\r\nX-Call-Id: ")
	bw.Write(append(bw.AvailableBuffer(), callID...))
	bw.WriteString("\r\n")
}

// writeBody ends a request head to a sandbox with a body read in full:
// its length (0 for an empty POST, PUT or PATCH, as net/http sends them)
// and the body.
func writeBody[S text](bw *bufio.Writer, method S, body []byte) {
	switch {
	case len(body) > 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(body)), 10))
		bw.WriteString("\r\n\r\n")
		bw.Write(body)
		return
	case same(method, http.MethodPost), same(method, http.MethodPut), same(method, http.MethodPatch):
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
}

// writeEscapedPath writes an unescaped path in its escaped form, as
// url.URL.EscapedPath would, without allocating for ordinary paths.
func writeEscapedPath(bw *bufio.Writer, p string) {
	for i := 0; i < len(p); i++ {
		if !pathByteOK(p[i]) {
			bw.WriteString((&url.URL{Path: p}).EscapedPath())
			return
		}
	}
	bw.WriteString(p)
}

// pathByteOK: the bytes url.URL.EscapedPath leaves alone in a path.
func pathByteOK(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("-._~/$&+,;=:@", b) >= 0
}

// readHead reads the reply's head (httpx.ReadReply: the front end's
// rules), relaying interim replies to w.
func (c *upConn) readHead(h *httpx.Reply, w http.ResponseWriter) error {
	return httpx.ReadReply(c.br, &c.rbuf, &c.reply, c.head, h, w)
}

// copyBody copies a reply body of n bytes, or up to the connection's close
// when n < 0. It reports whether the whole body arrived and went out.
func (c *upConn) copyBody(cw *httpx.ClientWriter, n int64) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	return httpx.CopyTo(cw, c.br, n, buf)
}

// copyChunked copies a chunked reply body piece by piece (decoded by
// h1.ChunkedReader), then its trailers (declared or not, less hop-by-hop
// ones and the data plane's own) as the client's trailers.
func (c *upConn) copyChunked(cw *httpx.ClientWriter, h http.Header) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	cr := &c.chunks
	cr.Reset(c.br)
	if !httpx.CopyTo(cw, cr, -1, buf) {
		return false
	}
	httpx.CopyTrailers(h, cr)
	return true
}

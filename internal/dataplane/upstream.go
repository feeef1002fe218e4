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
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	// smallReply is the largest reply body the net/http path reads in
	// full before answering (within one copy buffer).
	smallReply  = 32 << 10
	dialTimeout = time.Second
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
	idleAt int64            // monoNow when it was last returned to the pool
	abort  func()           // ends the exchange in flight (watchClient)
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
		if (!probe && monoNow()-c.idleAt < int64(checkIdleAfter)) || c.alive() {
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

// alive peeks at an idle connection without blocking: nothing to read
// means the sandbox still holds it open; end of stream or stray bytes (a
// 408 before closing) mean it is done.
func (c *upConn) alive() bool {
	if c.br.Buffered() > 0 {
		return false
	}
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	if c.nc.SetReadDeadline(time.Time{}) != nil { // an expired deadline would refuse the peek
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, perr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = perr == syscall.EAGAIN
		return true
	})
	return err == nil && alive
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
func (p *connPool) put(c *upConn) {
	c.idleAt = monoNow()
	p.mu.Lock()
	if p.closed || len(p.idle) >= maxIdlePerAddr {
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

// canForward reports whether forward handles r; the rest go through
// httputil.ReverseProxy.
func canForward(r *http.Request) bool {
	_, upgrade := r.Header["Upgrade"]
	return !upgrade && r.Trailer == nil
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
	var resp respHead
	var unwatch func() bool
	var streaming chan error // a streamed body's writer, when one runs
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		c, reused, err = st.ep.conns.take(attempt, !buffered)
		if err != nil {
			d.connectFailed(st, err)
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
		if reused && buffered && !resp.started && closedByPeer(err) && (!sent || idempotent(r)) {
			continue
		}
		return d.failUpstream(w, st, err)
	}

	// A small reply of known length is read in full before its status goes
	// out: when the sandbox dies in the middle of it, the client gets a
	// 502 saying so, not a connection closed on it.
	var small []byte
	if !resp.noBody && !resp.chunked && resp.length > 0 && resp.length <= smallReply {
		sb := copyBufs.Get()
		defer copyBufs.Put(sb)
		small = sb[:resp.length]
		if _, err := io.ReadFull(c.br, small); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
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
	}

	h := w.Header()
	conn := resp.header["Connection"]
	for k, v := range resp.header {
		if !hopByHop(k) && (conn == nil || !listedIn(conn, k)) {
			h[k] = v
		}
	}
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil // a proxy adds no type of its own: no sniffing
	}
	h["X-Call-Id"] = st.callID
	h["X-Brisk-Sandbox"] = st.ep.idHdr
	h["X-Brisk-Timing"] = []string{timing(st.queueNs/1e3, st.cold, (d.nanotime()-st.proxyStart)/1e3)}
	if resp.length < 0 {
		delete(h, "Content-Length")
	}
	st.code = resp.code
	w.WriteHeader(resp.code)

	cw := clientWriter{w: w, flush: resp.length < 0}
	ok := true
	switch {
	case resp.noBody:
	case small != nil:
		_, err := cw.Write(small)
		ok = err == nil
	case resp.chunked:
		ok = c.copyChunked(&cw, h)
	default:
		ok = c.copyBody(&cw, resp.length)
	}
	// A streamed body the function did not read to the end is cut off
	// (the writer's next write fails); the connection then cannot carry
	// another call.
	bodySent := true
	if streaming != nil {
		select {
		case err := <-streaming:
			bodySent = err == nil
		default:
			_ = c.nc.SetWriteDeadline(longAgo)
			<-streaming
			bodySent = false
		}
	}
	// The deadline stays set while the connection idles: every use sets
	// its own. A connection whose deadline the client's leaving moved is
	// not reused.
	if unwatch() && ok && resp.keepAlive && bodySent {
		c.pool.put(c)
	} else {
		c.nc.Close()
	}
	if !ok {
		st.code = http.StatusBadGateway // the sandbox's reply broke off
		if cw.err != nil || ctx.Err() != nil {
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
	longAgo      = time.Unix(1, 0)
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

// clientWriter writes the reply to the client, flushing each piece when
// asked (a reply of unknown length may be a stream), and keeps the client's
// error apart from the sandbox's.
type clientWriter struct {
	w     http.ResponseWriter
	flush bool
	err   error
}

func (cw *clientWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	if err == nil && cw.flush {
		err = http.NewResponseController(cw.w).Flush()
	}
	if err != nil {
		cw.err = err
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

// idempotent: calls http.Transport would send again after a connection
// failure — safe methods, or a client's idempotency key.
func idempotent(r *http.Request) bool {
	if idempotentMethod(r.Method) {
		return true
	}
	_, k1 := r.Header["Idempotency-Key"]
	_, k2 := r.Header["X-Idempotency-Key"]
	return k1 || k2
}

func (d *DataPlane) failUpstream(w http.ResponseWriter, st *reqState, err error) int {
	return d.failWith(w, st, d.upstreamError(st, err))
}

// upstreamError maps a failed sandbox exchange to its answer: 504 when the
// function ran out of time, 502 otherwise.
func (d *DataPlane) upstreamError(st *reqState, err error) failure {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !isDialError(err) {
		return d.timeoutFailure(st)
	}
	return d.sandboxFailure(st, err)
}

func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// closedByPeer: the sandbox closed the connection (EOF, reset, broken pipe).
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
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
	conn := r.Header["Connection"]
	for k, vv := range r.Header {
		switch k {
		case "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Call-Id", "X-Brisk-Sandbox", "Content-Length", "Host":
			continue
		case "Te":
			if listedIn(vv, "trailers") {
				bw.WriteString("Te: trailers\r\n")
			}
			continue
		}
		if hopByHop(k) || (conn != nil && listedIn(conn, k)) {
			continue
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("X-Forwarded-For: ")
	for _, v := range r.Header["X-Forwarded-For"] {
		bw.WriteString(v)
		bw.WriteString(", ")
	}
	remote := r.RemoteAddr
	if host, _, err := net.SplitHostPort(remote); err == nil {
		remote = host
	}
	writeForwarding(bw, remote, r.Host, st.ep.id, st.callID[0])
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
	bw := c.bw
	if r.ContentLength > 0 {
		if _, err := io.CopyN(bw, cb, r.ContentLength); err != nil {
			return err
		}
		return bw.Flush()
	}
	// Each piece goes out as it arrives: a client and a function may talk
	// over one call (a stream up, answers down).
	cw := httputil.NewChunkedWriter(bw)
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	for {
		n, err := cb.Read(buf)
		if n > 0 {
			if _, werr := cw.Write(buf[:n]); werr != nil {
				return werr
			}
			if werr := bw.Flush(); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	bw.WriteString("0\r\n\r\n")
	return bw.Flush()
}

// writeForwarding ends the head of a request to a sandbox (after any
// X-Forwarded-For values the client sent, already written): the client's
// address, X-Forwarded-Host and -Proto, the sandbox and call ids. Host and
// call id come as strings (the net/http path) or bytes (the front end).
func writeForwarding[S string | []byte](bw *bufio.Writer, remote string, host S, sandbox string, callID S) {
	bw.WriteString(remote)
	bw.WriteString("\r\nX-Forwarded-Host: ")
	bw.Write(append(bw.AvailableBuffer(), host...))
	bw.WriteString("\r\nX-Forwarded-Proto: http\r\nX-Brisk-Sandbox: ")
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

// respHead is a parsed reply head.
type respHead struct {
	code      int
	header    textproto.MIMEHeader
	length    int64 // -1: unknown (chunked or until close)
	chunked   bool
	noBody    bool
	keepAlive bool
	started   bool // a byte of the reply arrived
}

// readHead reads the reply's status line and headers (h1.ReadHead,
// h1.ParseReplyHead: the front end's rules). Interim replies (103 Early
// Hints, 102 Processing) are passed on to the client w as they come; a 100
// Continue is not (the client's own came from the server).
func (c *upConn) readHead(h *respHead, w http.ResponseWriter) error {
	*h = respHead{}
	p := &c.reply
	for {
		var err error
		var started bool
		c.rbuf, started, err = h1.ReadHead(c.br, c.rbuf[:0])
		h.started = h.started || started
		if err != nil {
			return err
		}
		if err := h1.ParseReplyHead(c.rbuf, p); err != nil {
			return err
		}
		code := p.Code
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			if code != http.StatusContinue && w != nil {
				relayInterim(w, code, headerMap(c.rbuf, p.Hdrs))
			}
			continue // the final reply follows
		}
		h.code, h.header, h.length = code, headerMap(c.rbuf, p.Hdrs), p.Length
		h.keepAlive = p.KeepAlive
		switch {
		case code == http.StatusSwitchingProtocols:
			return errors.New("sandbox switched protocols on a call that did not ask to")
		case c.head, code == http.StatusNoContent, code == http.StatusNotModified:
			h.noBody, h.length = true, 0
		case p.Chunked:
			h.chunked = true
		case p.Length < 0:
			h.keepAlive = false // read until close
		}
		if cap(c.rbuf) > 16<<10 {
			c.rbuf = nil // a large head: do not keep its buffer with an idle connection
		}
		return nil
	}
}

// headerMap makes the header map of a parsed head: names canonical,
// values substrings of one copy of the head, one backing array for them
// (as textproto.Reader.ReadMIMEHeader does).
func headerMap(b []byte, hdrs []h1.Header) textproto.MIMEHeader {
	m := make(textproto.MIMEHeader, len(hdrs))
	if len(hdrs) == 0 {
		return m
	}
	s := string(b)
	strs := make([]string, len(hdrs))
	for _, x := range hdrs {
		k := s[x.NS:x.NE]
		if !canonicalKey(k) {
			k = textproto.CanonicalMIMEHeaderKey(k)
		}
		v := s[x.VS:x.VE]
		if vv := m[k]; vv != nil {
			m[k] = append(vv, v)
			continue
		}
		strs[0] = v
		m[k], strs = strs[:1:1], strs[1:]
	}
	return m
}

// canonicalKey reports whether k is in canonical form already (upper
// case after a hyphen or at the start, lower case elsewhere).
func canonicalKey(k string) bool {
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return false
		}
		upper = c == '-'
	}
	return true
}

// relayInterim sends one interim reply with its own headers; net/http
// writes a 1xx at once and leaves the header map for the final reply, so
// it is emptied again.
func relayInterim(w http.ResponseWriter, code int, hdr textproto.MIMEHeader) {
	h := w.Header()
	for k, v := range hdr {
		if !hopByHop(k) {
			h[k] = v
		}
	}
	w.WriteHeader(code)
	clear(h)
}

// copyBody copies a reply body of n bytes, or up to the connection's close
// when n < 0. It reports whether the whole body arrived and went out.
func (c *upConn) copyBody(cw *clientWriter, n int64) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	return copyTo(cw, c.br, n, buf)
}

// copyChunked copies a chunked reply body piece by piece (decoded by
// h1.ChunkedReader), then its trailers (declared or not, less hop-by-hop
// ones and the data plane's own) as the client's trailers.
func (c *upConn) copyChunked(cw *clientWriter, h http.Header) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	cr := &c.chunks
	cr.Reset(c.br)
	if !copyTo(cw, cr, -1, buf) {
		return false
	}
	for _, x := range cr.TrailerHdrs {
		if x.Kind == h1.Fwd {
			k := http.TrailerPrefix + textproto.CanonicalMIMEHeaderKey(string(x.Name(cr.Trailer)))
			h[k] = append(h[k], string(x.Value(cr.Trailer)))
		}
	}
	return true
}

// copyTo copies n bytes of src (all of it when n < 0) to cw. It is io.Copy
// without the interface conversion of cw, which would move it to the heap
// on every call.
func copyTo(cw *clientWriter, src io.Reader, n int64, buf []byte) bool {
	for n != 0 {
		p := buf
		if n > 0 && int64(len(p)) > n {
			p = p[:n]
		}
		k, err := src.Read(p)
		if k > 0 {
			if _, werr := cw.Write(p[:k]); werr != nil {
				return false
			}
			if n > 0 {
				n -= int64(k)
			}
		}
		if err == io.EOF {
			return n <= 0
		}
		if err != nil {
			return false
		}
	}
	return true
}

// hopByHop reports the headers that belong to one connection, not to the
// call (RFC 9110 section 7.6.1).
func hopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// listedIn reports whether comma-separated header values (Connection, Te)
// name k.
func listedIn(conn []string, k string) bool {
	for _, v := range conn {
		for f := range h1.Tokens(v) {
			if strings.EqualFold(f, k) {
				return true
			}
		}
	}
	return false
}

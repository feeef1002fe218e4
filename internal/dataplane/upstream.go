package dataplane

import (
	"bufio"
	"errors"
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

	"github.com/brisk-faas/brisk/internal/httpx"
)

// The warm path's upstream client. httputil.ReverseProxy over
// http.Transport hands every call to two goroutines per connection through
// channels, allocates a cancel context per call and clones the request and
// its headers; that made the data plane cost as much CPU per call as the
// load generator and the sandbox together (docs/benchmarks.md). forward
// instead writes the request and reads the reply on the handler's own
// goroutine over a keep-alive connection of the sandbox's own pool, with the
// function timeout as the connection's deadline. Requests it does not handle
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
	nc   net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	tp   textproto.Reader
	pool *connPool
	head bool // the call in flight is a HEAD: its reply has no body
}

func newConnPool(addr string) *connPool { return &connPool{addr: addr} }

// get returns an idle connection (reused) or dials one.
func (p *connPool) get() (c *upConn, reused bool, err error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return c, true, nil
	}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, false, errPoolClosed
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
	c.tp.R = c.br
	return c, nil
}

// put returns a connection whose last exchange completed cleanly.
func (p *connPool) put(c *upConn) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= maxIdlePerAddr {
		p.mu.Unlock()
		c.nc.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
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

// upstreamError is a failed call before any reply byte reached the client.
type upstreamError struct {
	code int
	msg  string
}

var copyBufs httpx.BufferPool

// forward sends r to st.ep and copies the reply to w. It returns the status
// the client got.
func (d *DataPlane) forward(w http.ResponseWriter, r *http.Request, st *reqState) int {
	// A small body is read first: the call can then be replayed on a fresh
	// connection if a reused one was closed by the sandbox meanwhile (an
	// idle timeout in the function's server, a crash).
	var body []byte
	replayable := true
	if r.ContentLength > 0 && r.ContentLength <= replayableBody {
		buf := copyBufs.Get()
		defer copyBufs.Put(buf)
		if int(r.ContentLength) <= len(buf) {
			body = buf[:r.ContentLength]
		} else {
			body = make([]byte, r.ContentLength)
		}
		if _, err := io.ReadFull(r.Body, body); err != nil {
			st.code = statusClientGone
			return st.code
		}
	} else if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		replayable = false
	}

	deadline := time.Now().Add(st.conf.timeout)
	var c *upConn
	var resp respHead
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		if attempt == 0 {
			c, reused, err = st.ep.conns.get()
		} else {
			c, err = st.ep.conns.dial()
		}
		if err != nil {
			return d.failUpstream(w, st, err)
		}
		st.proxyStart = d.nanotime()
		_ = c.nc.SetDeadline(deadline)
		err = d.writeRequest(c, r, st, body, replayable)
		if err == nil {
			err = c.readHead(&resp)
		}
		if err == nil {
			break
		}
		c.nc.Close()
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return d.failWith(w, st, http.StatusRequestEntityTooLarge, d.bodyTooLarge)
		}
		if reused && replayable && !resp.started && closedByPeer(err) {
			continue // a stale keep-alive connection: once more on a new one
		}
		return d.failUpstream(w, st, err)
	}

	h := w.Header()
	for k, v := range resp.header {
		if !hopByHop(k) {
			h[k] = v
		}
	}
	h["X-Call-Id"] = st.callID
	h["X-Brisk-Sandbox"] = st.ep.idHdr
	h["X-Brisk-Timing"] = []string{timing(st.queueNs/1e3, st.cold, (d.nanotime()-st.proxyStart)/1e3)}
	if resp.length < 0 {
		delete(h, "Content-Length")
	}
	st.code = resp.code
	w.WriteHeader(resp.code)

	ok := true
	switch {
	case resp.noBody:
	case resp.chunked:
		ok = c.copyChunked(w, h)
	default:
		ok = c.copyBody(w, resp.length)
	}
	// The deadline stays set while the connection idles: every use sets
	// its own.
	if ok && resp.keepAlive {
		c.pool.put(c)
	} else {
		c.nc.Close()
	}
	if !ok {
		// The reply was cut off after its status went out: abort the
		// client's connection so that it sees a truncated reply as one.
		panic(http.ErrAbortHandler)
	}
	return st.code
}

func (d *DataPlane) failUpstream(w http.ResponseWriter, st *reqState, err error) int {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !isDialError(err) {
		return d.failWith(w, st, http.StatusGatewayTimeout, "function \""+st.fn.name+"\" timed out after "+st.conf.timeout.String())
	}
	d.log.Debug("upstream error", "function", st.fn.name, "sandbox", st.ep.id, "err", err)
	return d.failWith(w, st, http.StatusBadGateway, "function \""+st.fn.name+"\": sandbox "+st.ep.id+" at "+st.ep.addr+": "+err.Error())
}

func (d *DataPlane) failWith(w http.ResponseWriter, st *reqState, code int, msg string) int {
	st.code = code
	writeError(w, st.callID, code, msg)
	return code
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
func (d *DataPlane) writeRequest(c *upConn, r *http.Request, st *reqState, body []byte, buffered bool) error {
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
			if containsFold(vv, "trailers") {
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
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		bw.WriteString(host)
	} else {
		bw.WriteString(r.RemoteAddr)
	}
	bw.WriteString("\r\nX-Forwarded-Host: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\nX-Forwarded-Proto: http\r\nX-Brisk-Sandbox: ")
	bw.WriteString(st.ep.id)
	bw.WriteString("\r\nX-Call-Id: ")
	bw.WriteString(st.callID[0])
	bw.WriteString("\r\n")
	switch {
	case buffered && len(body) > 0:
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.Itoa(len(body)))
		bw.WriteString("\r\n\r\n")
		bw.Write(body)
	case buffered:
		if r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch {
			bw.WriteString("Content-Length: 0\r\n")
		}
		bw.WriteString("\r\n")
	case r.ContentLength > 0:
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(r.ContentLength, 10))
		bw.WriteString("\r\n\r\n")
		if _, err := io.CopyN(bw, r.Body, r.ContentLength); err != nil {
			return err
		}
	default: // length unknown: chunked, bounded by MaxBytesReader (invoke)
		bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		cw := httputil.NewChunkedWriter(bw)
		buf := copyBufs.Get()
		_, err := io.CopyBuffer(cw, r.Body, buf)
		copyBufs.Put(buf)
		if err != nil {
			return err
		}
		bw.WriteString("0\r\n\r\n")
	}
	return bw.Flush()
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

// readHead reads the reply's status line and headers, skipping 1xx
// interim replies.
func (c *upConn) readHead(h *respHead) error {
	*h = respHead{}
	for {
		line, err := c.br.ReadSlice('\n')
		if len(line) > 0 {
			h.started = true
		}
		if err != nil {
			if err == bufio.ErrBufferFull {
				return errors.New("malformed reply: status line too long")
			}
			return err
		}
		if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
			return errors.New("malformed reply status line")
		}
		code, err := strconv.Atoi(string(line[9:12]))
		if err != nil || code < 100 || code > 999 {
			return errors.New("malformed reply status code")
		}
		http10 := line[7] == '0'
		hdr, err := c.tp.ReadMIMEHeader()
		if err != nil {
			return err
		}
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			continue // 100 Continue, 103 Early Hints: the final reply follows
		}
		h.code, h.header, h.length = code, hdr, -1
		h.keepAlive = !http10 && !connectionClose(hdr["Connection"])
		switch {
		case code == http.StatusSwitchingProtocols:
			return errors.New("sandbox switched protocols on a call that did not ask to")
		case c.head, code == http.StatusNoContent, code == http.StatusNotModified:
			h.noBody, h.length = true, 0
		case len(hdr["Transfer-Encoding"]) > 0:
			if !strings.EqualFold(hdr["Transfer-Encoding"][len(hdr["Transfer-Encoding"])-1], "chunked") {
				h.keepAlive = false // read until close
			} else {
				h.chunked = true
			}
		default:
			if cl := hdr["Content-Length"]; len(cl) > 0 {
				n, err := strconv.ParseInt(strings.TrimSpace(cl[0]), 10, 64)
				if err != nil || n < 0 {
					return errors.New("malformed reply Content-Length")
				}
				h.length = n
			} else {
				h.keepAlive = false // read until close
			}
		}
		return nil
	}
}

// copyBody copies a reply body of n bytes, or up to the connection's close
// when n < 0, flushing each piece of a body of unknown length so that
// streamed replies stream. It reports whether the whole body arrived and
// went out.
func (c *upConn) copyBody(w http.ResponseWriter, n int64) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	if n >= 0 {
		got, err := io.CopyBuffer(w, io.LimitReader(c.br, n), buf)
		return err == nil && got == n
	}
	_, err := io.CopyBuffer(flushWriter{w}, c.br, buf)
	return err == nil
}

// copyChunked copies a chunked reply body piece by piece, then its
// trailers (declared or not) as the client's trailers.
func (c *upConn) copyChunked(w http.ResponseWriter, h http.Header) bool {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	if _, err := io.CopyBuffer(flushWriter{w}, httputil.NewChunkedReader(c.br), buf); err != nil {
		return false
	}
	trailer, err := c.tp.ReadMIMEHeader()
	if err != nil {
		return false
	}
	for k, v := range trailer {
		h[http.TrailerPrefix+k] = v
	}
	return true
}

// flushWriter flushes after every write: a reply of unknown length may be
// a stream whose pieces the client waits for.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = http.NewResponseController(f.w).Flush()
	}
	return n, err
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

// listedIn reports whether the Connection header values name k.
func listedIn(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), k) {
				return true
			}
		}
	}
	return false
}

func connectionClose(conn []string) bool { return listedIn(conn, "close") }

func containsFold(vv []string, s string) bool {
	for _, v := range vv {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), s) {
				return true
			}
		}
	}
	return false
}

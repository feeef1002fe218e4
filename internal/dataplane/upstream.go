package dataplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/proxy"
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
	// idleTimeout: the reaper closes connections idle longer.
	idleTimeout = 90 * time.Second
)

// connPool is the upstream connections to one sandbox address
// (DataPlane.refPools says why per address) and the published endpoints
// at it.
type connPool struct {
	*proxy.Pool
	refs int // guarded by DataPlane.applyMu
}

// upConn is one connection to a sandbox.
type upConn = proxy.Conn

func newConnPool(addr string) *connPool {
	return &connPool{Pool: proxy.NewPool(addr, maxIdlePerAddr, upstreamBufSize)}
}

var copyBufs proxy.BufferPool

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
	var resp proxy.Reply
	var unwatch func() bool
	var streaming chan error // a streamed body's writer, when one runs
	reroutes := 0
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		c, reused, err = st.ep.conns.Take(ctx, attempt, !buffered)
		if err != nil {
			d.connectFailed(st, err)
			if d.reroute(ctx, st, err, &reroutes) {
				attempt = -1
				continue
			}
			return d.failUpstream(w, st, err)
		}
		st.proxyStart = d.nanotime()
		_ = c.NC.SetDeadline(deadline)
		unwatch = c.Watch(ctx)
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
			err = c.ReadHead(&resp, w)
		}
		if err == nil {
			st.firstByte = d.nanotime()
			d.prom.firstByte.Observe(seconds(st.firstByte - st.proxyStart))
			break
		}
		unwatch()
		c.NC.Close()
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
		if reused && buffered && !resp.Started && proxy.ClosedByPeer(err) && (!sent || proxy.Idempotent(r)) {
			continue
		}
		return d.failUpstream(w, st, err)
	}

	// A small reply of known length is read in full before its status goes
	// out: when the sandbox dies in the middle of it, the client gets a
	// 502 saying so, not a connection closed on it.
	sb := copyBufs.Get()
	defer copyBufs.Put(sb)
	small, err := proxy.ReadSmallBody(c.BR, &resp, sb)
	if err != nil {
		unwatch()
		c.NC.Close()
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
		if !proxy.HopByHop(k) && (conn == nil || !proxy.ListedIn(conn, k)) {
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

	cw := proxy.ClientWriter{W: w, Flush: resp.Length < 0}
	ok := true
	switch {
	case resp.NoBody:
	case small != nil:
		_, err := cw.Write(small)
		ok = err == nil
	case resp.Chunked:
		ok = c.CopyChunked(&cw, h)
	default:
		ok = c.CopyBody(&cw, resp.Length)
	}
	// A streamed body the function did not read to the end is cut off
	// (the writer's next write fails); the connection then cannot carry
	// another call.
	bodySent := proxy.AwaitBodySent(streaming, c.NC)
	// The deadline stays set while the connection idles: every use sets
	// its own. A connection whose deadline the client's leaving moved is
	// not reused.
	if unwatch() && ok && resp.KeepAlive && bodySent {
		c.Put(resp.NoBody)
	} else {
		c.NC.Close()
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

var longAgo = proxy.LongAgo

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
	if errors.As(err, &ne) && ne.Timeout() && !proxy.IsDialError(err) {
		return d.timeoutFailure(st)
	}
	return d.sandboxFailure(st, err)
}

// writeRequest writes r's head and body to c: the path the sandbox sees,
// the client's headers without hop-by-hop ones, X-Forwarded-*, the call id
// and sandbox id (as the ReverseProxy path does).
func (d *DataPlane) writeRequest(c *upConn, r *http.Request, st *reqState, body []byte, buffered bool, cb *clientBody) error {
	bw := c.BW
	c.Head = r.Method == http.MethodHead
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
	remote := proxy.WriteForwardedHeaders(bw, r.Header, r.RemoteAddr, "X-Call-Id", "X-Brisk-Sandbox")
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
		_ = c.NC.SetReadDeadline(longAgo)
	}
	done <- err
}

func sendBody(c *upConn, r *http.Request, cb *clientBody) error {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	return proxy.SendBody(c.BW, r.ContentLength, cb, buf)
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

package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/proxy"
)

// The net/http path's hop to a sandbox, over internal/proxy (its package
// doc says why not httputil.ReverseProxy): forward writes the request and
// reads the reply on the handler's own goroutine over a keep-alive
// connection from the pool of the sandbox's address, with the function
// timeout as the connection's deadline. Requests proxy does not relay
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

// forward sends r to st.ep and copies the reply to w (proxy.Call: the
// upstream hop the gateway takes too). It returns the status counted for
// the call.
func (d *DataPlane) forward(w http.ResponseWriter, r *http.Request, st *reqState, rb *reqBody) int {
	if strings.ContainsAny(st.rawRest, " \r\n") || strings.ContainsAny(r.URL.RawQuery, " \r\n") {
		return d.failWith(w, st, failure{http.StatusBadRequest, reasonBadRequest, "invalid characters in the request path or query"})
	}
	// The body was read before the call (readBody): in full, so that the
	// call can be sent again on a fresh connection if a reused one was
	// closed by the sandbox meanwhile; or its rest streams.
	sc := &sandboxCall{d: d, st: st, body: rb.data, deadline: time.Now().Add(st.conf.timeout)}
	sc.Req, sc.Buffered = r, rb.rest == nil
	switch {
	case !sc.Buffered:
		sc.Stream = &proxy.ClientBody{R: io.MultiReader(bytes.NewReader(rb.data), rb.rest)}
	case len(rb.data) > replayableBody:
		// A large body goes out beside the reply's reading, as a streamed
		// one does: a function may answer before it has read it all (its
		// own 413), and that answer must reach the client.
		sc.Buffered = false
		sc.Stream = &proxy.ClientBody{R: bytes.NewReader(rb.data)}
	}
	ctx := r.Context()
	if err := sc.Send(ctx, w, sc); err != nil {
		var be *proxy.BodyError
		var te *proxy.TakeError
		switch {
		case errors.As(err, &be):
			return d.failBody(w, r, st, be.Err)
		case ctx.Err() != nil: // the client left (a dial it cancelled too): nothing to answer
			st.code = statusClientGone
			return st.code
		case errors.As(err, &te):
			return d.failUpstream(w, st, te.Err)
		}
		return d.failUpstream(w, st, err)
	}
	st.firstByte = d.nanotime()
	d.prom.firstByte.Observe(seconds(st.firstByte - st.proxyStart))

	sb := copyBufs.Get()
	defer copyBufs.Put(sb)
	small, err := sc.ReadSmall(ctx, sb)
	if err != nil {
		if ctx.Err() != nil {
			st.code = statusClientGone
			return st.code
		}
		return d.failWith(w, st, d.sandboxFailure(st, err))
	}
	h := w.Header()
	sc.CopyHeader(h)
	h["X-Call-Id"] = st.callID
	h["X-Brisk-Sandbox"] = st.ep.idHdr
	h["X-Brisk-Timing"] = []string{timing(st.queueNs/1e3, st.cold, (d.nanotime()-st.proxyStart)/1e3)}
	h["X-Start-Time"] = []string{strconv.FormatInt(d.epochNs+st.arrival, 10)}
	st.code = sc.Reply.Code
	w.WriteHeader(sc.Reply.Code)
	if ok, clientGone := sc.Finish(ctx, w, h, small); !ok {
		st.code = http.StatusBadGateway // the sandbox's reply broke off
		if clientGone {
			st.code = statusClientGone
		}
		// The status already went out: abort the client's connection so
		// that a truncated reply shows as one.
		panic(http.ErrAbortHandler)
	}
	return st.code
}

// sandboxCall is a call's trip to its sandbox (proxy.Upstream): Take
// reroutes past sandboxes that cannot be reached, WriteRequest writes what
// the sandbox sees.
type sandboxCall struct {
	proxy.Call
	d        *DataPlane
	st       *reqState
	body     []byte
	deadline time.Time
	reroutes int
}

func (sc *sandboxCall) Take(ctx context.Context, attempt int, probe bool) (*upConn, bool, error) {
	d, st := sc.d, sc.st
	for {
		c, reused, err := st.ep.conns.Take(ctx, attempt, probe)
		if err != nil && ctx.Err() != nil {
			return nil, false, err // the client left during the dial: not the sandbox's failure
		}
		if err != nil {
			d.connectFailed(st, err)
			if d.reroute(ctx, st, err, &sc.reroutes) {
				attempt = 0
				continue
			}
			return nil, false, err
		}
		st.proxyStart = d.nanotime()
		_ = c.NC.SetDeadline(sc.deadline)
		return c, reused, nil
	}
}

func (sc *sandboxCall) WriteRequest(c *upConn) error {
	return sc.d.writeRequest(c, sc.Req, sc.st, sc.body, sc.Buffered)
}

var longAgo = proxy.LongAgo

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
	if st.waitErr != nil { // its sandbox withdrawn, it waited for another in vain
		return d.acquireError(st.waitErr, st.fn, st.conf)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !proxy.IsDialError(err) {
		return d.timeoutFailure(st)
	}
	return d.sandboxFailure(st, err)
}

// writeRequest writes r's head and body to c: the path the sandbox sees,
// the client's headers without hop-by-hop ones, X-Forwarded-*, the call id
// and sandbox id (as the ReverseProxy path does).
func (d *DataPlane) writeRequest(c *upConn, r *http.Request, st *reqState, body []byte, buffered bool) error {
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

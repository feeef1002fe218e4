package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/brisk-faas/brisk/internal/h1"
	"github.com/brisk-faas/brisk/internal/httpx"
)

// The gateway's upstream client, as the data plane's to its sandboxes
// (internal/dataplane/upstream.go): the handler's own goroutine writes the
// request and reads the reply over a keep-alive connection from the data
// plane's pool, with h1 reading the reply, where http.Transport would hand
// each call to two goroutines per connection and clone the request.
// Requests it does not handle (httpx.Relayable) take httputil.ReverseProxy.

const (
	// maxIdlePerDataPlane bounds the idle connections to one data plane:
	// a few data planes take every request, so keep every connection a
	// burst opens; re-dialling at each burst is what stalled the data
	// plane's own proxy (docs/benchmarks.md, warm calls).
	maxIdlePerDataPlane = 1024
	// idleConnTimeout: the reaper closes connections idle longer.
	idleConnTimeout = 90 * time.Second
	// replayableBody is the largest request body read in full before the
	// call (one copy buffer), so that it can be sent again on a fresh
	// connection when a reused one turns out closed by the data plane.
	replayableBody  = 32 << 10
	upstreamBufSize = 8 << 10
)

// checkIdleAfter: a connection idle longer is probed before reuse; busier
// ones are not, which saves a system call per call. A variable for tests.
var checkIdleAfter = 500 * time.Millisecond

var copyBufs httpx.BufferPool

// connPool holds the idle keep-alive connections to one data plane.
type connPool struct {
	addr string
	mu   sync.Mutex
	idle []*upConn // oldest first
}

type upConn struct {
	nc     net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	pool   *connPool
	rbuf   []byte           // the reply head ReadReply read
	reply  h1.ReplyHead     // its parse
	chunks h1.ChunkedReader // a chunked reply's decoder
	idleAt time.Time
	abort  func() // ends the exchange in flight: the client left
	// suspect: the last reply had no body (HEAD, 204, 304): probe before
	// reuse, in case bytes followed it.
	suspect bool
}

var dialer = net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}

// take returns a connection for an attempt: for the first a pooled one
// (probed first when it idled past checkIdleAfter or when probe is set: the
// call could not be sent again) or a new one; for a replay always a new
// one, which cannot be another connection the data plane closed.
func (p *connPool) take(ctx context.Context, attempt int, probe bool) (c *upConn, reused bool, err error) {
	for attempt == 0 {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c = p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if (!probe && !c.suspect && time.Since(c.idleAt) < checkIdleAfter) || (c.br.Buffered() == 0 && httpx.PeekAlive(c.nc)) {
			c.suspect = false
			return c, true, nil
		}
		c.nc.Close()
	}
	nc, err := dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, false, err
	}
	c = &upConn{nc: nc, br: bufio.NewReaderSize(nc, upstreamBufSize), bw: bufio.NewWriterSize(nc, upstreamBufSize), pool: p}
	c.abort = func() { _ = nc.SetDeadline(longAgo) } // made once, not per call
	return c, false, nil
}

// put returns a connection whose last exchange completed cleanly;
// bodiless says its reply had no body. A connection holding bytes past the
// reply's end is closed: the next call would read them as its answer.
func (p *connPool) put(c *upConn, bodiless bool) {
	c.idleAt, c.suspect = time.Now(), bodiless
	p.mu.Lock()
	if len(p.idle) >= maxIdlePerDataPlane || c.br.Buffered() > 0 {
		p.mu.Unlock()
		c.nc.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// prune closes the connections idle since before cutoff (a prefix: the
// stack is oldest first), or all of them for the zero time.
func (p *connPool) prune(cutoff time.Time) {
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && (cutoff.IsZero() || p.idle[n].idleAt.Before(cutoff)) {
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

// reapIdle closes connections idle past idleConnTimeout until ctx ends.
func (g *Gateway) reapIdle(ctx context.Context) {
	t := time.NewTicker(idleConnTimeout / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cutoff := time.Now().Add(-idleConnTimeout)
		for _, b := range g.dps {
			b.conns.prune(cutoff)
		}
	}
}

var longAgo = httpx.LongAgo

// clientBody reads the client's request body and keeps its error apart
// from the data plane connection's.
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

// relay sends r to st.dp, failing over to the function's next data plane
// while no connection can be made, and copies the reply to w.
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, st *reqState) {
	target := r.RequestURI
	if !strings.HasPrefix(target, "/") { // absolute form, or h2c's :path
		target = r.URL.RequestURI()
	}
	if strings.ContainsAny(target, " \r\n") {
		st.code = http.StatusBadRequest
		writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonBadRequest, "invalid characters in the request target")
		return
	}
	// A body of known length up to one buffer is read first, so that the
	// call can be sent again if a pooled connection turns out closed; a
	// larger or chunked one streams beside the reply's reading.
	var body []byte
	buffered := true
	cb := &clientBody{r: r.Body}
	if n := r.ContentLength; n > 0 && n <= replayableBody {
		buf := copyBufs.Get()
		defer copyBufs.Put(buf)
		body = buf[:n]
		if _, err := io.ReadFull(cb, body); err != nil {
			g.failBody(w, r, st, err)
			return
		}
	} else if n != 0 {
		buffered = false
	}

	ctx := r.Context()
	var c *upConn
	var resp httpx.Reply
	var unwatch func() bool
	var streaming chan error // a streamed body's writer, when one runs
	var tried []bool
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		c, reused, err = st.dp.conns.take(ctx, attempt, !buffered)
		if err != nil {
			if ctx.Err() != nil {
				st.code = statusClientGone
				return
			}
			if !httpx.IsDialError(err) {
				g.failUpstream(w, r, st, err)
				return
			}
			// Nothing of the request has left the gateway: mark the data
			// plane down and send it to the function's next one.
			st.dp.connFail.Inc()
			g.setUp(st.dp, false, err)
			if tried == nil {
				tried = make([]bool, len(g.dps))
			}
			tried[st.dp.idx] = true
			next := g.pick(st.name, tried)
			if next == nil {
				st.dp, st.code = nil, http.StatusServiceUnavailable
				writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonNoDataPlane, errNoDataPlane.Error())
				return
			}
			g.log.Debug("failing over", "function", st.name, "from", st.dp.addr, "to", next.addr, "err", err)
			st.dp, attempt = next, -1
			continue
		}
		unwatch = context.AfterFunc(ctx, c.abort)
		err = writeRequest(c.bw, r, target, body, buffered)
		sent := err == nil
		if sent && !buffered {
			// A function may answer before it has read the whole body
			// (its own 413), or stream its answer as it reads.
			_ = http.NewResponseController(w).EnableFullDuplex()
			streaming = make(chan error, 1)
			go streamBody(streaming, c, r.ContentLength, cb)
		}
		if sent {
			err = httpx.ReadReply(c.br, &c.rbuf, &c.reply, r.Method == http.MethodHead, &resp, w)
		}
		if err == nil {
			break
		}
		unwatch()
		c.nc.Close()
		if streaming != nil {
			<-streaming // the closed connection ends its writes
		}
		if cb.err != nil { // the client's body failed, not the data plane
			g.failBody(w, r, st, cb.err)
			return
		}
		if ctx.Err() != nil { // the client left: nothing to answer, nothing to retry
			st.code = statusClientGone
			return
		}
		// A reused connection the data plane had closed: the call goes
		// once more on a new one, if it can be sent again and either did
		// not reach the data plane whole or may run twice (http.Transport's
		// rule).
		if reused && buffered && !resp.Started && httpx.ClosedByPeer(err) && (!sent || httpx.Idempotent(r)) {
			continue
		}
		g.failUpstream(w, r, st, err)
		return
	}

	// A small reply of known length is read in full before its status goes
	// out: when the data plane's connection breaks in the middle of it, the
	// client gets a 502 saying so, not a connection closed on it.
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
			return
		}
		g.failUpstream(w, r, st, fmt.Errorf("reply broken off: %w", err))
		return
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
	h["X-Brisk-Dataplane"] = st.dp.hdr
	if resp.Length < 0 {
		delete(h, "Content-Length")
	}
	st.code = resp.Code
	w.WriteHeader(resp.Code)

	cw := httpx.ClientWriter{W: w, Flush: resp.Length < 0}
	ok := true
	switch {
	case small != nil:
		_, err := cw.Write(small)
		ok = err == nil
	case !resp.NoBody:
		buf := copyBufs.Get()
		if resp.Chunked {
			c.chunks.Reset(c.br)
			if ok = httpx.CopyTo(&cw, &c.chunks, -1, buf); ok {
				httpx.CopyTrailers(h, &c.chunks)
			}
		} else {
			ok = httpx.CopyTo(&cw, c.br, resp.Length, buf)
		}
		copyBufs.Put(buf)
	}
	// A streamed body the data plane did not read to the end is cut off
	// (the writer's next write fails); the connection then cannot carry
	// another call.
	bodySent := httpx.AwaitBodySent(streaming, c.nc)
	// A connection whose deadline the client's leaving moved is not reused.
	if unwatch() && ok && resp.KeepAlive && bodySent {
		c.pool.put(c, resp.NoBody)
	} else {
		c.nc.Close()
	}
	if !ok {
		st.code = http.StatusBadGateway // the data plane's reply broke off
		if cw.Err != nil || ctx.Err() != nil {
			st.code = statusClientGone
		}
		// The status already went out: abort the client's connection so
		// that a truncated reply shows as one.
		panic(http.ErrAbortHandler)
	}
}

// failUpstream answers a call whose exchange with its data plane failed.
func (g *Gateway) failUpstream(w http.ResponseWriter, r *http.Request, st *reqState, err error) {
	st.code = http.StatusBadGateway
	g.log.Debug("data plane error", "dataplane", st.dp.addr, "function", st.name, "err", err)
	writeError(w, r.Header["X-Call-Id"], st.dp.hdr, st.code, reasonDataPlaneFailed, fmt.Sprintf("function %q: data plane %s: %v", st.name, st.dp.addr, err))
}

// failBody answers a call whose request body could not be read: the
// client gone (nothing to answer), too large (413) or malformed (400). Its
// framing is lost, so the answer closes the connection.
func (g *Gateway) failBody(w http.ResponseWriter, r *http.Request, st *reqState, err error) {
	if r.Context().Err() != nil {
		st.code = statusClientGone
		return
	}
	w.Header()["Connection"] = hdrClose
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		st.code = http.StatusRequestEntityTooLarge
		writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonBodyTooLarge, err.Error())
		return
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF // shorter than its Content-Length
	}
	st.code = http.StatusBadRequest
	writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonBadRequest, "reading the request body: "+err.Error())
}

// writeRequest writes r's head, and its body when buffered, to bw: method,
// target and Host as the client sent them, the client's headers less
// hop-by-hop ones, X-Forwarded-For appended to, X-Forwarded-Host and
// -Proto (what httputil.ProxyRequest.SetXForwarded sets).
func writeRequest(bw *bufio.Writer, r *http.Request, target string, body []byte, buffered bool) error {
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	remote := httpx.WriteForwardedHeaders(bw, r.Header, r.RemoteAddr)
	bw.WriteString(remote)
	bw.WriteString("\r\nX-Forwarded-Host: ")
	bw.WriteString(r.Host)
	if r.TLS != nil {
		bw.WriteString("\r\nX-Forwarded-Proto: https\r\n")
	} else {
		bw.WriteString("\r\nX-Forwarded-Proto: http\r\n")
	}
	switch {
	case !buffered && r.ContentLength > 0: // streamed by streamBody
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(r.ContentLength, 10))
		bw.WriteString("\r\n\r\n")
	case !buffered: // length unknown: chunked
		bw.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	case len(body) > 0:
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.Itoa(len(body)))
		bw.WriteString("\r\n\r\n")
		bw.Write(body)
	case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
		bw.WriteString("Content-Length: 0\r\n\r\n") // as net/http sends them
	default:
		bw.WriteString("\r\n")
	}
	return bw.Flush()
}

// streamBody sends the client's body behind the head writeRequest wrote
// (relay runs it beside the reply's reading) and reports on done. When the
// client's body fails it ends the reply's reading too: the gateway answers
// the call itself. When the data plane stops taking the body, the reply it
// may have sent is still read.
func streamBody(done chan<- error, c *upConn, n int64, cb *clientBody) {
	buf := copyBufs.Get()
	err := httpx.SendBody(c.bw, n, cb, buf)
	copyBufs.Put(buf)
	if err != nil && cb.err != nil {
		_ = c.nc.SetReadDeadline(longAgo)
	}
	done <- err
}

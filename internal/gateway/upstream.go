package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/proxy"
)

// The gateway's upstream client, as the data plane's to its sandboxes
// (internal/dataplane/upstream.go): the handler's own goroutine writes the
// request and reads the reply over a keep-alive connection from the data
// plane's pool, with h1 reading the reply, where http.Transport would hand
// each call to two goroutines per connection and clone the request.
// Requests it does not handle (proxy.Relayable) take httputil.ReverseProxy.

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
		cutoff := proxy.MonoNow() - int64(idleConnTimeout)
		for _, b := range g.dps {
			b.conns.Prune(cutoff)
		}
	}
}

var (
	longAgo  = proxy.LongAgo
	copyBufs proxy.BufferPool
)

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
	var c *proxy.Conn
	var resp proxy.Reply
	var unwatch func() bool
	var streaming chan error // a streamed body's writer, when one runs
	var tried []bool
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		c, reused, err = st.dp.conns.Take(ctx, attempt, !buffered)
		if err != nil {
			if ctx.Err() != nil {
				st.code = statusClientGone
				return
			}
			if !proxy.IsDialError(err) {
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
		unwatch = c.Watch(ctx)
		c.Head = r.Method == http.MethodHead
		err = writeRequest(c.BW, r, target, body, buffered)
		sent := err == nil
		if sent && !buffered {
			// A function may answer before it has read the whole body
			// (its own 413), or stream its answer as it reads.
			_ = http.NewResponseController(w).EnableFullDuplex()
			streaming = make(chan error, 1)
			go streamBody(streaming, c, r.ContentLength, cb)
		}
		if sent {
			err = c.ReadHead(&resp, w)
		}
		if err == nil {
			break
		}
		unwatch()
		c.NC.Close()
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
		if reused && buffered && !resp.Started && proxy.ClosedByPeer(err) && (!sent || proxy.Idempotent(r)) {
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
	small, err := proxy.ReadSmallBody(c.BR, &resp, sb)
	if err != nil {
		unwatch()
		c.NC.Close()
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
		if !proxy.HopByHop(k) && (conn == nil || !proxy.ListedIn(conn, k)) {
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

	cw := proxy.ClientWriter{W: w, Flush: resp.Length < 0}
	ok := true
	switch {
	case small != nil:
		_, err := cw.Write(small)
		ok = err == nil
	case resp.NoBody:
	case resp.Chunked:
		ok = c.CopyChunked(&cw, h)
	default:
		ok = c.CopyBody(&cw, resp.Length)
	}
	// A streamed body the data plane did not read to the end is cut off
	// (the writer's next write fails); the connection then cannot carry
	// another call.
	bodySent := proxy.AwaitBodySent(streaming, c.NC)
	// A connection whose deadline the client's leaving moved is not reused.
	if unwatch() && ok && resp.KeepAlive && bodySent {
		c.Put(resp.NoBody)
	} else {
		c.NC.Close()
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
	remote := proxy.WriteForwardedHeaders(bw, r.Header, r.RemoteAddr)
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
func streamBody(done chan<- error, c *proxy.Conn, n int64, cb *clientBody) {
	buf := copyBufs.Get()
	err := proxy.SendBody(c.BW, n, cb, buf)
	copyBufs.Put(buf)
	if err != nil && cb.err != nil {
		_ = c.NC.SetReadDeadline(longAgo)
	}
	done <- err
}

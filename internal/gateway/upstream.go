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

// The gateway's upstream hop is internal/proxy's, the one the data plane
// takes to its sandboxes: the handler's own goroutine writes the request
// and reads the reply over a keep-alive connection from the data plane's
// pool, with h1 reading the reply, where http.Transport would hand each
// call to two goroutines per connection and clone the request. Requests it
// does not handle (proxy.Relayable) take httputil.ReverseProxy.

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
	pools := make([]*proxy.Pool, len(g.dps))
	for i, b := range g.dps {
		pools[i] = b.conns
	}
	proxy.Reap(ctx, idleConnTimeout, func() []*proxy.Pool { return pools })
}

var (
	longAgo  = proxy.LongAgo
	copyBufs proxy.BufferPool
)

// relay sends r to st.dp, failing over to the function's next data plane
// while no connection can be made, and copies the reply to w (proxy.Call:
// the upstream hop the data plane takes to its sandboxes too).
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
	gc := &gatewayCall{g: g, st: st, target: target}
	gc.Req, gc.Buffered = r, true
	if n := r.ContentLength; n > 0 && n <= replayableBody {
		buf := copyBufs.Get()
		defer copyBufs.Put(buf)
		gc.body = buf[:n]
		if _, err := io.ReadFull(r.Body, gc.body); err != nil {
			g.failBody(w, r, st, err)
			return
		}
	} else if n != 0 {
		gc.Buffered = false
		gc.Stream = &proxy.ClientBody{R: r.Body}
	}

	ctx := r.Context()
	if err := gc.Send(ctx, w, gc); err != nil {
		var be *proxy.BodyError
		var te *proxy.TakeError
		switch {
		case ctx.Err() != nil: // the client left: nothing to answer, nothing to retry
			st.code = statusClientGone
		case errors.As(err, &be):
			g.failBody(w, r, st, be.Err)
		case errors.Is(err, errNoDataPlane):
			st.dp, st.code = nil, http.StatusServiceUnavailable
			writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonNoDataPlane, errNoDataPlane.Error())
		case errors.As(err, &te):
			g.failUpstream(w, r, st, te.Err)
		default:
			g.failUpstream(w, r, st, err)
		}
		return
	}

	sb := copyBufs.Get()
	defer copyBufs.Put(sb)
	small, err := gc.ReadSmall(ctx, sb)
	if err != nil {
		if ctx.Err() != nil {
			st.code = statusClientGone
			return
		}
		g.failUpstream(w, r, st, err)
		return
	}
	h := w.Header()
	gc.CopyHeader(h)
	h["X-Brisk-Dataplane"] = st.dp.hdr
	st.code = gc.Reply.Code
	w.WriteHeader(gc.Reply.Code)
	if ok, clientGone := gc.Finish(ctx, w, h, small); !ok {
		st.code = http.StatusBadGateway // the data plane's reply broke off
		if clientGone {
			st.code = statusClientGone
		}
		// The status already went out: abort the client's connection so
		// that a truncated reply shows as one.
		panic(http.ErrAbortHandler)
	}
}

// gatewayCall is a call's trip to its data plane (proxy.Upstream): Take
// fails over to the function's next data plane while none can be
// connected to, WriteRequest writes the client's request as it came.
type gatewayCall struct {
	proxy.Call
	g      *Gateway
	st     *reqState
	target string
	body   []byte
	tried  []bool
}

func (gc *gatewayCall) Take(ctx context.Context, attempt int, probe bool) (*proxy.Conn, bool, error) {
	g, st := gc.g, gc.st
	for {
		c, reused, err := st.dp.conns.Take(ctx, attempt, probe)
		if err == nil || ctx.Err() != nil || !proxy.IsDialError(err) {
			return c, reused, err
		}
		// Nothing of the request has left the gateway: mark the data
		// plane down and send it to the function's next one.
		st.dp.connFail.Inc()
		g.setUp(st.dp, false, err)
		if gc.tried == nil {
			gc.tried = make([]bool, len(g.dps))
		}
		gc.tried[st.dp.idx] = true
		next := g.pick(st.name, gc.tried)
		if next == nil {
			return nil, false, errNoDataPlane
		}
		g.log.Debug("failing over", "function", st.name, "from", st.dp.addr, "to", next.addr, "err", err)
		st.dp, attempt = next, 0
	}
}

func (gc *gatewayCall) WriteRequest(c *proxy.Conn) error {
	c.Head = gc.Req.Method == http.MethodHead
	return writeRequest(c.BW, gc.Req, gc.target, gc.body, gc.Buffered)
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

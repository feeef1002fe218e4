package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/proxy"
)

// Shared header values; cap 1, so an Add by anyone copies instead of writing
// through.
var (
	hdrJSON    = []string{"application/json"}
	hdrNoSniff = []string{"nosniff"}
	hdrText    = []string{"text/plain; charset=utf-8"}
	hdrClose   = []string{"close"}
)

// Reason codes of the gateway's own errors (X-Brisk-Error, the JSON body's
// "reason"), as the data plane gives its own.
const (
	reasonNoDataPlane     = "no-dataplane"
	reasonDataPlaneFailed = "dataplane-failed"
	reasonBadRequest      = "bad-request"
	reasonBodyTooLarge    = "body-too-large"
	reasonNoFunction      = "no-function"
)

// statusClientGone counts requests whose client left before an answer
// (nginx's convention); nothing is written for them.
const statusClientGone = 499

var errNoDataPlane = errors.New("no data plane available")

// reqState carries one request through relay or httputil.ReverseProxy. It
// is the request's context itself (for the latter), which saves a
// context.WithValue per request.
type reqState struct {
	context.Context
	name string
	dp   *backend // where the request is going; changes on failover
	code int
	body resendBody
}

type stateKey struct{}

func (s *reqState) Value(key any) any {
	if key == (stateKey{}) {
		return s
	}
	return s.Context.Value(key)
}

func stateOf(ctx context.Context) *reqState {
	if s, ok := ctx.(*reqState); ok {
		return s
	}
	s, _ := ctx.Value(stateKey{}).(*reqState)
	return s
}

// forward proxies r to the data plane that name hashes to.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, name string) {
	dp := g.pick(name, nil)
	if dp == nil {
		writeError(w, r.Header["X-Call-Id"], nil, http.StatusServiceUnavailable, reasonNoDataPlane, errNoDataPlane.Error())
		g.none.Get(http.StatusServiceUnavailable).Inc()
		return
	}
	if r.TransferEncoding != nil {
		// As the data plane does: a chunked request may also have carried a
		// Content-Length (net/http drops it); closing after the reply leaves
		// no bytes after the last chunk to be read as another request
		// (RFC 9112 §6.1).
		w.Header()["Connection"] = hdrClose
	}
	st := &reqState{Context: r.Context(), name: name, dp: dp}
	defer g.finish(st)
	if proxy.Relayable(r) {
		g.relay(w, r, st)
		return
	}
	g.proxy.ServeHTTP(w, r.WithContext(st))
}

// finish counts the request, also when the proxy panics with
// http.ErrAbortHandler after a failed body copy.
func (g *Gateway) finish(st *reqState) {
	code := st.code
	if code == 0 {
		code = http.StatusBadGateway
	}
	if st.dp == nil {
		g.none.Get(code).Inc()
		return
	}
	st.dp.requests.Get(code).Inc()
}

func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	st := stateOf(pr.In.Context())
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = st.dp.addr
	// Path, query and Host stay as the client sent them: the data plane
	// routes by them exactly as if it had been called directly.
	pr.Out.Host = pr.In.Host
	// Append to a front end's X-Forwarded-For rather than replace it.
	if prior, ok := pr.In.Header["X-Forwarded-For"]; ok {
		pr.Out.Header["X-Forwarded-For"] = prior
	}
	pr.SetXForwarded()
	if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
		st.body.rc = pr.Out.Body
		pr.Out.Body = &st.body
		// Lets http.Transport itself resend the body on a fresh connection
		// when a pooled one turns out dead before anything was written.
		pr.Out.GetBody = st.body.again
	}
}

func (g *Gateway) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	st.code = resp.StatusCode
	resp.Header["X-Brisk-Dataplane"] = st.dp.hdr
	return nil
}

func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	switch {
	case errors.Is(err, errNoDataPlane):
		st.dp, st.code = nil, http.StatusServiceUnavailable
		writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonNoDataPlane, errNoDataPlane.Error())
	case st.Context.Err() != nil:
		st.code = statusClientGone
	case st.body.err != nil:
		// The client's body failed (malformed chunking, too large), not the
		// data plane. Its framing is lost: close after the answer.
		w.Header()["Connection"] = hdrClose
		var mbe *http.MaxBytesError
		if errors.As(st.body.err, &mbe) {
			st.code = http.StatusRequestEntityTooLarge
			writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonBodyTooLarge, st.body.err.Error())
			return
		}
		st.code = http.StatusBadRequest
		writeError(w, r.Header["X-Call-Id"], nil, st.code, reasonBadRequest, "reading the request body: "+st.body.err.Error())
	default:
		st.code = http.StatusBadGateway
		g.log.Debug("data plane error", "dataplane", st.dp.addr, "function", st.name, "err", err)
		writeError(w, r.Header["X-Call-Id"], st.dp.hdr, st.code, reasonDataPlaneFailed, fmt.Sprintf("function %q: data plane %s: %v", st.name, st.dp.addr, err))
	}
}

// retryTransport sends a request to its data plane, and when the connection
// cannot even be made, marks that data plane down and sends the request to
// the next one in the function's rendezvous order. Nothing of the request
// has left the gateway then, so the retry is safe for any method.
type retryTransport struct{ g *Gateway }

func (t retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateOf(req.Context())
	var tried []bool
	for {
		resp, err := t.g.transport.RoundTrip(req)
		if err == nil || !proxy.IsDialError(err) || req.Context().Err() != nil || st.body.wasRead() {
			return resp, err
		}
		st.dp.connFail.Inc()
		t.g.setUp(st.dp, false, err)
		if tried == nil {
			tried = make([]bool, len(t.g.dps))
		}
		tried[st.dp.idx] = true
		next := t.g.pick(st.name, tried)
		if next == nil {
			return nil, errNoDataPlane
		}
		t.g.log.Debug("failing over", "function", st.name, "from", st.dp.addr, "to", next.addr, "err", err)
		st.dp = next
		// A shallow copy with its own URL: the transport may still hold
		// the previous request.
		r2 := new(http.Request)
		*r2 = *req
		u := *req.URL
		u.Host = next.addr
		r2.URL = &u
		req = r2
	}
}

// resendBody lets a request body survive a failed connection attempt.
// http.Transport closes the body when RoundTrip fails, and closing a server
// request body discards it; as long as nothing has been read, the close is
// withheld (the server closes the body when the handler returns) and the
// same body can go to the next data plane.
type resendBody struct {
	rc   io.ReadCloser
	read atomic.Bool
	err  error // the client's read error, if any (not io.EOF)
}

func (b *resendBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (b *resendBody) Close() error {
	if b.read.Load() {
		return b.rc.Close()
	}
	return nil
}

func (b *resendBody) wasRead() bool { return b.read.Load() }

var errBodyConsumed = errors.New("gateway: request body already partly sent; cannot resend")

// again is the request's GetBody: the same body, while none of it is gone.
func (b *resendBody) again() (io.ReadCloser, error) {
	if b.read.Load() {
		return nil, errBodyConsumed
	}
	return b, nil
}

type errorBody struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
}

// writeError writes every gateway-generated error as the data plane does:
// JSON with a clear message and a reason code, the reason in X-Brisk-Error.
func writeError(w http.ResponseWriter, callID, dataplane []string, code int, reason, msg string) {
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h["X-Content-Type-Options"] = hdrNoSniff
	if callID != nil {
		h["X-Call-Id"] = callID
	}
	if dataplane != nil {
		h["X-Brisk-Dataplane"] = dataplane
	}
	h["X-Brisk-Error"] = []string{reason}
	b, _ := json.Marshal(errorBody{msg, reason})
	h["Content-Length"] = []string{strconv.Itoa(len(b) + 1)}
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// newTransport is the ReverseProxy's upstream transport (protocol upgrades,
// requests with trailers): pooled keep-alive connections to the data planes, no compression (bodies pass through untouched), fast
// dial failure so that failover is fast. No response-header timeout:
// functions may run for up to an hour, and the data plane enforces their
// timeouts.
func newTransport() *http.Transport {
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:               nil, // never an HTTP_PROXY from the environment
		DialContext:         dialer.DialContext,
		MaxIdleConns:        0, // no total limit; per host below
		MaxIdleConnsPerHost: maxIdlePerDataPlane,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		WriteBufferSize:     8 << 10,
		ReadBufferSize:      8 << 10,
	}
}

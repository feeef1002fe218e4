package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/naming"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/pkg/spec"
)

const functionPrefix = naming.FunctionPrefix

// deadlineSlack is added to queue timeout + function timeout when a request
// needs a write deadline beyond Config.WriteTimeout.
const deadlineSlack = 10 * time.Second

var errFunctionTimeout = errors.New("function timeout")

// Shared header values; cap 1, so an Add by anyone copies instead of writing
// through.
var (
	hdrJSON    = []string{"application/json"}
	hdrNoSniff = []string{"nosniff"}
	hdrText    = []string{"text/plain; charset=utf-8"}
	hdrBearer  = []string{`Bearer realm="brisk"`}
)

// route is where a request goes: fn is nil when no function matched.
type route struct {
	fn      *function
	name    string // the function named by the request, if any
	host2   string // by Host: its first two labels (lookupHost)
	byPath  bool   // named by /function/NAME (the Host is not consulted)
	rest    string // path the sandbox sees
	rawRest string // its escaped form when it differs from the default (url.URL.RawPath)
	async   bool   // an attempt of an asynchronous call (async.go): token checked at submit, low priority
	checked bool   // the caller checked the token already (the Lambda API's SigV4: lambda.go)
}

// resolve maps a request to a function without allocating: OpenFaaS-style
// /function/NAME[.NAMESPACE][/rest] first (lookupNamed), then the Host
// (lookupHost; Knative: NAME.namespace.example.com, NAME:8080).
func (d *DataPlane) resolve(r *http.Request) route {
	p := r.URL.Path
	if strings.HasPrefix(p, functionPrefix) {
		rt := prefixRoute(r, functionPrefix)
		rt.fn = d.lookupNamed(rt.name)
		return rt
	}
	first, two := naming.HostLabels(r.Host)
	rt := route{name: first, host2: two, rest: p, rawRest: r.URL.RawPath}
	rt.fn = d.lookupHost(first, two)
	return rt
}

// prefixRoute splits a /PREFIX/NAME[.NAMESPACE][/rest] path.
func prefixRoute(r *http.Request, prefix string) route {
	tail := r.URL.Path[len(prefix):]
	seg, rest := tail, "/"
	if i := strings.IndexByte(tail, '/'); i >= 0 {
		seg, rest = tail[:i], tail[i:]
	}
	rt := route{name: seg, rest: rest, byPath: true}
	if raw := r.URL.RawPath; raw != "" {
		if pre := len(prefix) + len(seg); strings.HasPrefix(raw, prefix+seg) {
			// Allocates only for paths with unusual escaping.
			rt.rawRest = raw[pre:]
			if rt.rawRest == "" {
				rt.rawRest = "/"
			}
		}
	}
	return rt
}

func (d *DataPlane) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TransferEncoding != nil {
		// A chunked request may also have carried a Content-Length (net/http
		// drops it): a front proxy framing by that length would take the
		// bytes after the last chunk for part of this request, this server
		// for the next one. Closing after the reply leaves nothing for
		// either to misread (RFC 9112 §6.1).
		w.Header()["Connection"] = hdrClose
	}
	if d.serveAsyncRoute(w, r) || d.lambda.Serve(w, r) {
		return
	}
	rt := d.resolve(r)
	if rt.fn != nil {
		if _, ok := r.Header["Prefer"]; ok && preferAsync(r.Header) {
			d.submitAsync(w, r, rt)
			return
		}
		if d.cfg.Tracer != nil {
			d.invokeTraced(w, r, rt)
			return
		}
		d.invoke(w, r, rt)
		return
	}
	callID := r.Header["X-Call-Id"] // echoed if given; none is generated for a call that never happens
	if !rt.byPath {
		switch r.URL.Path {
		case "/healthz":
			w.Header()["Content-Type"] = hdrText
			if d.cfg.ControlPlane != "" && !d.synced.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("waiting for the control plane's first endpoint snapshot\n"))
				return
			}
			_, _ = w.Write([]byte("ok\n"))
			return
		case "/metrics":
			if d.prom.handler != nil {
				// Function names and traffic: for the cluster's admins
				// (Prometheus sends a bearer token) while auth is on.
				if d.authOn.Load() {
					tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
					if err := auth.Check(d.tokens, tok, auth.ScopeAdmin, "", ""); err != nil {
						f := fail(http.StatusUnauthorized, reasonUnauthorized, "/metrics: %v (an admin token)", err)
						if errors.Is(err, auth.ErrForbidden) {
							f.code, f.why = http.StatusForbidden, reasonForbidden
						}
						d.writeError(w, callID, f)
						return
					}
				}
				d.prom.handler.ServeHTTP(w, r)
				return
			}
		}
		if r.URL.Path == callsPath || strings.HasPrefix(r.URL.Path, callsPath+"/") {
			d.serveCalls(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/system/") {
			if d.cfg.System == nil {
				d.writeError(w, callID, fail(http.StatusNotImplemented, reasonBadRequest, "the OpenFaaS management API (/system/...) is not enabled on this data plane (brisk dataplane --admin-url)"))
				return
			}
			d.cfg.System.ServeHTTP(w, r)
			return
		}
		if !naming.NamesFunction(rt.name) {
			d.writeError(w, callID, failure{http.StatusNotFound, reasonNoFunction, "no function named in the request: call /function/NAME/... or send a Host header whose first label is the function name"})
			return
		}
	}
	if rt.byPath {
		if f := d.foreignName(r, rt.name); f.code != 0 {
			d.writeError(w, callID, f)
			return
		}
	}
	if fn := d.awaitRoute(r.Context(), rt); fn != nil {
		rt.fn = fn
		if _, ok := r.Header["Prefer"]; ok && preferAsync(r.Header) {
			d.submitAsync(w, r, rt)
			return
		}
		if d.cfg.Tracer != nil {
			d.invokeTraced(w, r, rt)
			return
		}
		d.invoke(w, r, rt)
		return
	}
	d.writeError(w, callID, d.unknownFunction(r, rt.name))
}

// unknownFunctionGrace is how long a call for a function this data plane
// does not know waits for the control plane to send it: a function
// registered a moment ago reaches the data planes a few milliseconds after
// the registration is acknowledged, and a client that deploys and then calls
// at once must not get a 404 for that.
const unknownFunctionGrace = time.Second

// awaitRoute is awaitFunction for the function a route names, by path
// (lookupNamed) or by Host (lookupHost).
func (d *DataPlane) awaitRoute(ctx context.Context, rt route) *function {
	if rt.byPath || rt.host2 == "" {
		return d.awaitFunction(ctx, rt.name)
	}
	return d.await(ctx, rt.name, func() *function { return d.lookupHost(rt.name, rt.host2) })
}

// awaitFunction waits up to unknownFunctionGrace for the function name to
// appear in the routing table (data planes following a control plane only).
func (d *DataPlane) awaitFunction(ctx context.Context, name string) *function {
	return d.await(ctx, name, func() *function { return d.lookupNamed(name) })
}

// await waits up to unknownFunctionGrace for find to find the function
// name (data planes following a control plane only).
func (d *DataPlane) await(ctx context.Context, name string, find func() *function) *function {
	if d.cfg.ControlPlane == "" || name == "" || spec.IsRevisionFunction(name) {
		return nil
	}
	d.prom.unknownWaits.Inc()
	t := time.NewTimer(unknownFunctionGrace)
	defer t.Stop()
	d.awaiting.Add(1)
	defer d.awaiting.Add(-1)
	for {
		ch := d.applied.Load()
		if fn := find(); fn != nil {
			return fn
		}
		select {
		case <-*ch:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// reqState carries one invocation through httputil.ReverseProxy. It is the
// request's context itself (embedding the timeout context), which saves the
// context.WithValue allocation per request.
type reqState struct {
	context.Context
	fn         *function
	ep         *endpoint
	conf       *fnConf
	rest       string
	rawRest    string
	callID     []string // the X-Call-Id value, shared by request and response headers
	arrival    int64
	queueNs    int64
	proxyStart int64
	firstByte  int64 // the sandbox's reply head arrived (nanotime)
	cold       bool
	code       int
	keepAuth   bool // the Authorization header goes on to the function
	low        bool // an asynchronous call (async.go): it queues behind synchronous ones
	// slotGone: a reroute gave ep's slot back before waiting for another
	// sandbox and found none (finish must not give it back again);
	// waitErr is why it found none, the call's answer.
	slotGone bool
	waitErr  error
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

// invoke runs one request for rt.fn: limits, queue, proxy, accounting.
func (d *DataPlane) invoke(w http.ResponseWriter, r *http.Request, rt route) {
	callID := r.Header["X-Call-Id"]
	if len(callID) == 0 || callID[0] == "" {
		callID = []string{newCallID()}
	} else if len(callID) > 1 {
		callID = callID[:1:1]
	}
	if r.ContentLength > d.cfg.MaxBodyBytes {
		d.writeError(w, callID, failure{http.StatusRequestEntityTooLarge, reasonBodyTooLarge, d.bodyTooLarge})
		rt.fn.m.used.Store(true)
		rt.fn.m.codes.inc(http.StatusRequestEntityTooLarge)
		return
	}
	set := rt.fn.set.Load()
	f, keepAuth := authorize(d, rt.fn, set.Conf, r.Header.Get("Authorization"))
	if rt.async || rt.checked {
		f, keepAuth = failure{}, true // checked already, and dropped then unless public
	}
	if f.code != 0 {
		rt.fn.m.used.Store(true)
		rt.fn.m.codes.inc(f.code)
		d.writeError(w, callID, f)
		return
	}
	if !keepAuth {
		delete(r.Header, "Authorization") // the platform's token stays with the platform
	}
	named := rt.fn
	if sp := set.Conf.split; sp != nil {
		// Authorized as the function the caller named; served by the
		// revision the split picks, under that revision's settings.
		if t := d.splitTarget(rt.fn, sp); t != rt.fn {
			rt.fn, set = t, t.set.Load()
		}
	}
	if set.Conf.extendDeadline {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(set.Conf.queueTimeout + set.Conf.timeout + deadlineSlack))
	}
	st := &reqState{
		Context: r.Context(),
		fn:      rt.fn,
		rest:    rt.rest,
		rawRest: rt.rawRest,
		callID:  callID,
		low:     rt.async,
	}
	// The body comes first: a slow client must not hold a sandbox slot
	// (body.go). Upgrades stream both ways and are left alone.
	var rb reqBody
	defer d.release(&rb)
	_, upgrade := r.Header["Upgrade"]
	if !upgrade {
		if err := d.readBody(w, r, &rb, set.Conf.streamRequests); err != nil {
			rt.fn.m.used.Store(true)
			rt.fn.m.codes.inc(d.failBody(w, r, st, err))
			return
		}
		for k := range r.Trailer {
			if !httpguts.ValidTrailerHeader(k) {
				// A client's error, not the sandbox's: net/http would
				// refuse to send it on.
				rt.fn.m.used.Store(true)
				rt.fn.m.codes.inc(d.failWith(w, st, fail(http.StatusBadRequest, reasonBadRequest, "request trailer %q is not allowed in a trailer", k)))
				return
			}
		}
	}
	// Dual mode: a call that finds no free sandbox takes the emergency
	// track when a worker offers one (emergency.go).
	var pre *endpoint
	if set.Conf.dual && !rt.async && !upgrade && rb.rest == nil && len(rb.data) <= maxEmergencyBody {
		rt.fn.iats().observe(time.Now())
		if ep, ok := rt.fn.tryAcquire(set); ok {
			pre = ep
		} else if d.em.any() && d.emergency(w, r, st, set.Conf, rb.data) {
			return
		}
	}
	f = d.admit(r.Context(), st, set, pre)
	if f.why == reasonFunctionDeleted && named != rt.fn {
		// The split ended while the call waited for its revision: the
		// function the caller named serves it.
		rt.fn, set, st.fn = named, named.set.Load(), named
		f = d.admit(r.Context(), st, set, nil)
	}
	if f.code != 0 {
		if f.code != statusClientGone {
			d.writeError(w, callID, f)
		}
		return
	}
	if proxy.Relayable(r) {
		defer d.finish(st, nil)
		d.forward(w, r, st, &rb)
		return
	}
	switch {
	case upgrade:
	case rb.rest != nil:
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(rb.data), rb.rest))
	default:
		r.Body = io.NopCloser(bytes.NewReader(rb.data))
	}
	// Upgrades and request trailers: httputil.ReverseProxy, with the
	// function timeout as a context deadline.
	ctx, cancel := context.WithTimeoutCause(r.Context(), set.Conf.timeout, errFunctionTimeout)
	st.Context = ctx
	defer d.finish(st, cancel)
	d.proxy.ServeHTTP(w, r.WithContext(st))
}

// admit starts a call of st.fn: it counts the arrival and reserves a slot
// on one of set's sandboxes (pre, when the caller reserved one already),
// queueing while none is free, and fills st.
// A call that gets no slot is accounted for here and admit returns the
// failure to answer with (statusClientGone: answer nothing). Once admitted,
// the call ends with finish.
func (d *DataPlane) admit(ctx context.Context, st *reqState, set *epSet, pre *endpoint) failure {
	fn := st.fn
	fn.m.used.Store(true)
	arrival := d.nanotime()
	seq := d.epSeq.Load() // endpoints added later than this are cold for us
	st.conf, st.arrival = set.Conf, arrival
	if fn.stats.arrive(arrival) {
		d.noteActive(fn)
	}
	ep, waited, err := pre, false, error(nil)
	if ep == nil {
		ep, waited, err = fn.acquire(ctx, set, d.markUrgent, st.low)
	}
	acquired := arrival
	if waited {
		acquired = d.nanotime()
		d.prom.queueWait.Observe(seconds(acquired - arrival))
	}
	if err != nil {
		fn.stats.depart(acquired)
		f := d.acquireError(err, fn, set.Conf)
		fn.m.codes.inc(f.code)
		fn.m.duration.observe(acquired - arrival)
		if d.cfg.Tracer != nil {
			d.traceCall(st, f.code, acquired)
		}
		return f
	}
	st.ep, st.queueNs, st.cold = ep, acquired-arrival, ep.seq > seq
	if st.cold {
		fn.m.cold.Add(1)
	}
	fn.m.inflight.Add(1)
	return failure{}
}

// finish runs when the proxy returns or panics (http.ErrAbortHandler after a
// failed body copy): the slot must always come back.
func (d *DataPlane) finish(st *reqState, cancel context.CancelFunc) {
	if cancel != nil {
		cancel()
	}
	st.fn.m.inflight.Add(-1)
	if !st.slotGone {
		st.fn.release(st.ep)
	}
	end := d.nanotime()
	st.fn.stats.depart(end)
	code := st.code
	if code == 0 {
		code = http.StatusBadGateway
	}
	st.fn.m.codes.inc(code)
	st.fn.m.duration.observe(end - st.arrival)
	if d.cfg.Tracer != nil {
		d.traceCall(st, code, end)
	}
}

// statusClientGone counts requests whose client left before an answer
// (nginx's convention); nothing is written for them.
const statusClientGone = 499

// acquireError explains a call that got no sandbox slot. While the control
// plane reports why the function has no sandboxes (no node with room, starts
// failing), that is the reason given.
func (d *DataPlane) acquireError(err error, fn *function, conf *fnConf) failure {
	var f failure
	switch {
	case errors.Is(err, errQueueFull):
		f = fail(http.StatusServiceUnavailable, reasonQueueFull, "function %q: queue full (%d requests waiting for a sandbox)", fn.name, conf.queueDepth)
	case errors.Is(err, errQueueTimeout):
		f = fail(http.StatusGatewayTimeout, reasonQueueTimeout, "function %q: timed out after %s waiting for a sandbox", fn.name, conf.queueTimeout)
	case errors.Is(err, errFunctionDeleted):
		return fail(http.StatusNotFound, reasonFunctionDeleted, "function %q was deleted", fn.name)
	case errors.Is(err, errFunctionFailing):
		f = fail(http.StatusServiceUnavailable, reasonFunctionFailing, "function %q cannot start a sandbox", fn.name)
	case errors.Is(err, errNoRoom):
		f = fail(http.StatusServiceUnavailable, reasonNoCapacity, "function %q: no room for a sandbox", fn.name)
	default: // the client's context ended
		return failure{statusClientGone, reasonNone, err.Error()}
	}
	if c := fn.cond.Load(); c != nil && c.why != reasonNone {
		f.why = c.why
		f.msg += ": " + c.msg
	}
	return f
}

func (d *DataPlane) rewrite(pr *httputil.ProxyRequest) {
	st := stateOf(pr.In.Context())
	u := pr.Out.URL
	u.Scheme = "http"
	u.Host = st.ep.addr
	u.Path = st.rest
	u.RawPath = st.rawRest
	pr.Out.Host = ""
	// Append to the front end's X-Forwarded-For rather than replace it.
	if prior, ok := pr.In.Header["X-Forwarded-For"]; ok {
		pr.Out.Header["X-Forwarded-For"] = prior
	}
	pr.SetXForwarded()
	pr.Out.Header.Set("X-Forwarded-Proto", d.fwdProto) // handed-off TLS connections are not *tls.Conn
	pr.Out.Header["X-Brisk-Sandbox"] = st.ep.idHdr
	pr.Out.Header["X-Call-Id"] = st.callID
	st.proxyStart = d.nanotime()
}

func (d *DataPlane) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	now := d.nanotime()
	st.firstByte = now
	d.prom.firstByte.Observe(seconds(now - st.proxyStart))
	st.code = resp.StatusCode
	h := resp.Header
	h["X-Call-Id"] = st.callID
	h["X-Brisk-Sandbox"] = st.ep.idHdr
	h["X-Brisk-Timing"] = []string{timing(st.queueNs/1e3, st.cold, (now-st.proxyStart)/1e3)}
	h["X-Start-Time"] = []string{strconv.FormatInt(d.epochNs+st.arrival, 10)}
	return nil
}

func (d *DataPlane) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	st := stateOf(r.Context())
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		d.failWith(w, st, failure{http.StatusRequestEntityTooLarge, reasonBodyTooLarge, d.bodyTooLarge})
	case context.Cause(st.Context) == errFunctionTimeout:
		d.failTimeout(w, st)
	case st.Context.Err() != nil:
		st.code = statusClientGone
	default:
		d.failSandbox(w, st, err)
	}
}

// failTimeout answers a call whose function ran past its timeout (504).
func (d *DataPlane) failTimeout(w http.ResponseWriter, st *reqState) int {
	return d.failWith(w, st, d.timeoutFailure(st))
}

func (d *DataPlane) timeoutFailure(st *reqState) failure {
	return fail(http.StatusGatewayTimeout, reasonFunctionTimeout, "function %q timed out after %s", st.fn.name, st.conf.timeout)
}

// failSandbox answers a call whose sandbox failed it (502).
func (d *DataPlane) failSandbox(w http.ResponseWriter, st *reqState, err error) int {
	return d.failWith(w, st, d.sandboxFailure(st, err))
}

func (d *DataPlane) sandboxFailure(st *reqState, err error) failure {
	d.log.Debug("upstream error", "function", st.fn.name, "sandbox", st.ep.id, "err", err)
	return fail(http.StatusBadGateway, reasonSandboxFailed, "function %q: sandbox %s at %s: %v", st.fn.name, st.ep.id, st.ep.addr, err)
}

func (d *DataPlane) failWith(w http.ResponseWriter, st *reqState, f failure) int {
	st.code = f.code
	d.writeError(w, st.callID, f)
	return f.code
}

// writeError writes every brisk-generated error on the net/http path: JSON
// with a clear message and its reason, the reason in X-Brisk-Error too.
func (d *DataPlane) writeError(w http.ResponseWriter, callID []string, f failure) {
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h["X-Content-Type-Options"] = hdrNoSniff
	if callID != nil {
		h["X-Call-Id"] = callID
	}
	if f.why != reasonNone {
		h["X-Brisk-Error"] = hdrReason[f.why]
	}
	if f.code == http.StatusUnauthorized {
		h["Www-Authenticate"] = hdrBearer
	}
	b := errorJSON(f)
	h["Content-Length"] = []string{strconv.Itoa(len(b))}
	d.prom.errors.inc(f.why)
	w.WriteHeader(f.code)
	_, _ = w.Write(b)
}

// errorJSON is the body of a brisk-generated error, with its newline.
func errorJSON(f failure) []byte {
	b, _ := json.Marshal(errorBody{Error: f.msg, Reason: f.why.String()})
	return append(b, '\n')
}

// newCallID returns 16 random bytes in hex.
func newCallID() string {
	var b [32]byte
	writeCallID(&b)
	return string(b[:])
}

// writeCallID fills b with a new call id: 16 random bytes in hex. Call ids
// need uniqueness, not secrecy, so the runtime's per-thread generator is
// enough.
func writeCallID(b *[32]byte) {
	const digits = "0123456789abcdef"
	for half := 0; half < 2; half++ {
		v := rand.Uint64()
		for i := 0; i < 16; i++ {
			b[half*16+i] = digits[v&0xf]
			v >>= 4
		}
	}
}

func timing(queueUs int64, cold bool, proxyUs int64) string {
	var b [96]byte
	return string(appendTiming(b[:0], queueUs, cold, proxyUs))
}

// appendTiming appends the X-Brisk-Timing value.
func appendTiming(buf []byte, queueUs int64, cold bool, proxyUs int64) []byte {
	buf = append(buf, "queue_us="...)
	buf = strconv.AppendInt(buf, queueUs, 10)
	buf = append(buf, ", cold="...)
	buf = strconv.AppendBool(buf, cold)
	buf = append(buf, ", proxy_us="...)
	return strconv.AppendInt(buf, proxyUs, 10)
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// newTransport is the one upstream transport: pooled keep-alive connections
// to sandboxes, no compression (bodies pass through untouched), fast dial
// failure. Response-header timeouts are per function, so they come from the
// request context instead of the shared transport.
func newTransport() *http.Transport {
	dialer := &net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: dialer.DialContext,
		// Keep every connection a burst opened: closing the excess after a
		// burst and dialling again at the next one turned a load spike into
		// thousands of dials and TIME_WAIT sockets, a feedback loop that
		// stalled the proxy (docs/benchmarks.md, warm calls). Many sandboxes
		// can share one host:port (the emulated runtime), so the limit is
		// per data plane rather than per sandbox; small buffers keep an idle
		// connection cheap.
		MaxIdleConns:        8192,
		MaxIdleConnsPerHost: 8192,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		WriteBufferSize:     8 << 10,
		ReadBufferSize:      8 << 10,
	}
}

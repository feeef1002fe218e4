package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/naming"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Asynchronous calls (internal/async): the data plane accepts them
// (POST /async-function/NAME[/rest], or any call with Prefer:
// respond-async), answers 202 once JetStream has stored them, and runs
// them, as a consumer of the shared queue, through the same invoke path
// as synchronous calls — queue, load balancing, autoscaling metrics —
// with lower priority in each function's queue. /v1/calls serves their
// status, retry and purge.

const (
	asyncPrefix = naming.AsyncPrefix
	callsPath   = "/v1/calls"
)

// preferAsync reports whether a Prefer header asks for respond-async
// (RFC 7240).
func preferAsync(h http.Header) bool {
	for _, v := range h["Prefer"] {
		for tok := range strings.SplitSeq(v, ",") {
			if name, _, _ := strings.Cut(strings.TrimSpace(tok), ";"); strings.EqualFold(strings.TrimSpace(name), "respond-async") {
				return true
			}
		}
	}
	return false
}

// serveAsyncRoute answers /async-function/NAME[/rest]; ok false: not such
// a path.
func (d *DataPlane) serveAsyncRoute(w http.ResponseWriter, r *http.Request) bool {
	if !strings.HasPrefix(r.URL.Path, asyncPrefix) {
		return false
	}
	rt := prefixRoute(r, asyncPrefix)
	rt.fn = d.lookupNamed(rt.name)
	d.submitAsync(w, r, rt)
	return true
}

// submitAsync stores one asynchronous call and answers 202, or says why
// it did not: everything a client can get wrong is answered before the
// call is accepted.
func (d *DataPlane) submitAsync(w http.ResponseWriter, r *http.Request, rt route) {
	callID := r.Header["X-Call-Id"]
	fresh := len(callID) == 0 || callID[0] == ""
	if fresh {
		callID = []string{newCallID()}
	} else if !async.ValidID(callID[0]) {
		d.writeError(w, nil, fail(http.StatusBadRequest, reasonBadRequest, "X-Call-Id %q: an asynchronous call's id must be 1-64 letters, digits, '-' or '_'", callID[0]))
		return
	} else if strings.HasPrefix(callID[0], async.TriggerIDPrefix) {
		d.writeError(w, nil, fail(http.StatusBadRequest, reasonBadRequest, "X-Call-Id %q: ids starting %q are the triggers' own", callID[0], async.TriggerIDPrefix))
		return
	} else {
		callID = callID[:1:1]
	}
	q := d.cfg.Async
	if q == nil {
		d.writeError(w, callID, fail(http.StatusNotImplemented, reasonAsyncDisabled, "asynchronous calls are not enabled on this data plane (it has no queue: --nats)"))
		return
	}
	defer q.Accepting()()
	fn := rt.fn
	if fn == nil && naming.NamesFunction(rt.name) && (!rt.byPath || d.foreignName(r, rt.name).code == 0) {
		fn = d.awaitRoute(r.Context(), rt)
	}
	if fn == nil {
		d.writeError(w, callID, d.unknownFunction(r, rt.name))
		return
	}
	set := fn.set.Load()
	f, keepAuth := authorize(d, fn, set.Conf, r.Header.Get("Authorization"))
	if f.code == 0 && !fresh {
		f = mayChooseCallID(d, fn, set.Conf, r.Header.Get("Authorization"))
	}
	if f.code != 0 {
		d.writeError(w, callID, f)
		return
	}
	if _, up := r.Header["Upgrade"]; up || r.Method == http.MethodConnect {
		d.writeError(w, callID, fail(http.StatusBadRequest, reasonBadRequest, "an upgrade or CONNECT cannot be asynchronous"))
		return
	}
	limit := min(d.cfg.MaxBodyBytes, q.MaxBody())
	if r.ContentLength > limit {
		d.writeError(w, callID, fail(http.StatusRequestEntityTooLarge, reasonBodyTooLarge, "request body larger than %d bytes (the asynchronous limit)", limit))
		return
	}
	cb := r.Header.Get("X-Callback-Url")
	if cb != "" {
		if err := async.ValidCallbackURL(cb); err != nil {
			d.writeError(w, callID, fail(http.StatusBadRequest, reasonBadRequest, "%v", err))
			return
		}
	}
	body, held, err := d.readAsyncBody(w, r, limit)
	defer d.bodyBudget.give(held)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			d.writeError(w, callID, fail(http.StatusRequestEntityTooLarge, reasonBodyTooLarge, "request body larger than %d bytes (the asynchronous limit)", limit))
		case errors.Is(err, errAsyncBudget):
			d.writeError(w, callID, fail(http.StatusServiceUnavailable, reasonAsyncUnavailable, "%v", err))
		default:
			d.writeError(w, callID, fail(http.StatusBadRequest, reasonBadRequest, "reading the body: %v", err))
		}
		return
	}
	path := rt.rawRest
	if path == "" {
		path = escapePath(rt.rest)
	}
	c := d.asyncCall(r, fn, callID[0], path, body, keepAuth)
	c.CallbackURL, c.Fresh = cb, fresh
	if f := d.storeAsync(r.Context(), c); f.code != 0 {
		d.writeError(w, callID, f)
		return
	}
	loc := callsPath + "/" + c.ID
	hdr := w.Header()
	hdr["X-Call-Id"] = callID
	hdr["Location"] = []string{loc}
	hdr["Content-Type"] = hdrJSON
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, acceptedOpen+c.ID+acceptedMid+c.ID+acceptedEnd)
}

// A submit's 202 body is these around the call id, twice:
// {"call_id":"ID","status":"queued","location":"/v1/calls/ID"}. The id is
// letters, digits, '-' and '_' (async.ValidID): no escaping.
const (
	acceptedOpen = `{"call_id":"`
	acceptedMid  = `","status":"` + string(async.StatusQueued) + `","location":"` + callsPath + "/"
	acceptedEnd  = "\"}\n"
)

// asyncCall is the call to store for request r of fn, whose token was
// checked (keepAuth: its Authorization goes on to the function).
func (d *DataPlane) asyncCall(r *http.Request, fn *function, id, path string, body []byte, keepAuth bool) *async.Call {
	h := r.Header.Clone()
	for _, k := range []string{"X-Callback-Url", "Prefer", "X-Call-Id", "Content-Length"} {
		delete(h, k)
	}
	if !keepAuth {
		delete(h, "Authorization")
	}
	return &async.Call{ID: id, Function: fn.name, Method: r.Method, Path: path, Query: r.URL.RawQuery,
		Header: h, Body: body, Host: r.Host, Remote: r.RemoteAddr, FunctionUID: fn.set.Load().Conf.async.UID}
}

// storeAsync submits c and says what failed, if anything.
func (d *DataPlane) storeAsync(ctx context.Context, c *async.Call) failure {
	err := d.cfg.Async.Submit(ctx, c)
	switch {
	case err == nil:
		return failure{}
	case errors.Is(err, async.ErrQueueFull):
		return fail(http.StatusServiceUnavailable, reasonQueueFull, "the asynchronous queue is at its limit; try again later")
	case errors.Is(err, async.ErrNamespaceFull):
		return fail(http.StatusServiceUnavailable, reasonQueueFull, "namespace %q holds its share of the asynchronous queue (--async-namespace-share); try again later", async.NamespaceOfFunction(c.Function))
	case errors.Is(err, async.ErrTooLarge):
		return fail(http.StatusRequestEntityTooLarge, reasonBodyTooLarge, "request (body and headers) too large for the asynchronous queue")
	case errors.Is(err, async.ErrIDTaken):
		return fail(http.StatusConflict, reasonCallIDTaken, "X-Call-Id %q names a call of another function; choose another id", c.ID)
	}
	d.log.Warn("async submit failed", "function", c.Function, "err", err)
	return fail(http.StatusServiceUnavailable, reasonAsyncUnavailable, "the asynchronous queue did not store the call: %v", err)
}

var errAsyncBudget = errors.New("the data plane holds as many request bodies as it may (its body buffer budget); try again later")

// readAsyncBody reads a submit's body whole, up to limit. Its buffer is
// charged to the data plane's body budget as it grows, as readBody's is: a
// submit holds its body in memory until JetStream has it, and slow submits
// must not hold more than the budget. The caller gives back held.
func (d *DataPlane) readAsyncBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, held int64, err error) {
	if r.ContentLength == 0 {
		return nil, 0, nil
	}
	want := limit + 1 // room to see the end
	if r.ContentLength > 0 {
		want = min(want, r.ContentLength+1)
	}
	src := http.MaxBytesReader(w, r.Body, limit)
	for {
		if len(body) == cap(body) {
			grow := min(max(int64(cap(body)), 64<<10), want-int64(cap(body)))
			if grow <= 0 || !d.bodyBudget.take(grow) {
				return nil, held, errAsyncBudget
			}
			held += grow
			nb := make([]byte, len(body), int64(cap(body))+grow)
			copy(nb, body)
			body = nb
		}
		k, err := src.Read(body[len(body):cap(body)])
		body = body[:len(body)+k]
		if err == io.EOF {
			return body, held, nil
		} else if err != nil {
			return nil, held, err
		}
	}
}

// escapePath is rest as a request line carries it.
func escapePath(rest string) string {
	var b bytes.Buffer
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if c > 0x20 && c < 0x7f && c != '?' && c != '#' && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)>>4, 16)+strconv.FormatUint(uint64(c)&0xf, 16)))
	}
	return b.String()
}

// Policy implements async.Invoker: the function's async settings, waiting
// briefly for a function the data plane has not heard of yet.
func (d *DataPlane) Policy(ctx context.Context, name string) (async.Policy, bool) {
	fn := d.lookup(name)
	if fn == nil {
		if fn = d.awaitFunction(ctx, name); fn == nil {
			return async.Policy{}, false
		}
	}
	return fn.set.Load().Conf.async, true
}

// Invoke implements async.Invoker: one attempt of c through the invoke
// path, as a low-priority call whose token was checked at submit.
func (d *DataPlane) Invoke(ctx context.Context, c *async.Call, maxBody int) (res async.Result) {
	fn := d.lookup(c.Function)
	if fn == nil {
		return async.Result{Status: http.StatusNotFound, PlatformError: reasonFunctionDeleted.String()}
	}
	// Checked again here, as the call runs: it may have waited (for the
	// function's async concurrency) while its function was deleted and
	// another made under the name.
	if uid := fn.set.Load().Conf.async.UID; c.FunctionUID != "" && uid != "" && uid != c.FunctionUID {
		return async.Result{Status: http.StatusNotFound, PlatformError: reasonFunctionDeleted.String()}
	}
	target := "http://async" + c.Path
	if c.Query != "" {
		target += "?" + c.Query
	}
	r, err := http.NewRequestWithContext(ctx, c.Method, target, bytes.NewReader(c.Body))
	if err != nil {
		return async.Result{Status: http.StatusBadRequest, PlatformError: reasonBadRequest.String()}
	}
	if c.Header != nil {
		r.Header = c.Header.Clone()
	}
	r.Header["X-Call-Id"] = []string{c.ID}
	r.Host, r.RemoteAddr = c.Host, c.Remote
	rec := &resultRecorder{h: http.Header{}, max: maxBody}
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			res = async.Result{Status: http.StatusBadGateway, PlatformError: reasonSandboxFailed.String()}
		}
	}()
	d.invoke(rec, r, route{fn: fn, name: fn.name, byPath: true, rest: r.URL.Path, rawRest: r.URL.RawPath, async: true})
	return rec.result()
}

// resultRecorder is the ResponseWriter of an asynchronous attempt: it
// keeps the status, the headers and the body up to max.
type resultRecorder struct {
	h         http.Header
	status    int
	body      bytes.Buffer
	max       int
	truncated bool
}

func (rr *resultRecorder) Header() http.Header { return rr.h }

func (rr *resultRecorder) WriteHeader(code int) {
	if code >= 200 && rr.status == 0 {
		rr.status = code
	}
}

func (rr *resultRecorder) Write(p []byte) (int, error) {
	if rr.status == 0 {
		rr.status = http.StatusOK
	}
	if room := rr.max - rr.body.Len(); room < len(p) {
		rr.body.Write(p[:max(room, 0)])
		rr.truncated = true
	} else {
		rr.body.Write(p)
	}
	return len(p), nil
}

func (rr *resultRecorder) Flush() {}

func (rr *resultRecorder) result() async.Result {
	res := async.Result{Status: rr.status, Header: rr.h, Body: rr.body.Bytes(), Truncated: rr.truncated}
	if why := rr.h.Get("X-Brisk-Error"); why != "" {
		res.PlatformError = why
		rr.h.Del("X-Brisk-Error")
	} else if rr.status == 0 {
		res.PlatformError = "no-reply"
	}
	return res
}

// runAsync consumes the queue once the data plane knows its functions.
func (d *DataPlane) runAsync(ctx context.Context) {
	for d.cfg.ControlPlane != "" && !d.synced.Load() {
		ch := d.applied.Load()
		select {
		case <-*ch:
		case <-ctx.Done():
			return
		}
	}
	if err := d.cfg.Async.Run(ctx, d); err != nil {
		d.log.Error("async consumer stopped", "err", err)
	}
}

// serveCalls answers /v1/calls[/ID[/retry]].
func (d *DataPlane) serveCalls(w http.ResponseWriter, r *http.Request) {
	q := d.cfg.Async
	if q == nil {
		d.writeError(w, nil, fail(http.StatusNotImplemented, reasonAsyncDisabled, "asynchronous calls are not enabled on this data plane (it has no queue: --nats)"))
		return
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, callsPath), "/")
	id, action, _ := strings.Cut(rest, "/")
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	switch {
	case id == "" && r.Method == http.MethodGet:
		fnName := d.tokenQualified(r, r.URL.Query().Get("function"))
		if f := d.authCalls(r, fnName, auth.ScopeInvoke, false); f.code != 0 {
			d.writeError(w, nil, f)
			return
		}
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		recs, err := q.List(ctx, async.Filter{Function: fnName, Status: async.Status(r.URL.Query().Get("status")), Limit: limit})
		if err != nil {
			d.writeError(w, nil, fail(http.StatusServiceUnavailable, reasonAsyncUnavailable, "%v", err))
			return
		}
		// Not the calls of an earlier function of a name (deleted, perhaps
		// another tenant's).
		recs = slices.DeleteFunc(recs, func(rec async.Record) bool { return !d.sameFunction(&rec) })
		writeJSON(w, http.StatusOK, map[string]any{"calls": recs})
	case id == "" && r.Method == http.MethodDelete:
		fnName := r.URL.Query().Get("function")
		if f := d.authCalls(r, "", auth.ScopeAdmin, false); f.code != 0 {
			d.writeError(w, nil, f)
			return
		}
		if fnName != "" && !async.ValidFunction(fnName) {
			d.writeError(w, nil, fail(http.StatusBadRequest, reasonBadRequest, "function %q: not a function name", fnName))
			return
		}
		dead := false
		if v := r.URL.Query().Get("dead"); v != "" {
			var err error
			if dead, err = strconv.ParseBool(v); err != nil {
				// Not a false: a purge that meant the dead letters must
				// not drop the live queue.
				d.writeError(w, nil, fail(http.StatusBadRequest, reasonBadRequest, "dead=%q: want true or false", v))
				return
			}
		}
		n, err := q.Purge(ctx, fnName, dead)
		if err != nil {
			d.writeError(w, nil, fail(http.StatusServiceUnavailable, reasonAsyncUnavailable, "%v", err))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"purged": n})
	case id != "" && action == "" && r.Method == http.MethodGet:
		if rec, ok := d.authorizedCall(ctx, w, r, id); ok {
			writeJSON(w, http.StatusOK, rec)
		}
	case id != "" && action == "retry" && r.Method == http.MethodPost:
		rec, ok := d.authorizedCall(ctx, w, r, id)
		if !ok {
			return
		}
		var err error
		if rec, err = q.Retry(ctx, id, rec.Function); d.callError(w, err) {
			return
		}
		writeJSON(w, http.StatusAccepted, rec)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		d.writeError(w, nil, fail(http.StatusMethodNotAllowed, reasonBadRequest, "%s %s: use GET /v1/calls[?function=&status=&limit=], GET /v1/calls/ID, POST /v1/calls/ID/retry, DELETE /v1/calls?function=[&dead=true]", r.Method, r.URL.Path))
	}
}

// authorizedCall reads call id's record for a caller allowed to see it;
// otherwise it answers and returns false.
//
// Whether a call exists is told only to those who may read it: a caller
// without a valid token gets 401 for an id nobody holds as for another
// tenant's call, and a token for other functions gets 404 for either (a
// client's ids can be guessable: "payroll-2025").
func (d *DataPlane) authorizedCall(ctx context.Context, w http.ResponseWriter, r *http.Request, id string) (*async.Record, bool) {
	rec, err := d.cfg.Async.Get(ctx, id)
	if errors.Is(err, async.ErrNotFound) {
		// As for a call of a function gone: an invalid token is refused.
		if f := d.authCalls(r, "", auth.ScopeInvoke, true); f.code == http.StatusUnauthorized {
			d.writeError(w, nil, f)
			return nil, false
		}
	}
	if d.callError(w, err) {
		return nil, false
	}
	if f := d.authCalls(r, rec.Function, auth.ScopeInvoke, true); f.code != 0 {
		if f.code == http.StatusForbidden {
			d.callError(w, async.ErrNotFound)
		} else {
			d.writeError(w, nil, f)
		}
		return nil, false
	}
	if !d.sameFunction(rec) { // an earlier function's: as if there were none
		d.callError(w, async.ErrNotFound)
		return nil, false
	}
	return rec, true
}

// sameFunction reports whether rec's call was submitted to the function
// its name holds now, or to none (its function is gone: the admins' to
// see) — not to an earlier function of the name, which a function made
// later under it (perhaps by another tenant) must not see or retry.
func (d *DataPlane) sameFunction(rec *async.Record) bool {
	fn := d.lookup(rec.Function)
	if fn == nil || rec.FunctionUID == "" {
		return true
	}
	uid := fn.set.Load().Conf.async.UID
	return uid == "" || uid == rec.FunctionUID
}

// callError answers a lookup's error; it reports whether it did.
func (d *DataPlane) callError(w http.ResponseWriter, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, async.ErrNotFound):
		d.writeError(w, nil, fail(http.StatusNotFound, reasonNoCall, "no such call (or it is not in the dead-letter stream, for a retry)"))
	case errors.Is(err, async.ErrBadID):
		d.writeError(w, nil, fail(http.StatusBadRequest, reasonBadRequest, "%v", err))
	case errors.Is(err, async.ErrQueueFull):
		d.writeError(w, nil, fail(http.StatusServiceUnavailable, reasonQueueFull, "the asynchronous queue is at its limit"))
	default:
		d.writeError(w, nil, fail(http.StatusServiceUnavailable, reasonAsyncUnavailable, "%v", err))
	}
	return true
}

// tokenQualified is the full name of the function a /v1/calls request
// names: a bare name is its token's namespace's (NAME.NAMESPACE), unless
// that namespace has a function of the bare name (made before names were
// per namespace).
func (d *DataPlane) tokenQualified(r *http.Request, name string) string {
	if name == "" || strings.IndexByte(name, '.') >= 0 || !d.authOn.Load() {
		return name
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	ns := auth.NamespaceOf(d.tokens, tok)
	if namespaceOfFn(d.lookup(name)) == ns {
		return name // made before names were per namespace
	}
	return spec.Qualify(name, ns)
}

// authCalls checks a /v1/calls request's token: scope for function fnName
// (its namespace), or an admin token; nothing while auth is off. byID: the
// request names one call (GET /v1/calls/ID, a retry), whose function is
// then not named in a refusal. A call of a public function is readable
// with its id alone, but not listed: the list would hand out the ids.
func (d *DataPlane) authCalls(r *http.Request, fnName, scope string, byID bool) failure {
	if !d.authOn.Load() {
		return failure{}
	}
	ns, asked := "", scope // a refusal names the scope asked for: the raised one would say the function is gone
	if fn := d.lookup(fnName); fn != nil {
		conf := fn.set.Load().Conf
		if conf.public && byID && scope == auth.ScopeInvoke && r.Method == http.MethodGet {
			return failure{}
		}
		ns = conf.namespace
	} else if scope != auth.ScopeAdmin {
		scope = auth.ScopeAdmin // a function that is gone: its calls are the admins'
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	err := auth.Check(d.tokens, tok, scope, ns, fnName)
	switch {
	case err == nil:
		return failure{}
	case errors.Is(err, auth.ErrForbidden) && byID:
		// The call's function is not the caller's to learn (nor is the
		// call: authorizedCall answers 404).
		return fail(http.StatusForbidden, reasonForbidden, "the token may not do this (it needs the %s scope for the call's function, or admin)", asked)
	case errors.Is(err, auth.ErrForbidden):
		return fail(http.StatusForbidden, reasonForbidden, "the token may not do this (it needs the %s scope for function %q, or admin)", asked, fnName)
	}
	return fail(http.StatusUnauthorized, reasonUnauthorized, "%s: %v", callsPath, err)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header()["Content-Type"] = hdrJSON
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

package dataplane

import (
	"net/http"
	"net/textproto"
	"strconv"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/dataplane/front"
	"github.com/brisk-faas/brisk/internal/h1"
)

// The front end's submit: POST /async-function/NAME[/rest] read and
// answered on the connection's goroutine, as the front end's call is.
// net/http's request, header map, context and background read were about
// a third of the data plane's CPU per submit, and the accept benchmark
// runs the cores out (docs/benchmarks.md, "Asynchronous calls"). The
// front end takes only the plain submit: not HEAD (whose 202 has no body),
// a known function, a valid or no
// X-Call-Id, no X-Callback-Url (async.go checks a callback address) and a
// body within the queue's limit. Anything else — and every error but a
// refused token or a queue that refuses the call — is submitAsync's, on
// the net/http path, which stays the reference: both store the same call.

// hdrCallback is the header naming a submit's callback.
const hdrCallback = "x-callback-url"

// parseAsync routes a submit whose path follows the async prefix. It
// returns nil for one the front end does not serve.
func (c *frontConn) parseAsync(tail []byte) *function {
	d := c.d
	q := d.cfg.Async
	if q == nil {
		return nil
	}
	rq := &c.req
	var name []byte
	name, rq.rest = functionTail(tail)
	if len(name) == 0 || rq.isHead || same(rq.method, http.MethodConnect) {
		return nil
	}
	if rq.length > min(d.cfg.MaxBodyBytes, q.MaxBody()) {
		return nil
	}
	if rq.callID != nil && !async.ValidID(string(rq.callID)) {
		return nil
	}
	for _, s := range rq.hdrs {
		if s.Kind == h1.Fwd && h1.EqualFold(s.Name(c.head), hdrCallback) {
			return nil
		}
	}
	fn := d.lookupNamed(string(name))
	if fn != nil {
		rq.async = true
	}
	return fn
}

// submitAsync stores the submit in hand and answers 202, or the refusal.
// It reports whether the connection may carry another request.
func (c *frontConn) submitAsync(fn *function, callID []byte, fresh bool) bool {
	d := c.d
	if done := c.accepting; done != nil {
		c.accepting = nil
		defer done()
	}
	rq := &c.req
	if _, ok := c.Move(front.InRead, front.StCall, d.nanotime(), d.cfg.WriteTimeout); !ok {
		return false
	}
	conf := fn.set.Load().Conf
	f, keepAuth := authorize(d, fn, conf, rq.parsed.Authorization)
	if f.code == 0 && !fresh {
		f = mayChooseCallID(d, fn, conf, rq.parsed.Authorization)
	}
	if f.code != 0 {
		return c.answerError(f, callID)
	}
	id := string(callID)
	call := &async.Call{ID: id, Function: fn.name, Method: methodString(rq.method), Path: string(rq.rest),
		Query: string(rq.query), Header: c.asyncHeader(keepAuth), Body: rq.body, Host: string(rq.host),
		Remote: c.Remote, Fresh: fresh, FunctionUID: fn.set.Load().Conf.async.UID}
	if f := d.storeAsync(c.Ctx, call); f.code != 0 {
		return c.answerError(f, callID)
	}
	keep := c.keepAlive()
	bw := c.BW
	bw.WriteString("HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nX-Call-Id: ")
	bw.WriteString(id)
	bw.WriteString("\r\nLocation: " + callsPath + "/")
	bw.WriteString(id)
	bw.WriteString("\r\n")
	h1.WriteDate(bw)
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(acceptedOpen)+len(acceptedMid)+len(acceptedEnd)+2*len(id)), 10))
	bw.WriteString("\r\n")
	if !keep {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n" + acceptedOpen)
	bw.WriteString(id)
	bw.WriteString(acceptedMid)
	bw.WriteString(id)
	bw.WriteString(acceptedEnd)
	ok := bw.Flush() == nil
	return c.LeaveCall() && ok && keep
}

// asyncHeader is the request's header as the stored call keeps it: the
// end-to-end headers a call passes on (Authorization only when the token
// is the function's own), keys in net/http's canonical form.
func (c *frontConn) asyncHeader(keepAuth bool) http.Header {
	rq := &c.req
	b := c.head
	h := make(http.Header, len(rq.hdrs))
	for _, s := range rq.hdrs {
		switch s.Kind {
		case h1.Fwd, h1.Idem, h1.XFF, h1.TE:
		case h1.Authorization:
			if !keepAuth {
				continue
			}
		default:
			continue
		}
		if rq.connTokens && h1.ConnectionLists(b, rq.hdrs, s.Name(b)) {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(string(s.Name(b)))
		h[k] = append(h[k], string(s.Value(b)))
	}
	return h
}

// methodString is m as a string, without allocating for the usual ones.
func methodString(m []byte) string {
	for _, s := range [...]string{http.MethodPost, http.MethodGet, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if same(m, s) {
			return s
		}
	}
	return string(m)
}

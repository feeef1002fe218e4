package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/brisk-faas/brisk/internal/compat/lambda"
	"github.com/brisk-faas/brisk/internal/dataplane/front"
	"github.com/brisk-faas/brisk/internal/h1"
	"github.com/brisk-faas/brisk/internal/naming"
	"github.com/brisk-faas/brisk/internal/proxy"
)

// The front end's call: parse a request head, admit the call, send it to
// the sandbox and relay the reply, all on the connection's goroutine. The
// request head is copied out of the read buffer and parsed in place, header
// lines kept as offsets; headers go to the sandbox as the client wrote them
// (less the hop-by-hop ones) and the reply's come back the same way.

type reqAction int

const (
	actCall reqAction = iota
	actHandoff
	actClose
)

// frontReq is a parsed request (h1's parse, routed); its slices point
// into frontConn.head.
type frontReq struct {
	parsed                    h1.RequestHead
	method, rest, query, host []byte
	callID                    []byte // the client's X-Call-Id; nil: none
	body                      []byte
	length                    int64
	hdrs                      []h1.Header
	hasHost, hasLength        bool
	close                     bool // Connection: close
	connTokens                bool // Connection names other headers: drop them
	te                        bool // Te: trailers
	idempotent                bool
	isHead                    bool
	async                     bool // a submit (fastasync.go)
}

// next reads the next request. It returns the function called and
// actCall, actHandoff for a request the net/http server must serve (nothing
// of it consumed), or actClose.
func (c *frontConn) next() (*function, reqAction) {
	cfg := &c.d.cfg
	if _, err := c.BR.Peek(1); err != nil {
		return nil, actClose
	}
	if _, ok := c.Move(front.InIdle, front.StRead, c.d.nanotime(), min(cfg.ReadHeaderTimeout, cfg.ReadTimeout)); !ok {
		return nil, actClose
	}
	var buf []byte
	end, from := 0, 0
	for {
		buf, _ = c.BR.Peek(c.BR.Buffered())
		end, from = h1.HeadEnd(buf, from)
		if end > 0 {
			break
		}
		if end < 0 || len(buf) >= c.BR.Size() {
			return nil, actHandoff
		}
		if _, err := c.BR.Peek(len(buf) + 1); err != nil {
			return nil, actClose
		}
	}
	c.head = append(c.head[:0], buf[:end]...)
	fn := c.parse()
	if fn == nil {
		if h1.HTTP10WithTransferEncoding(c.head) {
			c.refuse(fail(http.StatusBadRequest, reasonBadRequest, "an HTTP/1.0 request with Transfer-Encoding has faulty framing (RFC 9112 section 6.1)"))
			return nil, actClose
		}
		return nil, actHandoff
	}
	rq := &c.req
	if rq.async {
		// A submit counts from its arrival, its body's upload included
		// (Queue.Accepting); Serve ends it if the body never comes.
		c.accepting = c.d.cfg.Async.Accepting()
	}
	// The body's buffer is charged to the data plane's body budget before
	// it is made: heads announcing bodies they never send must not hold
	// memory past it. Without budget, net/http's path takes the request
	// (and streams it).
	if n := rq.length; n > 0 {
		if !c.d.bodyBudget.take(n) {
			return nil, actHandoff
		}
		c.charged = n
	}
	_, _ = c.BR.Discard(end)
	if n := rq.length; n > 0 {
		// The read timeout counts from the request's first byte.
		if _, ok := c.Move(front.InRead, front.StRead, c.Since(), cfg.ReadTimeout); !ok {
			return nil, actClose
		}
		if int64(cap(c.body)) < n {
			c.body = make([]byte, n)
		}
		rq.body = c.body[:n]
		if _, err := io.ReadFull(c.BR, rq.body); err != nil {
			c.uncharge()
			return nil, actClose
		}
	}
	return fn, actCall
}

// parse parses c.head into c.req and routes it. It returns nil for a
// request the front end does not serve.
func (c *frontConn) parse() *function {
	if c.d.cfg.Tracer != nil {
		return nil // traced calls take the net/http path (tracing.go)
	}
	rq := &c.req
	*rq = frontReq{parsed: rq.parsed} // keeps the header storage
	p := &rq.parsed
	if h1.ParseRequestHead(c.head, p) != nil || p.Chunked {
		return nil // a chunked body, or input to refuse: net/http's
	}
	rq.method, rq.query, rq.host, rq.callID, rq.hdrs = p.Method, p.Query, p.Host, p.CallID, p.Hdrs
	rq.length, rq.hasHost, rq.hasLength = p.Length, true, p.HasLength
	rq.close, rq.connTokens, rq.te, rq.isHead = p.Close, p.ConnTokens, p.TE, p.IsHead
	rq.idempotent = p.IdemKey || idempotentMethod(p.Method)
	if rq.length > replayableBody || rq.length > c.d.cfg.MaxBodyBytes {
		return nil
	}
	path := p.Path

	// Route as DataPlane.resolve does.
	var fn *function
	if bytes.HasPrefix(path, []byte(functionPrefix)) {
		var name []byte
		name, rq.rest = functionTail(path[len(functionPrefix):])
		if len(name) == 0 {
			return nil
		}
		fn = c.d.lookupNamed(string(name))
	} else if bytes.HasPrefix(path, []byte(asyncPrefix)) {
		return c.parseAsync(path[len(asyncPrefix):])
	} else if bytes.HasPrefix(path, lambdaPath) {
		return nil // the Lambda API: the net/http path (internal/compat/lambda)
	} else {
		rq.rest = path
		if first, two := naming.HostLabels(string(rq.host)); naming.NamesFunction(first) {
			fn = c.d.lookupHost(first, two)
		}
	}
	if fn != nil {
		if conf := fn.set.Load().Conf; conf.dual || conf.split != nil {
			return nil // the emergency track and traffic splits are on the net/http path (emergency.go, split.go)
		}
	}
	return fn
}

// functionTail splits what follows /function/ or /async-function/: the
// function's name (NAME or NAME.NAMESPACE: lookupNamed) and the rest of
// the path, "/" when there is none.
func functionTail(tail []byte) (name, rest []byte) {
	name, rest = tail, []byte("/")
	if i := bytes.IndexByte(tail, '/'); i >= 0 {
		name, rest = tail[:i], tail[i:]
	}
	return name, rest
}

// call serves one request for fn. It reports whether the connection may
// carry another.
func (c *frontConn) call(fn *function) bool {
	defer c.trim()
	d := c.d
	rq := &c.req
	st := &c.st
	*st = reqState{Context: c.Ctx, fn: fn}
	callID := rq.callID
	if len(callID) == 0 {
		writeCallID(&c.callID)
		callID = c.callID[:]
	}
	if rq.async {
		return c.submitAsync(fn, callID, len(rq.callID) == 0)
	}
	set := fn.set.Load()
	limit := max(d.cfg.WriteTimeout, set.Conf.queueTimeout+set.Conf.timeout+deadlineSlack)
	if _, ok := c.Move(front.InRead, front.StCall, d.nanotime(), limit); !ok {
		return false
	}
	f, keepAuth := authorize(d, fn, set.Conf, rq.parsed.Authorization)
	if f.code != 0 {
		fn.m.used.Store(true)
		fn.m.codes.inc(f.code)
		return c.answerError(f, callID)
	}
	st.keepAuth = keepAuth
	if f := d.admit(c.Ctx, st, set, nil); f.code != 0 {
		if f.code == statusClientGone {
			c.LeaveCall()
			return false
		}
		return c.answerError(f, callID)
	}
	return c.forward(st, callID)
}

// keepAlive: the connection may carry another request after this one.
func (c *frontConn) keepAlive() bool { return !c.req.close && !c.Closing() }

// answerError writes a brisk-generated error for a call in the call state
// and leaves the state; it reports whether the connection goes on.
func (c *frontConn) answerError(f failure, callID []byte) bool {
	keep := c.keepAlive()
	ok := c.writeError(f, callID, keep, c.req.isHead)
	return c.LeaveCall() && ok && keep
}

// forward sends the call to st.ep, relays the reply and ends the call
// (finish). It ends the call state (LeaveCall) before a sandbox connection
// goes back to its pool, so a client watch can never abort a connection
// another call uses; and it frees the slot before the client can see the
// end of the reply (as the net/http path does, whose server flushes after
// the handler), so that a client calling again at once finds it free
// rather than queueing for it and asking for a sandbox more.
func (c *frontConn) forward(st *reqState, callID []byte) bool {
	d := c.d
	rq := &c.req
	deadline := time.Now().Add(st.conf.timeout)
	var up *upConn
	var rh replyHead
	reroutes := 0
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		up, reused, err = st.ep.conns.Take(c.Ctx, attempt, false)
		if err != nil && c.Ctx.Err() != nil { // the client left during the dial: not the sandbox's failure
			st.code = statusClientGone
			d.finish(st, nil)
			c.LeaveCall()
			return false
		}
		if err != nil {
			d.connectFailed(st, err)
			if d.reroute(c.Ctx, st, err, &reroutes) {
				attempt = -1
				continue
			}
			return c.failCall(st, err, callID)
		}
		st.proxyStart = d.nanotime()
		_ = up.NC.SetDeadline(deadline)
		c.up.Store(up)
		err = c.writeUpstream(up, st, callID)
		sent := err == nil
		if sent {
			err = c.readReplyHead(up, &rh)
		}
		if err == nil {
			d.prom.firstByte.Observe(seconds(d.nanotime() - st.proxyStart))
			break
		}
		c.up.Store(nil)
		up.NC.Close()
		if c.Gone.Load() || errors.Is(err, errClientWrite) {
			st.code = statusClientGone
			d.finish(st, nil)
			c.LeaveCall()
			return false
		}
		if reused && !rh.started && proxy.ClosedByPeer(err) && (!sent || rq.idempotent) {
			continue
		}
		return c.failCall(st, err, callID)
	}

	st.code = rh.code
	keep := c.keepAlive()
	sentBefore := c.Out.N()
	c.writeReplyHead(st, &rh, callID, keep)
	var upErr, downErr error
	switch {
	case rh.noBody:
	case rh.chunked:
		upErr, downErr = h1.CopyChunks(c.BW, up.BR)
	case rh.length >= 0:
		upErr, downErr = h1.CopyFixed(c.BW, up.BR, rh.length)
	default:
		upErr, downErr = h1.CopyUntilClose(c.BW, up.BR)
	}
	// What is left of the reply is in c.BW, not yet flushed.
	usable := c.EndCall()
	c.up.Store(nil)
	if upErr == nil && downErr == nil && rh.keepAlive && usable {
		up.Put(rh.noBody)
	} else {
		up.NC.Close() // a watch that found the client gone may have aborted it
	}
	cut := upErr != nil || downErr != nil
	switch {
	case cut && (downErr != nil || c.Gone.Load()):
		st.code = statusClientGone
	case cut && c.Out.N() == sentBefore:
		// Nothing of the reply has left: the client gets a 502 saying why
		// rather than a connection closed on it.
		c.BW.Reset(&c.Out)
		f := d.sandboxFailure(st, fmt.Errorf("reply broken off: %w", upErr))
		st.code = f.code
		d.finish(st, nil)
		c.writeError(f, callID, false, c.req.isHead)
		return false
	case cut:
		// The status went out already: closing the connection shows the
		// client the reply was cut off.
		d.log.Debug("sandbox reply cut off", "function", st.fn.name, "sandbox", st.ep.id, "err", upErr)
		st.code = http.StatusBadGateway
	}
	d.finish(st, nil)
	if cut || c.BW.Flush() != nil || !keep || !usable {
		return false
	}
	return c.Idle()
}

// failCall answers a call its sandbox failed (502, or 504 when it ran out
// of time) and ends it.
func (c *frontConn) failCall(st *reqState, err error, callID []byte) bool {
	f := c.d.upstreamError(st, err)
	st.code = f.code
	c.d.finish(st, nil)
	if f.code == statusClientGone { // it left while its call waited for another sandbox
		c.LeaveCall()
		return false
	}
	return c.answerError(f, callID)
}

// uncharge gives back the body budget the request held.
func (c *frontConn) uncharge() {
	if c.charged > 0 {
		c.d.bodyBudget.give(c.charged)
		c.charged = 0
	}
}

// trim drops buffers a large request or reply head grew, so that an idle
// connection stays small.
func (c *frontConn) trim() {
	c.uncharge()
	const keep = 16 << 10
	if cap(c.body) > keep {
		c.body = nil
	}
	if cap(c.rbuf) > keep {
		c.rbuf = nil
	}
}

// errClientWrite: relaying an interim reply to the client failed.
var errClientWrite = errors.New("client connection failed")

// lambdaPath starts the Lambda API's routes (ListFunctions' path less its
// last slash prefixes them all).
var lambdaPath = []byte(lambda.Prefix[:len(lambda.Prefix)-1])

// writeUpstream writes the request to the sandbox: the path it sees, the
// client's headers less hop-by-hop ones, X-Forwarded-*, the call and
// sandbox ids, and the body (as forward does for the net/http path).
func (c *frontConn) writeUpstream(up *upConn, st *reqState, callID []byte) error {
	rq := &c.req
	h := c.head
	bw := up.BW
	up.Head = rq.isHead
	bw.Write(rq.method)
	bw.WriteByte(' ')
	bw.Write(rq.rest)
	if len(rq.query) > 0 {
		bw.WriteByte('?')
		bw.Write(rq.query)
	}
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(st.ep.addr)
	bw.WriteString("\r\n")
	for _, s := range rq.hdrs {
		if s.Kind != h1.Fwd && s.Kind != h1.Idem && (s.Kind != h1.Authorization || !st.keepAuth) {
			continue
		}
		if rq.connTokens && h1.ConnectionLists(h, rq.hdrs, s.Name(h)) {
			continue
		}
		bw.Write(s.Name(h))
		bw.WriteString(": ")
		bw.Write(s.Value(h))
		bw.WriteString("\r\n")
	}
	if rq.te {
		bw.WriteString("Te: trailers\r\n")
	}
	bw.WriteString("X-Forwarded-For: ")
	for _, s := range rq.hdrs {
		if s.Kind == h1.XFF {
			bw.Write(s.Value(h))
			bw.WriteString(", ")
		}
	}
	writeForwarding(bw, c.Remote, rq.host, c.d.fwdProto, st.ep.id, callID)
	writeBody(bw, rq.method, rq.body)
	return bw.Flush()
}

// replyHead is a reply head: h1's parse (its spans index frontConn.rbuf)
// and the framing forward relays the body with.
type replyHead struct {
	parsed          h1.ReplyHead
	code            int
	length          int64 // -1: chunked, or until the connection closes
	chunked, noBody bool
	keepAlive       bool
	started         bool
}

// readReplyHead reads the reply head from the sandbox into c.rbuf and
// parses it. Interim replies (103 Early Hints, 102) are relayed to the
// client as they come; a 100 Continue is not (the client sent no Expect).
func (c *frontConn) readReplyHead(up *upConn, rh *replyHead) error {
	rh.parsed.Hdrs = c.rhdrs[:0]
	defer func() { c.rhdrs = rh.parsed.Hdrs }()
	p := &rh.parsed
	for interim := 0; ; interim++ {
		if interim > h1.MaxInterim {
			return h1.ErrTooManyInterim
		}
		var err error
		var started bool
		c.rbuf, started, err = h1.ReadHead(up.BR, c.rbuf[:0])
		rh.started = rh.started || started
		if err != nil {
			return err
		}
		if err := h1.ParseReplyHead(c.rbuf, p); err != nil {
			return err
		}
		if p.Code >= 200 || p.Code == http.StatusSwitchingProtocols {
			break
		}
		if p.Code != http.StatusContinue {
			c.writeStatus(rh)
			c.BW.WriteString("\r\n")
			if c.BW.Flush() != nil {
				return errClientWrite
			}
		}
	}
	rh.code, rh.length, rh.keepAlive = p.Code, p.Length, p.KeepAlive
	switch {
	case p.Code == http.StatusSwitchingProtocols:
		return errors.New("sandbox switched protocols on a call that did not ask to")
	case up.Head, p.Code == http.StatusNoContent, p.Code == http.StatusNotModified:
		rh.noBody = true
	case p.Chunked:
		rh.chunked = true
	case p.Length < 0:
		rh.keepAlive = false // read until close
	}
	return nil
}

// writeReplyHead writes the reply's status line and headers to the client,
// with the call's own headers and the framing of the relayed body.
func (c *frontConn) writeReplyHead(st *reqState, rh *replyHead, callID []byte, keep bool) {
	bw := c.BW
	c.writeStatus(rh)
	bw.WriteString("X-Call-Id: ")
	bw.Write(callID)
	bw.WriteString("\r\nX-Brisk-Sandbox: ")
	bw.WriteString(st.ep.id)
	bw.WriteString("\r\nX-Brisk-Timing: ")
	bw.Write(appendTiming(bw.AvailableBuffer(), st.queueNs/1e3, st.cold, (c.d.nanotime()-st.proxyStart)/1e3))
	bw.WriteString("\r\nX-Start-Time: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), c.d.epochNs+st.arrival, 10))
	bw.WriteString("\r\n")
	if !rh.parsed.HasDate {
		h1.WriteDate(bw)
	}
	switch {
	case rh.noBody && !(c.req.isHead && rh.length >= 0):
	case rh.length >= 0: // a HEAD reply's too: the length of the body it omits
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), rh.length, 10))
		bw.WriteString("\r\n")
	default:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if !keep {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// writeStatus writes the reply's status line and end-to-end headers.
func (c *frontConn) writeStatus(rh *replyHead) {
	c.BW.WriteString("HTTP/1.1 ")
	c.BW.Write(rh.parsed.Status)
	c.BW.WriteString("\r\n")
	b := c.rbuf
	p := &rh.parsed
	for _, s := range p.Hdrs {
		if s.Kind != h1.Fwd && s.Kind != h1.Date {
			continue
		}
		if p.ConnTokens && h1.ConnectionLists(b, p.Hdrs, s.Name(b)) {
			continue
		}
		c.BW.Write(s.Name(b))
		c.BW.WriteString(": ")
		c.BW.Write(s.Value(b))
		c.BW.WriteString("\r\n")
	}
}

// writeError writes a brisk-generated error as JSON, without the body in
// reply to a HEAD request (head). It reports whether the write succeeded.
func (c *frontConn) writeError(f failure, callID []byte, keep, head bool) bool {
	body := errorJSON(f)
	c.d.prom.errors.inc(f.why)
	bw := c.BW
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(f.code), 10))
	bw.WriteByte(' ')
	bw.WriteString(statusText(f.code))
	bw.WriteString("\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n")
	if f.why != reasonNone {
		bw.WriteString("X-Brisk-Error: ")
		bw.WriteString(f.why.String())
		bw.WriteString("\r\n")
	}
	if f.code == http.StatusUnauthorized {
		bw.WriteString("WWW-Authenticate: Bearer realm=\"brisk\"\r\n")
	}
	if len(callID) > 0 {
		bw.WriteString("X-Call-Id: ")
		bw.Write(callID)
		bw.WriteString("\r\n")
	}
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(body)), 10))
	bw.WriteString("\r\n")
	h1.WriteDate(bw)
	if !keep {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	if !head {
		bw.Write(body)
	}
	return bw.Flush() == nil
}

// text is a header value as the front end holds it (bytes) or net/http
// does (a string).
type text = h1.Text

// idempotentMethod: the methods http.Transport sends again after a
// connection failure.
func idempotentMethod[S text](m S) bool {
	return same(m, http.MethodGet) || same(m, http.MethodHead) || same(m, http.MethodOptions) || same(m, http.MethodTrace)
}

// same reports whether a equals b, without converting a.
func same[S text](a S, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(b) {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

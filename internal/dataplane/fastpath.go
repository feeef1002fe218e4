package dataplane

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/httpx"
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

// Header kinds, for the request and the reply.
const (
	kFwd     uint8 = iota // passed on
	kDrop                 // hop-by-hop, or replaced by the data plane's own
	kHandoff              // the request needs the net/http server
	kHost
	kLength
	kConnection
	kTE // request: Te; reply: Transfer-Encoding
	kXFF
	kCallID
	kIdem // an idempotency key: passed on, and the call may be sent twice
	kDate
)

// maxReplyHead bounds a reply head read from a sandbox.
const maxReplyHead = 1 << 20

// hdrSpan is one header line: its name and trimmed value as offsets into a
// head buffer.
type hdrSpan struct {
	ns, ne, vs, ve int32
	kind           uint8
}

func (s hdrSpan) name(b []byte) []byte  { return b[s.ns:s.ne] }
func (s hdrSpan) value(b []byte) []byte { return b[s.vs:s.ve] }

// frontReq is a parsed request; its slices point into frontConn.head.
type frontReq struct {
	method, rest, query, host []byte
	callID                    []byte // the client's X-Call-Id; nil: none
	body                      []byte
	length                    int64
	hdrs                      []hdrSpan
	hasHost, hasLength        bool
	close                     bool // Connection: close
	connTokens                bool // Connection names other headers: drop them
	te                        bool // Te: trailers
	idempotent                bool
	isHead                    bool
}

// next reads the next request. It returns the function called and
// actCall, actHandoff for a request the net/http server must serve (nothing
// of it consumed), or actClose.
func (c *frontConn) next() (*function, reqAction) {
	cfg := &c.f.d.cfg
	if _, err := c.br.Peek(1); err != nil {
		return nil, actClose
	}
	if _, ok := c.move(inIdle, stRead, c.f.d.nanotime(), min(cfg.ReadHeaderTimeout, cfg.ReadTimeout)); !ok {
		return nil, actClose
	}
	var buf []byte
	end, from := 0, 0
	for {
		buf, _ = c.br.Peek(c.br.Buffered())
		end, from = headEnd(buf, from)
		if end > 0 {
			break
		}
		if end < 0 || len(buf) >= c.br.Size() {
			return nil, actHandoff
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			return nil, actClose
		}
	}
	c.head = append(c.head[:0], buf[:end]...)
	fn := c.parse()
	if fn == nil {
		return nil, actHandoff
	}
	_, _ = c.br.Discard(end)
	rq := &c.req
	if n := rq.length; n > 0 {
		// The read timeout counts from the request's first byte.
		if _, ok := c.move(inRead, stRead, c.since.Load(), cfg.ReadTimeout); !ok {
			return nil, actClose
		}
		if int64(cap(c.body)) < n {
			c.body = make([]byte, n)
		}
		rq.body = c.body[:n]
		if _, err := io.ReadFull(c.br, rq.body); err != nil {
			return nil, actClose
		}
	}
	return fn, actCall
}

// headEnd looks for the blank line that ends a request head in buf,
// scanning from from (a line start). It returns the head's length, or 0 and
// where to resume once more has arrived, or -1 for a head the front end
// leaves to net/http (a bare LF line ending, leading blank lines).
func headEnd(buf []byte, from int) (int, int) {
	for {
		i := bytes.IndexByte(buf[from:], '\n')
		if i < 0 {
			return 0, from
		}
		j := from + i
		if j == 0 || buf[j-1] != '\r' || j == 1 {
			return -1, 0
		}
		if j >= 3 && buf[j-3] == '\r' && buf[j-2] == '\n' {
			return j + 1, 0
		}
		from = j + 1
	}
}

// parse parses c.head into c.req and routes it. It returns nil for a
// request the front end does not serve.
func (c *frontConn) parse() *function {
	h := c.head
	rq := &c.req
	*rq = frontReq{hdrs: rq.hdrs[:0]}

	eol := bytes.IndexByte(h, '\n')
	line := h[:eol-1]
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || !isToken(line[:sp]) {
		return nil
	}
	rq.method = line[:sp]
	line = line[sp+1:]
	sp = bytes.IndexByte(line, ' ')
	if sp <= 0 || string(line[sp+1:]) != "HTTP/1.1" || line[0] != '/' {
		return nil
	}
	target := line[:sp]
	for _, b := range target {
		if b <= ' ' || b >= 0x7f || b == '%' || b == '#' {
			return nil // escapes, fragments, odd bytes: net/http's parser decides
		}
	}
	path := target
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		path, rq.query = target[:q], target[q+1:]
	}
	rq.isHead = string(rq.method) == http.MethodHead
	rq.idempotent = idempotentMethod(rq.method)

	for pos := eol + 1; ; {
		eol = pos + bytes.IndexByte(h[pos:], '\n')
		line := h[pos : eol-1]
		if len(line) == 0 {
			break
		}
		colon, vs, ve, ok := splitHeader(line)
		value := line[vs:ve]
		if !ok || !validValue(value) {
			return nil
		}
		kind := requestKind(line[:colon])
		switch kind {
		case kHandoff:
			return nil
		case kHost:
			if rq.hasHost || !validHost(value) {
				return nil
			}
			rq.host, rq.hasHost = value, true
		case kLength:
			n, ok := parseLength(value)
			if rq.hasLength || !ok {
				return nil
			}
			rq.length, rq.hasLength = n, true
		case kConnection:
			cl, others := connectionTokens(value)
			rq.close, rq.connTokens = rq.close || cl, rq.connTokens || others
		case kTE:
			for tok := range tokens(value) {
				if asciiEqualFold(tok, "trailers") {
					rq.te = true
				}
			}
		case kCallID:
			if rq.callID == nil {
				rq.callID = value
			}
		case kIdem:
			rq.idempotent = true
		}
		rq.hdrs = append(rq.hdrs, hdrSpan{ns: int32(pos), ne: int32(pos + colon), vs: int32(pos + vs), ve: int32(pos + ve), kind: kind})
		pos = eol + 1
	}
	if !rq.hasHost || rq.length > replayableBody || rq.length > c.f.d.cfg.MaxBodyBytes {
		return nil
	}

	// Route as DataPlane.resolve does.
	var fn *function
	if bytes.HasPrefix(path, []byte(functionPrefix)) {
		name := path[len(functionPrefix):]
		rq.rest = []byte("/")
		if i := bytes.IndexByte(name, '/'); i >= 0 {
			name, rq.rest = name[:i], name[i:]
		}
		if len(name) == 0 {
			return nil
		}
		fn = c.f.d.lookup(string(name))
	} else {
		rq.rest = path
		if label := httpx.HostLabel(string(rq.host)); httpx.NamesFunction(label) {
			fn = c.f.d.lookup(label)
		}
	}
	return fn
}

// call serves one request for fn. It reports whether the connection may
// carry another.
func (c *frontConn) call(fn *function) bool {
	defer c.trim()
	d := c.f.d
	rq := &c.req
	st := &c.st
	*st = reqState{Context: c.ctx, fn: fn}
	callID := rq.callID
	if len(callID) == 0 {
		writeCallID(&c.callID)
		callID = c.callID[:]
	}
	set := fn.set.Load()
	limit := max(d.cfg.WriteTimeout, set.conf.queueTimeout+set.conf.timeout+deadlineSlack)
	if _, ok := c.move(inRead, stCall, d.nanotime(), limit); !ok {
		return false
	}
	if code, msg := d.admit(c.ctx, st, set); code != 0 {
		if code == statusClientGone {
			c.leaveCall()
			return false
		}
		return c.answerError(code, msg, callID)
	}
	return c.forward(st, callID)
}

// keepAlive: the connection may carry another request after this one.
func (c *frontConn) keepAlive() bool { return !c.req.close && !c.f.closing.Load() }

// answerError writes a brisk-generated error for a call in the call state
// and leaves the state; it reports whether the connection goes on.
func (c *frontConn) answerError(code int, msg string, callID []byte) bool {
	keep := c.keepAlive()
	ok := c.writeError(code, msg, callID, keep)
	return c.leaveCall() && ok && keep
}

// forward sends the call to st.ep, relays the reply and ends the call
// (finish). It ends the call state (leaveCall) before a sandbox connection
// goes back to its pool, so a client watch can never abort a connection
// another call uses; and it frees the slot before the client can see the
// end of the reply (as the net/http path does, whose server flushes after
// the handler), so that a client calling again at once finds it free
// rather than queueing for it and asking for a sandbox more.
func (c *frontConn) forward(st *reqState, callID []byte) bool {
	d := c.f.d
	rq := &c.req
	deadline := time.Now().Add(st.conf.timeout)
	var up *upConn
	var rh replyHead
	for attempt := 0; ; attempt++ {
		var reused bool
		var err error
		up, reused, err = st.ep.conns.take(attempt, false)
		if err != nil {
			return c.failCall(st, err, callID)
		}
		st.proxyStart = d.nanotime()
		_ = up.nc.SetDeadline(deadline)
		c.up.Store(up)
		err = c.writeUpstream(up, st, callID)
		sent := err == nil
		if sent {
			err = c.readReplyHead(up, &rh)
		}
		if err == nil {
			break
		}
		c.up.Store(nil)
		up.nc.Close()
		if c.gone.Load() || errors.Is(err, errClientWrite) {
			st.code = statusClientGone
			d.finish(st, nil)
			c.leaveCall()
			return false
		}
		if reused && !rh.started && closedByPeer(err) && (!sent || rq.idempotent) {
			continue
		}
		return c.failCall(st, err, callID)
	}

	st.code = rh.code
	keep := c.keepAlive()
	c.writeReplyHead(st, &rh, callID, keep)
	var upErr, downErr error
	switch {
	case rh.noBody:
	case rh.chunked:
		upErr, downErr = copyChunks(c.bw, up.br)
	case rh.length >= 0:
		upErr, downErr = copyFixed(c.bw, up.br, rh.length)
	default:
		upErr, downErr = copyUntilClose(c.bw, up.br)
	}
	// What is left of the reply is in c.bw, not yet flushed.
	usable := c.endCall()
	c.up.Store(nil)
	if upErr == nil && downErr == nil && rh.keepAlive && usable {
		up.pool.put(up)
	} else {
		up.nc.Close() // a watch that found the client gone may have aborted it
	}
	cut := upErr != nil || downErr != nil
	switch {
	case cut && (downErr != nil || c.gone.Load()):
		st.code = statusClientGone
	case cut:
		// The status went out already: closing the connection shows the
		// client the reply was cut off.
		d.log.Debug("sandbox reply cut off", "function", st.fn.name, "sandbox", st.ep.id, "err", upErr)
		st.code = http.StatusBadGateway
	}
	d.finish(st, nil)
	if cut || c.bw.Flush() != nil || !keep || !usable {
		return false
	}
	return c.idle()
}

// failCall answers a call its sandbox failed (502, or 504 when it ran out
// of time) and ends it.
func (c *frontConn) failCall(st *reqState, err error, callID []byte) bool {
	code, msg := c.f.d.upstreamError(st, err)
	st.code = code
	c.f.d.finish(st, nil)
	return c.answerError(code, msg, callID)
}

// trim drops buffers a large request or reply head grew, so that an idle
// connection stays small.
func (c *frontConn) trim() {
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

// writeUpstream writes the request to the sandbox: the path it sees, the
// client's headers less hop-by-hop ones, X-Forwarded-*, the call and
// sandbox ids, and the body (as forward does for the net/http path).
func (c *frontConn) writeUpstream(up *upConn, st *reqState, callID []byte) error {
	rq := &c.req
	h := c.head
	bw := up.bw
	up.head = rq.isHead
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
		if s.kind != kFwd && s.kind != kIdem {
			continue
		}
		if rq.connTokens && connectionLists(h, rq.hdrs, s.name(h)) {
			continue
		}
		bw.Write(s.name(h))
		bw.WriteString(": ")
		bw.Write(s.value(h))
		bw.WriteString("\r\n")
	}
	if rq.te {
		bw.WriteString("Te: trailers\r\n")
	}
	bw.WriteString("X-Forwarded-For: ")
	for _, s := range rq.hdrs {
		if s.kind == kXFF {
			bw.Write(s.value(h))
			bw.WriteString(", ")
		}
	}
	writeForwarding(bw, c.remote, rq.host, st.ep.id, callID)
	writeBody(bw, rq.method, rq.body)
	return bw.Flush()
}

// replyHead is a parsed reply head; its spans index frontConn.rbuf.
type replyHead struct {
	code                int
	status              []byte // "200 OK": the code and reason as received
	hdrs                []hdrSpan
	length              int64  // -1: chunked, or until the connection closes
	te                  []byte // Transfer-Encoding
	chunked, noBody     bool
	keepAlive, hasDate  bool
	connTokens, started bool
}

// readReplyHead reads the reply head from the sandbox into c.rbuf and
// parses it. Interim replies (103 Early Hints, 102) are relayed to the
// client as they come; a 100 Continue is not (the client sent no Expect).
func (c *frontConn) readReplyHead(up *upConn, rh *replyHead) error {
	hdrs := c.rhdrs[:0]
	defer func() { c.rhdrs = hdrs }()
	for {
		*rh = replyHead{started: rh.started}
		c.rbuf = c.rbuf[:0]
		lineStart := 0
		for {
			line, err := up.br.ReadSlice('\n')
			if len(line) > 0 {
				rh.started = true
			}
			c.rbuf = append(c.rbuf, line...)
			if len(c.rbuf) > maxReplyHead {
				return errors.New("malformed reply: head larger than 1 MiB")
			}
			if err == bufio.ErrBufferFull {
				continue // a long line: read on
			}
			if err != nil {
				return err
			}
			if n := len(c.rbuf) - lineStart; n <= 2 && (n == 1 || c.rbuf[lineStart] == '\r') {
				break // the blank line
			}
			lineStart = len(c.rbuf)
		}
		var err error
		hdrs, err = parseReplyHead(c.rbuf, rh, hdrs[:0])
		if err != nil {
			return err
		}
		rh.hdrs = hdrs
		if rh.code >= 200 || rh.code == http.StatusSwitchingProtocols {
			break
		}
		if rh.code != http.StatusContinue {
			c.writeStatus(rh)
			c.bw.WriteString("\r\n")
			if c.bw.Flush() != nil {
				return errClientWrite
			}
		}
	}
	switch {
	case rh.code == http.StatusSwitchingProtocols:
		return errors.New("sandbox switched protocols on a call that did not ask to")
	case up.head, rh.code == http.StatusNoContent, rh.code == http.StatusNotModified:
		rh.noBody = true
	case rh.te != nil:
		rh.length = -1
		if lastCodingIs(rh.te, "chunked") {
			rh.chunked = true
		} else {
			rh.keepAlive = false // read until close
		}
	case rh.length < 0:
		rh.keepAlive = false // read until close
	}
	return nil
}

// parseReplyHead parses the head in b (status line, header lines, blank
// line) into rh, appending its header spans to hdrs.
func parseReplyHead(b []byte, rh *replyHead, hdrs []hdrSpan) ([]hdrSpan, error) {
	eol := bytes.IndexByte(b, '\n')
	line := trimCR(b[:eol])
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return hdrs, errors.New("malformed reply status line")
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 || code > 999 || (len(line) > 12 && line[12] != ' ') {
		return hdrs, errors.New("malformed reply status code")
	}
	if !validValue(line) {
		return hdrs, errors.New("malformed reply status line")
	}
	rh.code, rh.status, rh.length = code, line[9:], -1
	rh.keepAlive = line[7] == '1'
	hasLength := false
	for pos := eol + 1; pos < len(b); {
		eol = pos + bytes.IndexByte(b[pos:], '\n')
		line := trimCR(b[pos:eol])
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return hdrs, errors.New("malformed reply: obsolete line folding")
		}
		colon, vs, ve, ok := splitHeader(line)
		if !ok {
			return hdrs, errors.New("malformed reply header line")
		}
		value := line[vs:ve]
		if !validValue(value) {
			return hdrs, errors.New("malformed reply header value")
		}
		kind := replyKind(line[:colon])
		switch kind {
		case kConnection:
			cl, others := connectionTokens(value)
			rh.keepAlive, rh.connTokens = rh.keepAlive && !cl, rh.connTokens || others
		case kLength:
			n, ok := parseLength(value)
			if !ok || (hasLength && n != rh.length) {
				return hdrs, errors.New("malformed reply Content-Length")
			}
			rh.length, hasLength = n, true
		case kTE:
			rh.te = value
		case kDate:
			rh.hasDate = true
		}
		hdrs = append(hdrs, hdrSpan{ns: int32(pos), ne: int32(pos + colon), vs: int32(pos + vs), ve: int32(pos + ve), kind: kind})
		pos = eol + 1
	}
	return hdrs, nil
}

// writeReplyHead writes the reply's status line and headers to the client,
// with the call's own headers and the framing of the relayed body.
func (c *frontConn) writeReplyHead(st *reqState, rh *replyHead, callID []byte, keep bool) {
	bw := c.bw
	c.writeStatus(rh)
	bw.WriteString("X-Call-Id: ")
	bw.Write(callID)
	bw.WriteString("\r\nX-Brisk-Sandbox: ")
	bw.WriteString(st.ep.id)
	bw.WriteString("\r\nX-Brisk-Timing: ")
	bw.Write(appendTiming(bw.AvailableBuffer(), st.queueNs/1e3, st.cold, (c.f.d.nanotime()-st.proxyStart)/1e3))
	bw.WriteString("\r\n")
	if !rh.hasDate {
		writeDate(bw)
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
	c.bw.WriteString("HTTP/1.1 ")
	c.bw.Write(rh.status)
	c.bw.WriteString("\r\n")
	b := c.rbuf
	for _, s := range rh.hdrs {
		if s.kind != kFwd && s.kind != kDate {
			continue
		}
		if rh.connTokens && connectionLists(b, rh.hdrs, s.name(b)) {
			continue
		}
		c.bw.Write(s.name(b))
		c.bw.WriteString(": ")
		c.bw.Write(s.value(b))
		c.bw.WriteString("\r\n")
	}
}

// writeError writes a brisk-generated error as JSON. It reports whether
// the write succeeded.
func (c *frontConn) writeError(code int, msg string, callID []byte, keep bool) bool {
	body := errorJSON(msg)
	bw := c.bw
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(code), 10))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(code))
	bw.WriteString("\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\n")
	if len(callID) > 0 {
		bw.WriteString("X-Call-Id: ")
		bw.Write(callID)
		bw.WriteString("\r\n")
	}
	bw.WriteString("Content-Length: ")
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(body)), 10))
	bw.WriteString("\r\n")
	writeDate(bw)
	if !keep {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	bw.Write(body)
	return bw.Flush() == nil
}

// copyFixed copies n bytes of a reply body. upErr is the sandbox side's
// error, downErr the client's.
func copyFixed(dst *bufio.Writer, src *bufio.Reader, n int64) (upErr, downErr error) {
	var buf []byte
	defer func() {
		if buf != nil {
			copyBufs.Put(buf)
		}
	}()
	for n > 0 {
		if src.Buffered() == 0 && n >= int64(src.Size()) {
			// A large body: read past the small buffer, straight into a
			// copy buffer that goes out in one write.
			if buf == nil {
				buf = copyBufs.Get()
			}
			k, err := src.Read(buf[:min(int64(len(buf)), n)])
			if k > 0 {
				if _, err := dst.Write(buf[:k]); err != nil {
					return nil, err
				}
				n -= int64(k)
			}
			if err != nil && n > 0 {
				return eofIsUnexpected(err), nil
			}
			continue
		}
		if src.Buffered() == 0 {
			if _, err := src.Peek(1); err != nil {
				return eofIsUnexpected(err), nil
			}
		}
		p, _ := src.Peek(int(min(int64(src.Buffered()), n)))
		if _, err := dst.Write(p); err != nil {
			return nil, err
		}
		_, _ = src.Discard(len(p))
		n -= int64(len(p))
	}
	return nil, nil
}

func eofIsUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// copyChunks relays a chunked body chunk by chunk, flushing to the client
// whenever the sandbox has sent nothing further yet (a streamed reply
// reaches the client piece by piece). The framing is the data plane's own:
// size lines are written anew (extensions dropped) and trailers pass only
// as valid header lines, less hop-by-hop ones and the data plane's own, so
// a function cannot smuggle bytes into the framing a client or an
// intermediary parses.
func copyChunks(dst *bufio.Writer, src *bufio.Reader) (upErr, downErr error) {
	errMalformed := errors.New("malformed chunked reply")
	for {
		line, err := src.ReadSlice('\n')
		if err != nil {
			return eofIsUnexpected(err), nil
		}
		size, ok := chunkSize(line)
		if !ok {
			return errMalformed, nil
		}
		dst.Write(strconv.AppendInt(dst.AvailableBuffer(), size, 16))
		dst.WriteString("\r\n")
		if size == 0 { // the last chunk: trailers up to a blank line
			for {
				line, err := src.ReadSlice('\n')
				if err != nil {
					return eofIsUnexpected(err), nil
				}
				line = trimCR(line[:len(line)-1])
				if len(line) == 0 {
					_, err := dst.WriteString("\r\n")
					return nil, err
				}
				colon, vs, ve, ok := splitHeader(line)
				if !ok || !validValue(line[vs:ve]) {
					return errMalformed, nil
				}
				if replyKind(line[:colon]) != kFwd {
					continue
				}
				dst.Write(line[:colon])
				dst.WriteString(": ")
				dst.Write(line[vs:ve])
				dst.WriteString("\r\n")
			}
		}
		if upErr, downErr = copyFixed(dst, src, size); upErr != nil || downErr != nil {
			return upErr, downErr
		}
		crlf, err := src.ReadSlice('\n')
		if err != nil {
			return eofIsUnexpected(err), nil
		}
		if len(trimCR(crlf[:len(crlf)-1])) != 0 {
			return errMalformed, nil
		}
		dst.WriteString("\r\n")
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return nil, err
			}
		}
	}
}

// copyUntilClose relays a body that ends when the sandbox closes the
// connection, as chunks, each flushed as it arrives.
func copyUntilClose(dst *bufio.Writer, src *bufio.Reader) (upErr, downErr error) {
	buf := copyBufs.Get()
	defer copyBufs.Put(buf)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			dst.Write(strconv.AppendInt(dst.AvailableBuffer(), int64(k), 16))
			dst.WriteString("\r\n")
			dst.Write(buf[:k])
			dst.WriteString("\r\n")
			if err := dst.Flush(); err != nil {
				return nil, err
			}
		}
		if err == io.EOF {
			_, err := dst.WriteString("0\r\n\r\n")
			return nil, err
		}
		if err != nil {
			return err, nil
		}
	}
}

// splitHeader splits a header line at its colon: the name must be a token,
// and the value (line[vs:ve]) is trimmed of spaces and tabs.
func splitHeader(line []byte) (colon, vs, ve int, ok bool) {
	colon = bytes.IndexByte(line, ':')
	if colon <= 0 || !isToken(line[:colon]) {
		return 0, 0, 0, false
	}
	vs, ve = colon+1, len(line)
	for vs < ve && (line[vs] == ' ' || line[vs] == '\t') {
		vs++
	}
	for ve > vs && (line[ve-1] == ' ' || line[ve-1] == '\t') {
		ve--
	}
	return colon, vs, ve, true
}

// connectionTokens reads a Connection value: whether it says close, and
// whether it names other headers (which then stay on their hop).
func connectionTokens(v []byte) (close, others bool) {
	for tok := range tokens(v) {
		switch {
		case asciiEqualFold(tok, "close"):
			close = true
		case !asciiEqualFold(tok, "keep-alive"):
			others = true
		}
	}
	return close, others
}

// chunkSize parses a chunk-size line ("1a;ext=v\r\n").
func chunkSize(line []byte) (int64, bool) {
	line = trimCR(line[:len(line)-1])
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return 0, false
	}
	var n int64
	for _, b := range line {
		switch {
		case '0' <= b && b <= '9':
			n = n<<4 | int64(b-'0')
		case 'a' <= b && b <= 'f':
			n = n<<4 | int64(b-'a'+10)
		case 'A' <= b && b <= 'F':
			n = n<<4 | int64(b-'A'+10)
		default:
			return 0, false
		}
	}
	return n, true
}

func trimCR(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\r' {
		return b[:len(b)-1]
	}
	return b
}

// parseLength parses a Content-Length value: digits only.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, b := range v {
		if b < '0' || b > '9' {
			return 0, false
		}
		n = n*10 + int64(b-'0')
	}
	return n, true
}

// text is a header value as the front end holds it (bytes) or net/http
// does (a string).
type text interface{ ~string | ~[]byte }

// tokens iterates over the comma-separated elements of a header value,
// trimmed.
func tokens[S text](v S) func(func(S) bool) {
	return func(yield func(S) bool) {
		for len(v) > 0 {
			tok := v
			i := 0
			for i < len(v) && v[i] != ',' {
				i++
			}
			if i < len(v) {
				tok, v = v[:i], v[i+1:]
			} else {
				v = v[:0]
			}
			if tok = trimOWS(tok); len(tok) > 0 && !yield(tok) {
				return
			}
		}
	}
}

// trimOWS trims spaces and tabs off both ends.
func trimOWS[S text](v S) S {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// lastCodingIs reports whether a Transfer-Encoding value's last coding is
// coding ("gzip, chunked": chunked).
func lastCodingIs[S text](te S, coding string) bool {
	i := len(te)
	for i > 0 && te[i-1] != ',' {
		i--
	}
	return asciiEqualFold(trimOWS(te[i:]), coding)
}

// connectionLists reports whether a Connection header among hdrs names
// the header name.
func connectionLists(b []byte, hdrs []hdrSpan, name []byte) bool {
	for _, s := range hdrs {
		if s.kind != kConnection {
			continue
		}
		for tok := range tokens(s.value(b)) {
			if bytes.EqualFold(tok, name) {
				return true
			}
		}
	}
	return false
}

// asciiEqualFold reports whether b is lower, ignoring ASCII case.
func asciiEqualFold[S text](b S, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// Header names the front end treats apart, looked up case-insensitively
// by headerName; requestKinds and replyKinds say what each is in a request
// and in a reply (kFwd, 0, for the rest).
const (
	hOther uint8 = iota
	hHost
	hContentLength
	hTransferEncoding
	hConnection
	hUpgrade
	hExpect
	hTe
	hTrailer
	hKeepAlive
	hProxyConnection
	hProxyAuthenticate
	hProxyAuthorization
	hXForwardedFor
	hXForwardedHost
	hXForwardedProto
	hXBriskSandbox
	hXBriskTiming
	hXCallID
	hIdempotencyKey
	hXIdempotencyKey
	hDate
	nHeaderNames
)

var headerNames = [nHeaderNames]string{
	hHost: "host", hContentLength: "content-length", hTransferEncoding: "transfer-encoding",
	hConnection: "connection", hUpgrade: "upgrade", hExpect: "expect", hTe: "te", hTrailer: "trailer",
	hKeepAlive: "keep-alive", hProxyConnection: "proxy-connection", hProxyAuthenticate: "proxy-authenticate",
	hProxyAuthorization: "proxy-authorization", hXForwardedFor: "x-forwarded-for", hXForwardedHost: "x-forwarded-host",
	hXForwardedProto: "x-forwarded-proto", hXBriskSandbox: "x-brisk-sandbox", hXBriskTiming: "x-brisk-timing",
	hXCallID: "x-call-id", hIdempotencyKey: "idempotency-key", hXIdempotencyKey: "x-idempotency-key", hDate: "date",
}

var (
	requestKinds = [nHeaderNames]uint8{
		hHost: kHost, hContentLength: kLength, hTransferEncoding: kHandoff, hConnection: kConnection,
		hUpgrade: kHandoff, hExpect: kHandoff, hTe: kTE, hTrailer: kDrop, hKeepAlive: kDrop,
		hProxyConnection: kDrop, hProxyAuthenticate: kDrop, hProxyAuthorization: kDrop,
		hXForwardedFor: kXFF, hXForwardedHost: kDrop, hXForwardedProto: kDrop, hXBriskSandbox: kDrop,
		hXCallID: kCallID, hIdempotencyKey: kIdem, hXIdempotencyKey: kIdem,
	}
	replyKinds = [nHeaderNames]uint8{
		hContentLength: kLength, hTransferEncoding: kTE, hConnection: kConnection, hUpgrade: kDrop,
		hTe: kDrop, hKeepAlive: kDrop, hProxyConnection: kDrop, hProxyAuthenticate: kDrop,
		hProxyAuthorization: kDrop, hXBriskSandbox: kDrop, hXBriskTiming: kDrop, hXCallID: kDrop, hDate: kDate,
	}
	// namesByLen lists the names of each length: a lookup compares one to
	// three of them.
	namesByLen = func() (t [20][]uint8) {
		for i := hOther + 1; i < nHeaderNames; i++ {
			t[len(headerNames[i])] = append(t[len(headerNames[i])], i)
		}
		return t
	}()
)

func headerName(name []byte) uint8 {
	if len(name) >= len(namesByLen) {
		return hOther
	}
	for _, i := range namesByLen[len(name)] {
		if asciiEqualFold(name, headerNames[i]) {
			return i
		}
	}
	return hOther
}

func requestKind(name []byte) uint8 { return requestKinds[headerName(name)] }

func replyKind(name []byte) uint8 { return replyKinds[headerName(name)] }

// tokenByte: the characters of an HTTP token (RFC 9110 section 5.6.2).
var tokenByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(b []byte) bool {
	for _, c := range b {
		if !tokenByte[c] {
			return false
		}
	}
	return len(b) > 0
}

// validValue: field content without control characters (tab aside).
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validHost: the Host values the front end takes as they are; anything
// else goes to net/http's checks.
func validHost(b []byte) bool {
	for _, c := range b {
		if !(tokenByte[c] && c != '%') && c != ':' && c != '[' && c != ']' {
			return false
		}
	}
	return true
}

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

// httpDate is a Date header line, made once a second.
type httpDate struct {
	sec  int64
	line []byte
}

var dateLine atomic.Pointer[httpDate]

func writeDate(bw *bufio.Writer) {
	now := time.Now()
	d := dateLine.Load()
	if d == nil || d.sec != now.Unix() {
		b := append([]byte("Date: "), now.UTC().AppendFormat(nil, http.TimeFormat)...)
		d = &httpDate{sec: now.Unix(), line: append(b, "\r\n"...)}
		dateLine.Store(d)
	}
	bw.Write(d.line)
}

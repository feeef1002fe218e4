package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Upstream is a caller's side of one call's trip, as httputil.ReverseProxy's
// hooks are: where it goes (Take, which may reroute or fail over), and what
// it sends (WriteRequest, the director).
type Upstream interface {
	// Take returns the connection for the call's attempt (Pool.Take: 0
	// may reuse a pooled one, later ones are replays on fresh ones). When
	// no connection can be made it may move the call to another upstream
	// and try there; its error ends the call with nothing sent.
	Take(ctx context.Context, attempt int, probe bool) (c *Conn, reused bool, err error)
	// WriteRequest writes the request's head to c.BW (with the body when
	// the call's Buffered is set, or the framing Call.Stream follows) and
	// flushes.
	WriteRequest(c *Conn) error
}

// ClientBody reads the client's request body and keeps its error apart from
// the upstream connection's.
type ClientBody struct {
	R   io.Reader
	Err error
}

func (b *ClientBody) Read(p []byte) (int, error) {
	n, err := b.R.Read(p)
	if err != nil && err != io.EOF {
		b.Err = err
	}
	return n, err
}

// TakeError is Upstream.Take's error: nothing of the call was sent.
type TakeError struct{ Err error }

func (e *TakeError) Error() string { return e.Err.Error() }
func (e *TakeError) Unwrap() error { return e.Err }

// BodyError is the client's request body failing (too large, too slow, the
// client gone): the caller answers the call itself.
type BodyError struct{ Err error }

func (e *BodyError) Error() string { return e.Err.Error() }
func (e *BodyError) Unwrap() error { return e.Err }

// Call is one request's trip over a pooled connection: Send writes it and
// reads the reply head, sending it again on a fresh connection when a
// reused one turns out closed; then the caller sets its headers
// (CopyHeader), writes the status and Finish relays the body.
type Call struct {
	Req *http.Request
	// Buffered: the body was read in full (Upstream.WriteRequest sends it
	// and a replay sends it again); otherwise Stream goes out beside the
	// reply's reading (nil: no body).
	Buffered bool
	Stream   *ClientBody
	Reply    Reply
	Conn     *Conn

	unwatch   func() bool
	streaming chan error // a streamed body's writer, while one runs
}

// Send sends the call and reads its reply's head, relaying interim replies
// to w. On failure the connection is closed and the error says what
// failed: a *TakeError (nothing sent), a *BodyError (the client's body),
// ctx's error (the client left: nothing to answer), or the upstream's.
func (x *Call) Send(ctx context.Context, w http.ResponseWriter, up Upstream) error {
	for attempt := 0; ; attempt++ {
		c, reused, err := up.Take(ctx, attempt, !x.Buffered)
		if err != nil {
			return &TakeError{err}
		}
		x.Conn = c
		x.unwatch = c.Watch(ctx)
		err = up.WriteRequest(c)
		sent := err == nil
		if sent && x.Stream != nil {
			// A streamed body goes out while the reply is read: an
			// upstream may answer before it has read it all (a 413 or 401
			// of its own), or stream its answer as it reads.
			_ = http.NewResponseController(w).EnableFullDuplex()
			x.streaming = make(chan error, 1)
			go streamBody(x.streaming, c, x.Req.ContentLength, x.Stream)
		}
		if sent {
			err = c.ReadHead(&x.Reply, w)
		}
		if err == nil {
			return nil
		}
		x.abandon()
		if x.Stream != nil && x.Stream.Err != nil { // the client's body failed, not the upstream
			return &BodyError{x.Stream.Err}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// A reused connection the upstream had closed: the call goes once
		// more on a new one, if it can be sent again and either did not
		// reach the upstream whole or may run twice (http.Transport's rule).
		if reused && x.Buffered && !x.Reply.Started && ClosedByPeer(err) && (!sent || Idempotent(x.Req)) {
			continue
		}
		return err
	}
}

// abandon ends the exchange: the connection is closed and a streamed
// body's writer awaited (the close ends its writes).
func (x *Call) abandon() {
	x.unwatch()
	x.Conn.NC.Close()
	if x.streaming != nil {
		<-x.streaming
		x.streaming = nil
	}
}

// streamBody sends the client's body behind the head WriteRequest wrote
// and reports on done. When the client's body fails (too large, the client
// gone), it ends the reply's reading too: the caller answers the call
// itself. When the upstream stops taking the body, the reply it may have
// sent is still read.
func streamBody(done chan<- error, c *Conn, n int64, cb *ClientBody) {
	buf := copyBufs.Get()
	err := SendBody(c.BW, n, cb, buf)
	copyBufs.Put(buf)
	if err != nil && cb.Err != nil {
		_ = c.NC.SetReadDeadline(LongAgo)
	}
	done <- err
}

// ErrBrokenOff is a reply that ended before its body did.
var ErrBrokenOff = errors.New("reply broken off")

// ReadSmall reads a small reply body of known length in full, into buf,
// before the status goes out: when the upstream dies in the middle of it,
// the client gets an error saying so, not a connection closed on it. It
// returns nil for a body that is not small. On failure the exchange is
// abandoned; the error wraps ErrBrokenOff, or is ctx's.
func (x *Call) ReadSmall(ctx context.Context, buf []byte) ([]byte, error) {
	small, err := ReadSmallBody(x.Conn.BR, &x.Reply, buf)
	if err == nil {
		return small, nil
	}
	x.abandon()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("%w: %w", ErrBrokenOff, err)
}

// CopyHeader copies the reply's end-to-end headers to h: not the
// hop-by-hop ones nor those its Connection header names. A reply without
// Content-Type gets none (no sniffing: a proxy adds no type of its own),
// one of unknown length no Content-Length.
func (x *Call) CopyHeader(h http.Header) {
	resp := &x.Reply
	conn := resp.Header["Connection"]
	for k, v := range resp.Header {
		if !HopByHop(k) && (conn == nil || !ListedIn(conn, k)) {
			h[k] = v
		}
	}
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil
	}
	if resp.Length < 0 {
		delete(h, "Content-Length")
	}
}

// Finish relays the reply's body (small, when ReadSmall read it) to w after
// the status, then returns the connection to its pool when it can carry
// another call. ok false: the reply broke off after the status went out
// (the caller aborts the client's connection so that a truncated reply
// shows as one); clientGone says the client was the one that left.
func (x *Call) Finish(ctx context.Context, w http.ResponseWriter, h http.Header, small []byte) (ok, clientGone bool) {
	resp, c := &x.Reply, x.Conn
	cw := ClientWriter{W: w, Flush: resp.Length < 0}
	ok = true
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
	// A streamed body the upstream did not read to the end is cut off (the
	// writer's next write fails); the connection then cannot carry another
	// call.
	bodySent := AwaitBodySent(x.streaming, c.NC)
	// The deadline stays set while the connection idles: every use sets
	// its own. A connection whose deadline the client's leaving moved is
	// not reused.
	if x.unwatch() && ok && resp.KeepAlive && bodySent {
		c.Put(resp.NoBody)
	} else {
		c.NC.Close()
	}
	return ok, !ok && (cw.Err != nil || ctx.Err() != nil)
}

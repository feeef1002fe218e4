package dataplane

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/internal/dataplane/front"
	"github.com/brisk-faas/brisk/internal/h1"
)

// The invocation listener's front end is internal/dataplane/front: the
// connections, their states and time limits, the TLS handshake and the
// handoff to net/http. The data plane serves each connection's requests
// as a front.Session, frontConn: it reads the common call itself and
// proxies it with no per-call allocation of its own (fastpath.go,
// fastasync.go).

// frontConn is one client connection's session: the call in hand.
type frontConn struct {
	*front.Conn
	d *DataPlane
	// charged is what the request in hand holds of the body budget.
	charged int64
	// up is the sandbox connection of the call in flight, which the client
	// watch aborts when it finds the client gone (ClientGone).
	up atomic.Pointer[upConn]

	head   []byte // the request head, copied out of BR
	body   []byte
	req    frontReq
	rbuf   []byte // a reply head, copied out of the sandbox connection
	rhdrs  []h1.Header
	st     reqState
	callID [32]byte
	// accepting ends the submit in hand's Queue.Accepting (fastasync.go).
	accepting func()
}

func (d *DataPlane) newFrontEnd(fallback *http.Server) *front.Server {
	return front.New(front.Config{
		MaxConnections:    d.cfg.MaxConnections,
		ReadHeaderTimeout: d.cfg.ReadHeaderTimeout,
		ReadTimeout:       d.cfg.ReadTimeout,
		IdleTimeout:       d.cfg.IdleTimeout,
		Now:               d.nanotime,
		Log:               d.log,
		Accepted:          d.prom.accepted,
		Refused:           d.prom.refused,
		HandedOff:         d.prom.handedOff,
		NewSession:        func(c *front.Conn) front.Session { return &frontConn{Conn: c, d: d} },
	}, fallback)
}

// Serve answers the connection's requests until it is to close or is
// handed to the net/http server.
func (c *frontConn) Serve() {
	for {
		fn, act := c.next()
		if act != actCall && c.accepting != nil {
			c.accepting()
			c.accepting = nil
		}
		switch act {
		case actClose:
			return
		case actHandoff:
			if c.Closing() {
				// net/http, shutting down, would drop it unanswered.
				c.refuse(failure{http.StatusServiceUnavailable, reasonShuttingDown, "the data plane is shutting down: call again"})
				return
			}
			c.HandOff()
			return
		}
		if !c.call(fn) || c.Closing() {
			return
		}
	}
}

// ClientGone ends the sandbox exchange of the call in flight: its client
// left.
func (c *frontConn) ClientGone() {
	if up := c.up.Load(); up != nil {
		up.Abort()
	}
}

// Release gives back the body budget the request in hand holds.
func (c *frontConn) Release() { c.uncharge() }

// refuse answers the request being read with a brisk error and closes the
// connection the way net/http does: its write side first, then a short wait
// for what the client still sends, so that the answer is not lost to a
// reset.
func (c *frontConn) refuse(f failure) {
	if !c.writeError(f, nil, false, false) {
		return
	}
	if cw, ok := c.NC.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		_ = c.NC.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.Copy(io.Discard, io.LimitReader(c.NC, 256<<10))
	}
}

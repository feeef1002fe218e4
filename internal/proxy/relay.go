package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/h1"
)

// The pieces of a proxy hop over brisk's own HTTP/1.1 client that the data
// plane (to its sandboxes) and the gateway (to its data planes) share:
// reading a reply head into net/http's terms, relaying interim replies,
// copying a body to a ResponseWriter, streaming a request body, and the
// rules for hop-by-hop headers and for when a call may be sent again.

// Relayable reports whether r can go over a plain HTTP/1.1 exchange; the
// rest (protocol upgrades, request trailers) take httputil.ReverseProxy.
func Relayable(r *http.Request) bool {
	_, upgrade := r.Header["Upgrade"]
	return !upgrade && r.Trailer == nil
}

// HopByHop reports the headers that belong to one connection, not to the
// call (RFC 9110 section 7.6.1).
func HopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// ListedIn reports whether comma-separated header values (Connection, Te)
// name k.
func ListedIn(vals []string, k string) bool {
	for _, v := range vals {
		for f := range h1.Tokens(v) {
			if strings.EqualFold(f, k) {
				return true
			}
		}
	}
	return false
}

// Idempotent: calls http.Transport would send again after a connection
// failure — safe methods, or a client's idempotency key.
func Idempotent(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, k1 := r.Header["Idempotency-Key"]
	_, k2 := r.Header["X-Idempotency-Key"]
	return k1 || k2
}

// IsDialError reports whether err is a failure to establish the TCP
// connection (refused, unreachable, dial timeout), before any byte of the
// request was written.
func IsDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// ClosedByPeer: the other end closed the connection (EOF, reset, broken
// pipe).
func ClosedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// PeekAlive peeks at an idle connection without blocking: nothing to read
// means the other end still holds it open; end of stream or stray bytes (a
// 408 before closing) mean it is done. The caller checks its own read
// buffer first.
func PeekAlive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	if nc.SetReadDeadline(time.Time{}) != nil { // an expired deadline would refuse the peek
		return false
	}
	alive := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, perr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		alive = perr == syscall.EAGAIN
		return true
	})
	return err == nil && alive
}

// Reply is a parsed reply head.
type Reply struct {
	Code      int
	Header    http.Header
	Length    int64 // -1: unknown (chunked or until close)
	Chunked   bool
	NoBody    bool
	KeepAlive bool
	Started   bool // a byte of the reply arrived
}

// ReadReply reads a reply's status line and headers from br (h1.ReadHead,
// h1.ParseReplyHead: the data plane front end's rules) into r, reusing *buf
// and p. head says the request was a HEAD. Interim replies (103 Early
// Hints, 102 Processing) are passed on to w as they come; a 100 Continue is
// not (the client's own came from the server).
func ReadReply(br *bufio.Reader, buf *[]byte, p *h1.ReplyHead, head bool, r *Reply, w http.ResponseWriter) error {
	*r = Reply{}
	for interim := 0; ; interim++ {
		if interim > h1.MaxInterim {
			return h1.ErrTooManyInterim
		}
		var err error
		var started bool
		*buf, started, err = h1.ReadHead(br, (*buf)[:0])
		r.Started = r.Started || started
		if err != nil {
			return err
		}
		b := *buf
		if err := h1.ParseReplyHead(b, p); err != nil {
			return err
		}
		code := p.Code
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			if code != http.StatusContinue && w != nil {
				RelayInterim(w, code, HeaderMap(b, p.Hdrs))
			}
			continue // the final reply follows
		}
		r.Code, r.Header, r.Length = code, HeaderMap(b, p.Hdrs), p.Length
		r.KeepAlive = p.KeepAlive
		switch {
		case code == http.StatusSwitchingProtocols:
			return errors.New("switched protocols on a call that did not ask to")
		case head, code == http.StatusNoContent, code == http.StatusNotModified:
			r.NoBody, r.Length = true, 0
		case p.Chunked:
			r.Chunked = true
		case p.Length < 0:
			r.KeepAlive = false // read until close
		}
		if cap(b) > 16<<10 {
			*buf = nil // a large head: do not keep its buffer with an idle connection
		}
		return nil
	}
}

// HeaderMap makes the header map of a parsed head: names canonical,
// values substrings of one copy of the head, one backing array for them
// (as textproto.Reader.ReadMIMEHeader does).
func HeaderMap(b []byte, hdrs []h1.Header) http.Header {
	m := make(http.Header, len(hdrs))
	if len(hdrs) == 0 {
		return m
	}
	s := string(b)
	strs := make([]string, len(hdrs))
	for _, x := range hdrs {
		k := s[x.NS:x.NE]
		if !canonicalKey(k) {
			k = textproto.CanonicalMIMEHeaderKey(k)
		}
		v := s[x.VS:x.VE]
		if vv := m[k]; vv != nil {
			m[k] = append(vv, v)
			continue
		}
		strs[0] = v
		m[k], strs = strs[:1:1], strs[1:]
	}
	return m
}

// canonicalKey reports whether k is in canonical form already (upper
// case after a hyphen or at the start, lower case elsewhere).
func canonicalKey(k string) bool {
	upper := true
	for i := 0; i < len(k); i++ {
		c := k[i]
		if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
			return false
		}
		upper = c == '-'
	}
	return true
}

// RelayInterim sends one interim reply with its own headers; net/http
// writes a 1xx at once and leaves the header map for the final reply, so
// it is emptied again.
func RelayInterim(w http.ResponseWriter, code int, hdr http.Header) {
	h := w.Header()
	for k, v := range hdr {
		if !HopByHop(k) {
			h[k] = v
		}
	}
	w.WriteHeader(code)
	clear(h)
}

// CopyTrailers adds the trailers a chunked body ended with (declared or
// not, less hop-by-hop ones and the data plane's own) to h as the client's
// trailers.
func CopyTrailers(h http.Header, cr *h1.ChunkedReader) {
	for _, x := range cr.TrailerHdrs {
		if x.Kind == h1.Fwd {
			k := http.TrailerPrefix + textproto.CanonicalMIMEHeaderKey(string(x.Name(cr.Trailer)))
			h[k] = append(h[k], string(x.Value(cr.Trailer)))
		}
	}
}

// ClientWriter writes a reply to the client, flushing each piece when
// asked (a reply of unknown length may be a stream), and keeps the client's
// error apart from the upstream's.
type ClientWriter struct {
	W     http.ResponseWriter
	Flush bool
	Err   error
}

func (cw *ClientWriter) Write(p []byte) (int, error) {
	n, err := cw.W.Write(p)
	if err == nil && cw.Flush {
		err = http.NewResponseController(cw.W).Flush()
	}
	if err != nil {
		cw.Err = err
	}
	return n, err
}

// CopyTo copies n bytes of src (all of it when n < 0) to cw and reports
// whether they all arrived and went out. It is io.Copy without the
// interface conversion of cw, which would move it to the heap on every
// call.
func CopyTo(cw *ClientWriter, src io.Reader, n int64, buf []byte) bool {
	for n != 0 {
		p := buf
		if n > 0 && int64(len(p)) > n {
			p = p[:n]
		}
		k, err := src.Read(p)
		if k > 0 {
			if _, werr := cw.Write(p[:k]); werr != nil {
				return false
			}
			if n > 0 {
				n -= int64(k)
			}
		}
		if err == io.EOF {
			return n <= 0
		}
		if err != nil {
			return false
		}
	}
	return true
}

// SendBody sends a request body behind a head already written to bw: n
// bytes of src when n > 0, else all of src as chunks. buf is a copy buffer.
func SendBody(bw *bufio.Writer, n int64, src io.Reader, buf []byte) error {
	if n > 0 {
		if _, err := io.CopyN(bw, src, n); err != nil {
			return err
		}
		return bw.Flush()
	}
	// Each piece goes out as it arrives: a client and a function may talk
	// over one call (a stream up, answers down).
	cw := httputil.NewChunkedWriter(bw)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if _, werr := cw.Write(buf[:k]); werr != nil {
				return werr
			}
			if werr := bw.Flush(); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	bw.WriteString("0\r\n\r\n")
	return bw.Flush()
}

// WriteForwardedHeaders writes the header lines a proxy passes on from a
// request: h's end-to-end headers (less hop-by-hop ones, those Connection
// names, and the names in skip), "Te: trailers" when asked for, then
// "X-Forwarded-For: " with the values h carries, each followed by ", ". It
// returns the client's host (from remoteAddr), which the caller writes next
// to end that line.
func WriteForwardedHeaders(bw *bufio.Writer, h http.Header, remoteAddr string, skip ...string) string {
	conn := h["Connection"]
	for k, vv := range h {
		switch k {
		case "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Content-Length", "Host":
			continue
		case "Te":
			if ListedIn(vv, "trailers") {
				bw.WriteString("Te: trailers\r\n")
			}
			continue
		}
		if HopByHop(k) || (conn != nil && ListedIn(conn, k)) || slices.Contains(skip, k) {
			continue
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString("X-Forwarded-For: ")
	for _, v := range h["X-Forwarded-For"] {
		bw.WriteString(v)
		bw.WriteString(", ")
	}
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return host
	}
	return remoteAddr
}

// LongAgo is a deadline in the past: setting it ends a connection's
// blocked reads or writes at once.
var LongAgo = time.Unix(1, 0)

// SmallReply is the largest reply body a proxy's net/http path reads in full
// before the reply's status goes out (one copy buffer): when the upstream
// breaks off inside it, the client can still get a 502 saying so.
const SmallReply = copyBufSize

// ReadSmallBody reads r's body from br into buf when it is small (known,
// non-zero length up to SmallReply) and returns it; nil when the body is
// not small. A body cut short is io.ErrUnexpectedEOF.
func ReadSmallBody(br *bufio.Reader, r *Reply, buf []byte) ([]byte, error) {
	if r.NoBody || r.Chunked || r.Length <= 0 || r.Length > SmallReply {
		return nil, nil
	}
	body := buf[:r.Length]
	if _, err := io.ReadFull(br, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// AwaitBodySent waits for the writer of a streamed request body (streaming
// nil: there was none) once the reply is relayed, and reports whether the
// whole body went out. One the upstream did not read to its end is cut off
// (nc's next write fails): the connection cannot carry another call then.
func AwaitBodySent(streaming <-chan error, nc net.Conn) bool {
	if streaming == nil {
		return true
	}
	select {
	case err := <-streaming:
		return err == nil
	default:
		_ = nc.SetWriteDeadline(LongAgo)
		<-streaming
		return false
	}
}

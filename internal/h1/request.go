package h1

import (
	"bytes"
	"errors"
)

// Errors ParseRequestHead returns. A caller that can fall back to net/http
// hands it the request for either; neither allocates.
var (
	// ErrMalformed: input h1 refuses (net/http may still take it).
	ErrMalformed = errors.New("h1: malformed or unsupported request head")
	// ErrHandoff: a well-formed request with a header the minimal path
	// does not serve (Upgrade, Expect).
	ErrHandoff = errors.New("h1: request needs the full server")
)

// HeadEnd looks for the blank line that ends a request head in buf,
// scanning from from (a line start). It returns the head's length, or 0 and
// where to resume once more has arrived, or -1 for a head h1 refuses (a
// bare LF line ending, leading blank lines).
func HeadEnd(buf []byte, from int) (int, int) {
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

// RequestHead is a parsed request head; its slices point into the buffer
// it was parsed from.
type RequestHead struct {
	Method, Target []byte
	Path, Query    []byte // Target split at its '?'
	Host           []byte
	CallID         []byte // the first X-Call-Id; nil: none
	Authorization  []byte // the first Authorization; nil: none
	Length         int64  // Content-Length; 0 when absent or chunked
	Hdrs           []Header
	HasLength      bool
	Chunked        bool // Transfer-Encoding: chunked
	Close          bool // Connection: close
	ConnTokens     bool // Connection names other headers: drop them
	TE             bool // Te: trailers
	IdemKey        bool // an Idempotency-Key or X-Idempotency-Key header
	IsHead         bool // the method is HEAD
}

// ParseRequestHead parses b, a whole request head as HeadEnd found it
// (request line, header lines, blank line, CRLF endings), into r, reusing
// r.Hdrs's storage. It takes HTTP/1.1 requests in origin form whose target
// has no escapes, fragment or odd bytes, with one Host, at most one
// Content-Length or a lone "Transfer-Encoding: chunked" (not both), header
// values without control characters and no line folding. Anything else is
// ErrMalformed, and a request with Upgrade or Expect ErrHandoff.
func ParseRequestHead(b []byte, r *RequestHead) error {
	*r = RequestHead{Hdrs: r.Hdrs[:0]}
	eol := bytes.IndexByte(b, '\n')
	if eol < 1 || b[eol-1] != '\r' {
		return ErrMalformed
	}
	line := b[:eol-1]
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || !IsToken(line[:sp]) {
		return ErrMalformed
	}
	r.Method = line[:sp]
	line = line[sp+1:]
	sp = bytes.IndexByte(line, ' ')
	if sp <= 0 || string(line[sp+1:]) != "HTTP/1.1" || line[0] != '/' {
		return ErrMalformed
	}
	target := line[:sp]
	for _, c := range target {
		if c <= ' ' || c >= 0x7f || c == '%' || c == '#' {
			return ErrMalformed // escapes, fragments, odd bytes: net/http's parser decides
		}
	}
	r.Target, r.Path = target, target
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		r.Path, r.Query = target[:q], target[q+1:]
	}
	r.IsHead = string(r.Method) == "HEAD"

	hasHost, hasTE := false, false
	for pos := eol + 1; ; {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 1 || b[pos+i-1] != '\r' {
			return ErrMalformed
		}
		eol = pos + i
		line := b[pos : eol-1]
		if len(line) == 0 {
			break
		}
		colon, vs, ve, ok := SplitHeader(line)
		value := line[vs:ve]
		if !ok || !ValidValue(value) {
			return ErrMalformed
		}
		kind := RequestKind(line[:colon])
		switch kind {
		case Handoff:
			return ErrHandoff
		case Host:
			if hasHost || !ValidHost(value) {
				return ErrMalformed
			}
			r.Host, hasHost = value, true
		case Length:
			n, ok := ParseLength(value)
			if r.HasLength || !ok {
				return ErrMalformed
			}
			r.Length, r.HasLength = n, true
		case TransferEncoding:
			if hasTE || !EqualFold(value, "chunked") {
				return ErrMalformed
			}
			r.Chunked, hasTE = true, true
		case Connection:
			cl, others := ConnectionTokens(value)
			r.Close, r.ConnTokens = r.Close || cl, r.ConnTokens || others
		case TE:
			for tok := range Tokens(value) {
				if EqualFold(tok, "trailers") {
					r.TE = true
				}
			}
		case CallID:
			if r.CallID == nil {
				r.CallID = value
			}
		case Authorization:
			if r.Authorization == nil {
				r.Authorization = value
			}
		case Idem:
			r.IdemKey = true
		}
		r.Hdrs = append(r.Hdrs, Header{NS: int32(pos), NE: int32(pos + colon), VS: int32(pos + vs), VE: int32(pos + ve), Kind: kind})
		pos = eol + 1
	}
	if !hasHost || (r.Chunked && r.HasLength) {
		return ErrMalformed // both framings: a smuggling form (RFC 9112 section 6.3)
	}
	return nil
}

// HTTP10WithTransferEncoding reports whether head, a whole request head,
// is an HTTP/1.0 request with a Transfer-Encoding header. RFC 9112 section
// 6.1 has such a message's framing treated as faulty and the connection
// closed after it; net/http instead ignores the header, so on a kept-alive
// connection it would read a chunked body as the next request.
func HTTP10WithTransferEncoding(head []byte) bool {
	eol := bytes.IndexByte(head, '\n')
	if eol < 1 || !bytes.HasSuffix(bytes.TrimSuffix(head[:eol], []byte("\r")), []byte(" HTTP/1.0")) {
		return false
	}
	for pos := eol + 1; pos < len(head); {
		i := bytes.IndexByte(head[pos:], '\n')
		if i < 0 {
			break
		}
		line := head[pos : pos+i]
		if colon := bytes.IndexByte(line, ':'); colon > 0 && EqualFold(bytes.TrimSpace(line[:colon]), "transfer-encoding") {
			return true
		}
		pos += i + 1
	}
	return false
}

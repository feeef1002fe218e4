package h1

import (
	"bufio"
	"bytes"
	"errors"
)

// MaxReplyHead bounds a reply head ReadHead reads.
const MaxReplyHead = 1 << 20

// MaxInterim bounds the interim (1xx) replies relayed before a final one:
// a function sending them without end would hold the call and flood its
// client. (net/http's client allows 5.)
const MaxInterim = 16

// ErrTooManyInterim: a reply sent more than MaxInterim interim replies.
var ErrTooManyInterim = errors.New("malformed reply: too many interim (1xx) replies")

var (
	errHeadTooLarge  = errors.New("malformed reply: head larger than 1 MiB")
	errStatusLine    = errors.New("malformed reply status line")
	errStatusCode    = errors.New("malformed reply status code")
	errFolding       = errors.New("malformed reply: obsolete line folding")
	errHeaderLine    = errors.New("malformed reply header line")
	errHeaderValue   = errors.New("malformed reply header value")
	errReplyLength   = errors.New("malformed reply Content-Length")
	errReplyEncoding = errors.New("malformed reply: unsupported Transfer-Encoding")
)

// ReadHead reads one head (a status or request line, header lines, the
// blank line) from br and appends it to buf, which it returns. started
// reports whether any byte of it arrived (a connection closed before a
// reply versus one closed during it). A head longer than MaxReplyHead is
// an error.
func ReadHead(br *bufio.Reader, buf []byte) (head []byte, started bool, err error) {
	start := len(buf)
	lineStart := start
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			started = true
		}
		buf = append(buf, line...)
		if len(buf)-start > MaxReplyHead {
			return buf, started, errHeadTooLarge
		}
		if err == bufio.ErrBufferFull {
			continue // a long line: read on
		}
		if err != nil {
			return buf, started, err
		}
		if n := len(buf) - lineStart; n <= 2 && (n == 1 || buf[lineStart] == '\r') {
			return buf, started, nil // the blank line
		}
		lineStart = len(buf)
	}
}

// ReplyHead is a parsed reply head; its slices point into the buffer it
// was parsed from.
type ReplyHead struct {
	Code   int
	Status []byte // "200 OK": the code and reason as received
	Hdrs   []Header
	// Length is the Content-Length, -1 without one (or with a chunked
	// body: Chunked).
	Length     int64
	Chunked    bool // Transfer-Encoding: chunked
	KeepAlive  bool // HTTP/1.1 without Connection: close (nor both framings)
	ConnTokens bool // Connection names other headers: drop them
	HasDate    bool
}

// ParseReplyHead parses the head in b (status line, header lines, blank
// line, as ReadHead read it) into r, reusing r.Hdrs's storage. Line
// endings may be CRLF or a bare LF. It refuses obsolete line folding,
// control characters, conflicting or malformed Content-Length and any
// Transfer-Encoding but a lone "chunked" (net/http refuses those too). A
// reply with both Content-Length and a chunked Transfer-Encoding is read
// as chunked, and the connection is not kept (KeepAlive false).
func ParseReplyHead(b []byte, r *ReplyHead) error {
	*r = ReplyHead{Hdrs: r.Hdrs[:0]}
	eol := bytes.IndexByte(b, '\n')
	if eol < 0 {
		return errStatusLine
	}
	line := trimCR(b[:eol])
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' {
		return errStatusLine
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return errStatusCode
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 || (len(line) > 12 && line[12] != ' ') {
		return errStatusCode
	}
	if !ValidValue(line) {
		return errStatusLine
	}
	http11 := line[7] == '1'
	r.Code, r.Status, r.Length = code, line[9:], -1
	r.KeepAlive = http11
	hasLength, hasTE := false, false
	var length []byte
	for pos := eol + 1; ; {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			return errHeaderLine // no blank line
		}
		eol = pos + i
		line := trimCR(b[pos:eol])
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return errFolding
		}
		colon, vs, ve, ok := SplitHeader(line)
		if !ok {
			return errHeaderLine
		}
		value := line[vs:ve]
		if !ValidValue(value) {
			return errHeaderValue
		}
		kind := ReplyKind(line[:colon])
		switch kind {
		case Connection:
			cl, others := ConnectionTokens(value)
			r.KeepAlive, r.ConnTokens = r.KeepAlive && !cl, r.ConnTokens || others
		case Length:
			n, ok := ParseLength(value)
			if !ok || (hasLength && !bytes.Equal(value, length)) {
				return errReplyLength
			}
			r.Length, length, hasLength = n, value, true
		case TransferEncoding:
			// net/http takes only one, "chunked", and ignores it in
			// an HTTP/1.0 reply; h1 refuses that too.
			if hasTE || !http11 || !EqualFold(value, "chunked") {
				return errReplyEncoding
			}
			r.Chunked, hasTE = true, true
		case Date:
			r.HasDate = true
		}
		r.Hdrs = append(r.Hdrs, Header{NS: int32(pos), NE: int32(pos + colon), VS: int32(pos + vs), VE: int32(pos + ve), Kind: kind})
		pos = eol + 1
	}
	if r.Chunked {
		if hasLength {
			r.KeepAlive = false // both framings: chunked wins, the connection ends
		}
		r.Length = -1
	}
	return nil
}

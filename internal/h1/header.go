package h1

import "bytes"

// Kind classes a header line by what a proxy does with it.
type Kind uint8

const (
	Fwd              Kind = iota // passed on
	Drop                         // hop-by-hop, or replaced by the proxy's own
	Handoff                      // request: a header the minimal path does not serve (Upgrade, Expect, Prefer)
	Host                         // request: Host
	Length                       // Content-Length
	Connection                   // Connection
	TE                           // request: Te
	TransferEncoding             // Transfer-Encoding
	XFF                          // request: X-Forwarded-For
	CallID                       // request: X-Call-Id
	Idem                         // request: an idempotency key (passed on; the call may be sent twice)
	Date                         // reply: Date
	Authorization                // request: Authorization (the platform's token, or the function's own)
)

// Header is one header line: its name and trimmed value as offsets into a
// head buffer.
type Header struct {
	NS, NE, VS, VE int32
	Kind           Kind
}

// Name returns the header's name in b, the buffer it was parsed from.
func (s Header) Name(b []byte) []byte { return b[s.NS:s.NE] }

// Value returns the header's value in b, trimmed of spaces and tabs.
func (s Header) Value(b []byte) []byte { return b[s.VS:s.VE] }

// Header names the proxies treat apart, looked up case-insensitively by
// headerName; requestKinds and replyKinds say what each is in a request
// and in a reply (Fwd, 0, for the rest).
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
	hAuthorization
	hPrefer
	hXStartTime
	nHeaderNames
)

var headerNames = [nHeaderNames]string{
	hHost: "host", hContentLength: "content-length", hTransferEncoding: "transfer-encoding",
	hConnection: "connection", hUpgrade: "upgrade", hExpect: "expect", hTe: "te", hTrailer: "trailer",
	hKeepAlive: "keep-alive", hProxyConnection: "proxy-connection", hProxyAuthenticate: "proxy-authenticate",
	hProxyAuthorization: "proxy-authorization", hXForwardedFor: "x-forwarded-for", hXForwardedHost: "x-forwarded-host",
	hXForwardedProto: "x-forwarded-proto", hXBriskSandbox: "x-brisk-sandbox", hXBriskTiming: "x-brisk-timing",
	hXCallID: "x-call-id", hIdempotencyKey: "idempotency-key", hXIdempotencyKey: "x-idempotency-key", hDate: "date",
	hAuthorization: "authorization", hPrefer: "prefer", hXStartTime: "x-start-time",
}

var (
	requestKinds = [nHeaderNames]Kind{
		hHost: Host, hContentLength: Length, hTransferEncoding: TransferEncoding, hConnection: Connection,
		hUpgrade: Handoff, hExpect: Handoff, hTe: TE, hTrailer: Drop, hKeepAlive: Drop,
		hProxyConnection: Drop, hProxyAuthenticate: Drop, hProxyAuthorization: Drop,
		hXForwardedFor: XFF, hXForwardedHost: Drop, hXForwardedProto: Drop, hXBriskSandbox: Drop,
		hXCallID: CallID, hIdempotencyKey: Idem, hXIdempotencyKey: Idem, hAuthorization: Authorization,
		hPrefer: Handoff, // Prefer: respond-async makes a call asynchronous (the data plane's net/http path)
	}
	replyKinds = [nHeaderNames]Kind{
		hContentLength: Length, hTransferEncoding: TransferEncoding, hConnection: Connection, hUpgrade: Drop,
		hTe: Drop, hKeepAlive: Drop, hProxyConnection: Drop, hProxyAuthenticate: Drop,
		hProxyAuthorization: Drop, hXBriskSandbox: Drop, hXBriskTiming: Drop, hXCallID: Drop, hDate: Date,
		hXStartTime: Drop, // the data plane sends its own
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
		if EqualFold(name, headerNames[i]) {
			return i
		}
	}
	return hOther
}

// RequestKind classes a request header by its name: hop-by-hop ones and
// those the data plane sets itself are Drop, framing and routing ones have
// their own kinds, the rest are Fwd.
func RequestKind(name []byte) Kind { return requestKinds[headerName(name)] }

// ReplyKind classes a reply (or trailer) header by its name, as
// RequestKind does.
func ReplyKind(name []byte) Kind { return replyKinds[headerName(name)] }

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

// IsToken reports whether b is a non-empty HTTP token (a method, a header
// name).
func IsToken(b []byte) bool {
	for _, c := range b {
		if !tokenByte[c] {
			return false
		}
	}
	return len(b) > 0
}

// ValidValue reports whether b is field content without control
// characters (tab aside).
func ValidValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// ValidHost reports whether b is a Host value the parser takes as it is
// (letters, digits, token punctuation but '%', ':' and brackets); anything
// else is left to net/http's checks.
func ValidHost(b []byte) bool {
	for _, c := range b {
		if !(tokenByte[c] && c != '%') && c != ':' && c != '[' && c != ']' {
			return false
		}
	}
	return true
}

// SplitHeader splits a header line (without its line ending) at its colon:
// the name (line[:colon]) must be a token, and the value (line[vs:ve]) is
// trimmed of spaces and tabs.
func SplitHeader(line []byte) (colon, vs, ve int, ok bool) {
	colon = bytes.IndexByte(line, ':')
	if colon <= 0 || !IsToken(line[:colon]) {
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

// ConnectionTokens reads a Connection value: whether it says close, and
// whether it names other headers (which then stay on their hop).
func ConnectionTokens(v []byte) (close, others bool) {
	for tok := range Tokens(v) {
		switch {
		case EqualFold(tok, "close"):
			close = true
		case !EqualFold(tok, "keep-alive"):
			others = true
		}
	}
	return close, others
}

// ConnectionLists reports whether a Connection header among hdrs (spans
// of b) names the header name.
func ConnectionLists(b []byte, hdrs []Header, name []byte) bool {
	for _, s := range hdrs {
		if s.Kind != Connection {
			continue
		}
		for tok := range Tokens(s.Value(b)) {
			if bytes.EqualFold(tok, name) {
				return true
			}
		}
	}
	return false
}

// Text is a header value as h1 holds it (bytes) or net/http does (a
// string).
type Text interface{ ~string | ~[]byte }

// Tokens iterates over the comma-separated elements of a header value,
// trimmed; empty ones are skipped.
func Tokens[S Text](v S) func(func(S) bool) {
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
			if tok = TrimOWS(tok); len(tok) > 0 && !yield(tok) {
				return
			}
		}
	}
}

// TrimOWS trims spaces and tabs off both ends.
func TrimOWS[S Text](v S) S {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// LastCodingIs reports whether a Transfer-Encoding value's last coding is
// coding, given in lower case ("gzip, chunked": chunked).
func LastCodingIs[S Text](te S, coding string) bool {
	i := len(te)
	for i > 0 && te[i-1] != ',' {
		i--
	}
	return EqualFold(TrimOWS(te[i:]), coding)
}

// EqualFold reports whether b is lower, ignoring ASCII case; lower must be
// in lower case.
func EqualFold[S Text](b S, lower string) bool {
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

// ParseLength parses a Content-Length value: 1 to 18 digits, nothing else.
func ParseLength(v []byte) (int64, bool) {
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

func trimCR(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] == '\r' {
		return b[:len(b)-1]
	}
	return b
}

// Package h1 is brisk's own HTTP/1.1 wire code: the byte-level parsing and
// framing that its proxies do without net/http's allocations. It parses a
// request head (ParseRequestHead) and a reply head (ParseReplyHead) in place,
// header lines kept as offsets (Header) into the caller's buffer and
// classified by name (RequestKind, ReplyKind); it finds a head's end
// (HeadEnd, ReadHead) and relays a reply body as it is framed (CopyFixed,
// CopyChunks, which re-frames a chunked body, CopyUntilClose) or decodes a
// chunked one (ChunkedReader). Nothing on these paths allocates.
//
// h1 is strict: it takes a subset of what net/http takes and refuses the
// rest (bare LF line endings, obsolete line folding, a Transfer-Encoding
// other than a lone "chunked", Content-Length and Transfer-Encoding
// together in a request, conflicting or malformed Content-Length, control
// characters in values, chunk lines net/http would refuse). Refusing is
// safe: the data plane's front end hands a request h1 refuses to net/http,
// and a reply h1 refuses is a sandbox failure (502). The differential fuzz
// targets in this package hold h1 to that: whatever h1 accepts, net/http
// accepts with the same meaning (method, target, host, framing, length,
// header values, decoded body and trailers).
//
// Users: the data plane's front end (internal/dataplane/fastpath.go) parses
// every request and reply with it and relays reply bodies with its copiers;
// the data plane's net/http path (upstream.go) reads sandbox reply heads with
// ReadHead and ParseReplyHead and decodes chunked replies with ChunkedReader,
// so both paths take and refuse the same replies. The gateway reads its data
// planes' replies the same way (internal/proxy.ReadReply, shared with
// upstream.go); its client side stays net/http.
package h1

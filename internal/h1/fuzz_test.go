package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"
)

// The differential fuzz targets: whatever h1 accepts, net/http accepts
// with the same meaning; h1 may refuse more (a refused request goes to
// net/http, a refused reply is a sandbox failure). `make test` runs each
// for a bounded time; `go test` runs their seeds (f.Add below and
// testdata/fuzz/<target>/).

// Smuggling forms and other edges, for the request and reply targets.
var headSeeds = []string{
	"GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /function/f/a?b=c HTTP/1.1\r\nHost: f.example.com\r\nContent-Length: 2\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\nhi",
	"GET / HTTP/1.1\r\nHost: f:80\r\nTe: trailers\r\nX-Call-Id: 1\r\nX-Forwarded-For: a\r\nIdempotency-Key: k\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \x0bchunked\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
	"GET / HTTP/1.1\nHost: x\n\n",
	"GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
	"GET /%2e%2e/x HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET //x/y HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET http://x/y HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: x\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
	"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
}

var replySeeds = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n",
	"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
	"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
	"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
	"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n",
	"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\n",
	"HTTP/1.1 200\r\n\r\n",
	"HTTP/1.1 099 Odd\r\n\r\n",
	"HTTP/1.2 200 OK\r\n\r\n",
	"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n",
}

// Chunked bodies (after the head): extensions, oversized sizes, bare LF,
// trailers, smuggled framing.
var chunkSeeds = []string{
	"5\r\nhello\r\n0\r\n\r\n",
	"5;ext=v\r\nhello\r\n6;a;b=\"c\"\r\n world\r\n0\r\n\r\n",
	"5 \r\nhello\r\n0\r\n\r\n",
	"5 ;x\r\nhello\r\n0\r\n\r\n",
	"5\nhello\r\n0\r\n\r\n",
	"5\r\nhello\n0\r\n\r\n",
	"5\r\nhelloXY0\r\n\r\n",
	"5;x\rQ\r\nhello\r\n0\r\n\r\n",
	"fffffffffffffff\r\nx",
	"ffffffffffffffff\r\nx",
	"10000000000000000\r\nx",
	"-5\r\nhello\r\n0\r\n\r\n",
	"0x5\r\nhello\r\n0\r\n\r\n",
	"\r\n",
	"0\r\nX-Ok: yes\r\nX-Call-Id: spoof\r\nContent-Length: 9\r\n\r\n",
	"0\r\nBad Name: x\r\n\r\n",
	"0\r\nX-A: 1\r\n folded\r\n\r\n",
	"0\r\nX-A: 1\n\r\n",
	"0\r\nX-A: a\x01b\r\n\r\n",
	"0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
	"0\r\n",
	"3\r\nabc",
	"1;" + strings.Repeat("e", 4090) + "\r\nx\r\n0\r\n\r\n",
	"0\r\nX-Long: " + strings.Repeat("v", 4090) + "\r\n\r\n",
}

// FuzzRequestHead: a request head h1 takes is one net/http takes, with the
// same method, target, Host, framing, Connection: close and header values.
func FuzzRequestHead(f *testing.F) {
	for _, s := range headSeeds {
		f.Add([]byte(s))
	}
	var r RequestHead
	f.Fuzz(func(t *testing.T, b []byte) {
		head := b
		if end, _ := HeadEnd(b, 0); end > 0 {
			head = b[:end]
		}
		if ParseRequestHead(head, &r) != nil {
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
		if err != nil {
			t.Fatalf("h1 takes %q, net/http refuses it: %v", head, err)
		}
		switch {
		case req.Method != string(r.Method) || req.RequestURI != string(r.Target) || req.Host != string(r.Host):
			t.Fatalf("%q: h1 %q %q host %q, net/http %q %q host %q", head, r.Method, r.Target, r.Host, req.Method, req.RequestURI, req.Host)
		case r.Chunked != (len(req.TransferEncoding) == 1 && req.TransferEncoding[0] == "chunked"):
			t.Fatalf("%q: chunked %v, net/http %q", head, r.Chunked, req.TransferEncoding)
		case r.Chunked && req.ContentLength != -1, !r.Chunked && req.ContentLength != r.Length:
			t.Fatalf("%q: length %d, net/http %d", head, r.Length, req.ContentLength)
		case r.Close != req.Close:
			t.Fatalf("%q: close %v, net/http %v", head, r.Close, req.Close)
		}
		sameHeaders(t, head, head, r.Hdrs, req.Header, "Host", "Transfer-Encoding")
	})
}

// FuzzReplyHead: a reply head h1 takes is one net/http takes, with the
// same status, framing, length and header values, and a connection h1
// keeps is one net/http keeps.
func FuzzReplyHead(f *testing.F) {
	for _, s := range replySeeds {
		f.Add([]byte(s))
	}
	var r ReplyHead
	f.Fuzz(func(t *testing.T, b []byte) {
		head, _, err := ReadHead(bufio.NewReader(bytes.NewReader(b)), nil)
		if err != nil || ParseReplyHead(head, &r) != nil {
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(head)), nil)
		if err != nil {
			t.Fatalf("h1 takes %q, net/http refuses it: %v", head, err)
		}
		if resp.StatusCode != r.Code || !strings.HasPrefix(string(r.Status), resp.Status[:3]) {
			t.Fatalf("%q: status %q, net/http %q", head, r.Status, resp.Status)
		}
		bodyless := r.Code < 200 || r.Code == 204 || r.Code == 304
		if r.KeepAlive && (r.Chunked || r.Length >= 0 || bodyless) && resp.Close {
			t.Fatalf("%q: h1 keeps the connection, net/http closes it", head)
		}
		if !bodyless {
			chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"
			if r.Chunked != chunked || (!r.Chunked && resp.ContentLength != r.Length) {
				t.Fatalf("%q: chunked %v length %d, net/http %q %d", head, r.Chunked, r.Length, resp.TransferEncoding, resp.ContentLength)
			}
		}
		// net/http drops a reply's Connection header once it has read it.
		sameHeaders(t, head, head, r.Hdrs, resp.Header, "Transfer-Encoding", "Content-Length", "Connection")
	})
}

// FuzzChunked: h1's re-framing of a chunked body (CopyChunks) and its
// decoder (ChunkedReader) agree with each other and with net/http's
// reader: h1 refuses whatever net/http refuses; what h1 takes decodes to
// the same bytes, its forwarded trailers are net/http's, and its output
// is a chunked body net/http reads back to the same bytes and trailers.
func FuzzChunked(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s))
	}
	const head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	readStd := func(body []byte) ([]byte, http.Header, error) {
		resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(head), bytes.NewReader(body))), nil)
		if err != nil {
			return nil, nil, err
		}
		data, err := io.ReadAll(resp.Body)
		return data, resp.Trailer, err
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		upErr, downErr := CopyChunks(bw, bufio.NewReader(bytes.NewReader(b)))
		if downErr != nil {
			t.Fatalf("%q: write error %v", b, downErr)
		}
		_ = bw.Flush()
		cr := ChunkedReader{R: bufio.NewReader(bytes.NewReader(b))}
		decoded, crErr := io.ReadAll(&cr)
		if (upErr == nil) != (crErr == nil) {
			t.Fatalf("%q: CopyChunks %v, ChunkedReader %v", b, upErr, crErr)
		}
		data, trailer, stdErr := readStd(b)
		if stdErr != nil {
			if upErr == nil {
				t.Fatalf("net/http refuses %q (%v), h1 takes it", b, stdErr)
			}
			return
		}
		if upErr != nil {
			return // h1 may refuse more
		}
		if !bytes.Equal(decoded, data) {
			t.Fatalf("%q: h1 decodes %q, net/http %q", b, decoded, data)
		}
		for _, x := range cr.TrailerHdrs {
			k := textproto.CanonicalMIMEHeaderKey(string(x.Name(cr.Trailer)))
			if !slices.Contains(trailer[k], string(x.Value(cr.Trailer))) {
				t.Fatalf("%q: trailer %s: %q, net/http %q", b, k, x.Value(cr.Trailer), trailer[k])
			}
		}
		data2, trailer2, err := readStd(out.Bytes())
		if err != nil || !bytes.Equal(data2, data) {
			t.Fatalf("%q re-framed as %q: net/http reads %q, %v", b, out.Bytes(), data2, err)
		}
		for k, v := range trailer2 {
			if ReplyKind([]byte(k)) != Fwd || !slices.Equal(v, trailer[k]) {
				t.Fatalf("%q re-framed as %q: trailer %s: %q, was %q", b, out.Bytes(), k, v, trailer[k])
			}
		}
		for _, x := range cr.TrailerHdrs {
			if k := textproto.CanonicalMIMEHeaderKey(string(x.Name(cr.Trailer))); x.Kind == Fwd && trailer2[k] == nil {
				t.Fatalf("%q re-framed as %q: trailer %s lost", b, out.Bytes(), k)
			}
		}
	})
}

// sameHeaders checks that the header lines h1 parsed (spans of b) are, by
// canonical name and in order, the values net/http has, the skipped names
// aside.
func sameHeaders(t *testing.T, input, b []byte, hdrs []Header, std http.Header, skip ...string) {
	t.Helper()
	got := http.Header{}
	for _, x := range hdrs {
		k := textproto.CanonicalMIMEHeaderKey(string(x.Name(b)))
		got[k] = append(got[k], string(x.Value(b)))
	}
	for _, k := range skip {
		delete(got, k)
		delete(std, k)
	}
	for k, v := range got {
		if !slices.Equal(v, std[k]) {
			t.Fatalf("%q: %s: h1 %q, net/http %q", input, k, v, std[k])
		}
	}
	for k, v := range std {
		if got[k] == nil {
			t.Fatalf("%q: %s: net/http %q, h1 none", input, k, v)
		}
	}
}

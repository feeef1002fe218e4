package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

func TestHeadEnd(t *testing.T) {
	for _, c := range []struct {
		in         string
		from       int
		end, again int
	}{
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0, 27, 0},
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody", 0, 27, 0},
		{"GET / HTTP/1.1\r\nHost: x\r\n", 0, 0, 25}, // resume at the next line
		{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 16, 27, 0},
		{"GET / HTTP/1.1\r\nHo", 0, 0, 16},
		{"GET / HTTP/1.1\nHost: x\r\n\r\n", 0, -1, 0}, // bare LF
		{"\r\nGET / HTTP/1.1\r\n\r\n", 0, -1, 0},      // a leading blank line
		{"\nGET", 0, -1, 0},
		{"", 0, 0, 0},
	} {
		if end, again := HeadEnd([]byte(c.in), c.from); end != c.end || again != c.again {
			t.Errorf("HeadEnd(%q, %d) = %d, %d; want %d, %d", c.in, c.from, end, again, c.end, c.again)
		}
	}
}

func TestParseRequestHead(t *testing.T) {
	type want struct {
		method, target, path, query, host, callID string
		length                                    int64
		hasLength, chunked, close, conn, te, idem bool
		hdrs                                      []string // name=value, Kind as a digit
	}
	for _, c := range []struct {
		in   string
		err  error
		want want
	}{
		{in: "GET /function/f HTTP/1.1\r\nHost: x\r\n\r\n",
			want: want{method: "GET", target: "/function/f", path: "/function/f", host: "x", hdrs: []string{"Host=x:3"}}},
		{in: "POST /a/b?c=d HTTP/1.1\r\nhost:  f.example.com \r\nContent-Length: 12\r\nConnection: close, X-A\r\nX-A: 1\r\nTe: gzip, Trailers\r\nX-Call-Id: id1\r\nX-Call-Id: id2\r\nIdempotency-Key: k\r\nX-Forwarded-For: 10.0.0.1\r\nKeep-Alive: 5\r\n\r\n",
			want: want{method: "POST", target: "/a/b?c=d", path: "/a/b", query: "c=d", host: "f.example.com", callID: "id1",
				length: 12, hasLength: true, close: true, conn: true, te: true, idem: true,
				hdrs: []string{"host=f.example.com:3", "Content-Length=12:4", "Connection=close, X-A:5", "X-A=1:0", "Te=gzip, Trailers:6",
					"X-Call-Id=id1:9", "X-Call-Id=id2:9", "Idempotency-Key=k:10", "X-Forwarded-For=10.0.0.1:8", "Keep-Alive=5:1"}}},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n",
			want: want{method: "POST", target: "/", path: "/", host: "x", chunked: true, hdrs: []string{"Host=x:3", "Transfer-Encoding=Chunked:7"}}},
		{in: "GET / HTTP/1.1\r\nHost: [::1]:80\r\nX-Empty:\r\n\r\n",
			want: want{method: "GET", target: "/", path: "/", host: "[::1]:80", hdrs: []string{"Host=[::1]:80:3", "X-Empty=:0"}}},
		// Refused: smuggling forms.
		{in: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", err: ErrMalformed},
		{in: "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", err: ErrMalformed},
		// Refused: what net/http decides or serves.
		{in: "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.1\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.1\r\nHost: a%b\r\n\r\n", err: ErrMalformed},
		{in: "GET /%2e HTTP/1.1\r\nHost: x\r\n\r\n", err: ErrMalformed},
		{in: "GET /a#f HTTP/1.1\r\nHost: x\r\n\r\n", err: ErrMalformed},
		{in: "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.0\r\nHost: x\r\n\r\n", err: ErrMalformed},
		{in: "GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", err: ErrMalformed},
		{in: "G(T / HTTP/1.1\r\nHost: x\r\n\r\n", err: ErrMalformed},
		{in: "GET / HTTP/1.1\r\nHost: x\r\n", err: ErrMalformed}, // no blank line
		{in: "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n", err: ErrHandoff},
		{in: "GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n", err: ErrHandoff},
	} {
		var r RequestHead
		b := []byte(c.in)
		err := ParseRequestHead(b, &r)
		if err != c.err {
			t.Errorf("%q: error %v, want %v", c.in, err, c.err)
			continue
		}
		if err != nil {
			continue
		}
		var hdrs []string
		for _, h := range r.Hdrs {
			hdrs = append(hdrs, string(h.Name(b))+"="+string(h.Value(b))+":"+strconv.Itoa(int(h.Kind)))
		}
		got := want{string(r.Method), string(r.Target), string(r.Path), string(r.Query), string(r.Host), string(r.CallID),
			r.Length, r.HasLength, r.Chunked, r.Close, r.ConnTokens, r.TE, r.IdemKey, hdrs}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", c.in, got, c.want)
		}
	}
	// The header storage is reused.
	var r RequestHead
	b := []byte("GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\n\r\n")
	_ = ParseRequestHead(b, &r)
	if n := testing.AllocsPerRun(100, func() { _ = ParseRequestHead(b, &r) }); n != 0 {
		t.Errorf("ParseRequestHead allocates %v times", n)
	}
}

func TestParseReplyHead(t *testing.T) {
	for _, c := range []struct {
		in                        string
		ok                        bool
		code                      int
		status                    string
		length                    int64
		chunked, keep, conn, date bool
		kinds                     []Kind
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nDate: x\r\nX-A: 1\r\n\r\n", true, 200, "200 OK", 5, false, true, false, true, []Kind{Length, Date, Fwd}},
		{"HTTP/1.1 200 OK\nContent-Length: 5\n\n", true, 200, "200 OK", 5, false, true, false, false, []Kind{Length}},
		{"HTTP/1.1 200\r\nTransfer-Encoding: chunked\r\n\r\n", true, 200, "200", -1, true, true, false, false, []Kind{TransferEncoding}},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", true, 200, "200 OK", -1, true, false, false, false, []Kind{Length, TransferEncoding}},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", true, 200, "200 OK", 5, false, true, false, false, []Kind{Length, Length}},
		{"HTTP/1.1 200 OK\r\nConnection: close, X-A\r\nX-Call-Id: spoof\r\n\r\n", true, 200, "200 OK", -1, false, false, true, false, []Kind{Connection, Drop}},
		{"HTTP/1.0 200 OK\r\n\r\n", true, 200, "200 OK", -1, false, false, false, false, nil},
		{"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", true, 103, "103 Early Hints", -1, false, true, false, false, []Kind{Fwd}},
		{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 05\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 099 Odd\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 2x0 OK\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 2000 OK\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.2 200 OK\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 O\x01K\r\n\r\n", false, 0, "", 0, false, false, false, false, nil},
		{"HTTP/1.1 200 OK\r\nX-A: 1\r\n", false, 0, "", 0, false, false, false, false, nil},
	} {
		var r ReplyHead
		b := []byte(c.in)
		err := ParseReplyHead(b, &r)
		if (err == nil) != c.ok {
			t.Errorf("%q: error %v", c.in, err)
			continue
		}
		if err != nil {
			continue
		}
		var kinds []Kind
		for _, h := range r.Hdrs {
			kinds = append(kinds, h.Kind)
		}
		if r.Code != c.code || string(r.Status) != c.status || r.Length != c.length || r.Chunked != c.chunked ||
			r.KeepAlive != c.keep || r.ConnTokens != c.conn || r.HasDate != c.date || !slices.Equal(kinds, c.kinds) {
			t.Errorf("%q: got %d %q len %d chunked %v keep %v conn %v date %v kinds %v", c.in, r.Code, r.Status, r.Length, r.Chunked, r.KeepAlive, r.ConnTokens, r.HasDate, kinds)
		}
	}
	var r ReplyHead
	b := []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n")
	_ = ParseReplyHead(b, &r)
	if n := testing.AllocsPerRun(100, func() { _ = ParseReplyHead(b, &r) }); n != 0 {
		t.Errorf("ParseReplyHead allocates %v times", n)
	}
}

func TestReadHead(t *testing.T) {
	long := "HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("v", 10000) + "\r\n\r\n"
	for _, c := range []struct {
		in, head string
		started  bool
		err      error
	}{
		{"HTTP/1.1 200 OK\r\nA: 1\r\n\r\nbody", "HTTP/1.1 200 OK\r\nA: 1\r\n\r\n", true, nil},
		{"HTTP/1.1 200 OK\nA: 1\n\nbody", "HTTP/1.1 200 OK\nA: 1\n\n", true, nil},
		{long + "body", long, true, nil}, // lines longer than the reader's buffer
		{"", "", false, io.EOF},
		{"HTTP/1.1 200 OK\r\n", "HTTP/1.1 200 OK\r\n", true, io.EOF},
		{"HTTP/1.1 200 OK\r\nX: " + strings.Repeat("v", MaxReplyHead) + "\r\n\r\n", "", true, errHeadTooLarge},
	} {
		head, started, err := ReadHead(bufio.NewReaderSize(strings.NewReader(c.in), 64), []byte("keep"))
		if err != c.err || started != c.started || (err == nil && string(head) != "keep"+c.head) {
			t.Errorf("%.40q: %.40q %v %v", c.in, head, started, err)
		}
	}
}

func TestChunkSize(t *testing.T) {
	for _, c := range []struct {
		line string
		n    int64
		ok   bool
	}{
		{"0\r\n", 0, true},
		{"1a\r\n", 26, true},
		{"1A;ext=v\r\n", 26, true},
		{"5;a;b=\"c d\"\r\n", 5, true},
		{"5 \t\r\n", 5, true},
		{"fffffffffffffff\r\n", 1<<60 - 1, true},
		{"ffffffffffffffff\r\n", 0, false}, // 16 digits: h1 takes 15
		{"5 ;x\r\n", 0, false},             // net/http refuses space before the extension
		{"5\n", 0, false},                  // bare LF
		{"5;x\rQ\r\n", 0, false},           // a CR inside
		{"\r\n", 0, false},
		{";x\r\n", 0, false},
		{"-5\r\n", 0, false},
		{"0x5\r\n", 0, false},
		{"5", 0, false},
		{"1;" + strings.Repeat("e", 4094) + "\r\n", 0, false},
		{"1;" + strings.Repeat("e", 4093) + "\r\n", 1, true},
	} {
		if n, ok := ChunkSize([]byte(c.line)); n != c.n || ok != c.ok {
			t.Errorf("ChunkSize(%.30q) = %d, %v; want %d, %v", c.line, n, ok, c.n, c.ok)
		}
	}
}

// failWriter fails every write (the client gone).
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("client gone") }

func TestCopyFixed(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	for _, c := range []struct {
		in     string
		n      int64
		out    string
		upErr  error
		reader func(io.Reader) io.Reader
	}{
		{"hello world", 5, "hello", nil, nil},
		{"hello", 5, "hello", nil, iotest.OneByteReader},
		{big, int64(len(big)), big, nil, nil}, // past the reader's buffer
		{"hel", 5, "hel", io.ErrUnexpectedEOF, nil},
		{"", 0, "", nil, nil},
	} {
		var src io.Reader = strings.NewReader(c.in)
		if c.reader != nil {
			src = c.reader(src)
		}
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		upErr, downErr := CopyFixed(bw, bufio.NewReaderSize(src, 16), c.n)
		_ = bw.Flush()
		if upErr != c.upErr || downErr != nil || out.String() != c.out {
			t.Errorf("%.20q, %d: %.20q %v %v", c.in, c.n, out.String(), upErr, downErr)
		}
	}
	if _, downErr := CopyFixed(bufio.NewWriterSize(failWriter{}, 16), bufio.NewReader(strings.NewReader(big)), int64(len(big))); downErr == nil {
		t.Error("a failed write is not reported")
	}
}

func TestCopyChunks(t *testing.T) {
	for _, c := range []struct {
		in, out string
		ok      bool
	}{
		{"5\r\nhello\r\n0\r\n\r\nNEXT", "5\r\nhello\r\n0\r\n\r\n", true},
		{"5;ext=v\r\nhello\r\n6 \r\n world\r\n0;x\r\n\r\n", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", true},
		{"0\r\nX-Ok: yes\r\nX-Call-Id: spoof\r\nContent-Length: 9\r\nConnection: close\r\n\r\n", "0\r\nX-Ok: yes\r\n\r\n", true},
		{"A\r\n0123456789\r\n0\r\n\r\n", "a\r\n0123456789\r\n0\r\n\r\n", true},
		{"5\r\nhello\n0\r\n\r\n", "", false},      // bare LF after the data
		{"5\r\nhelloXY0\r\n\r\n", "", false},      // data longer than its size
		{"5\nhello\r\n0\r\n\r\n", "", false},      // bare LF in the size line
		{"5 ;x\r\nhello\r\n0\r\n\r\n", "", false}, // net/http refuses it
		{"0\r\nBad Name: x\r\n\r\n", "", false},
		{"0\r\nX-A: 1\r\n folded\r\n\r\n", "", false},
		{"0\r\nX-A: 1\n\r\n", "", false},
		{"0\r\nX-A: a\x01b\r\n\r\n", "", false},
		{"0\r\nX-Long: " + strings.Repeat("v", 4096) + "\r\n\r\n", "", false},
		{"3\r\nabc", "", false},
		{"0\r\n", "", false},
		{strings.Repeat("1;"+strings.Repeat("e", 1000)+"\r\nx\r\n", 20) + "0\r\n\r\n", "", false}, // too much framing
	} {
		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		upErr, downErr := CopyChunks(bw, bufio.NewReaderSize(strings.NewReader(c.in), 4096))
		_ = bw.Flush()
		if downErr != nil || (upErr == nil) != c.ok || (c.ok && out.String() != c.out) {
			t.Errorf("%.40q: %q %v %v", c.in, out.String(), upErr, downErr)
		}
		cr := ChunkedReader{R: bufio.NewReaderSize(iotest.HalfReader(strings.NewReader(c.in)), 4096)}
		if _, err := io.ReadAll(&cr); (err == nil) != c.ok {
			t.Errorf("ChunkedReader %.40q: %v", c.in, err)
		}
	}
}

func TestChunkedReader(t *testing.T) {
	in := "5\r\nhello\r\n6;e\r\n world\r\n0\r\nX-Ok: yes\r\nX-Call-Id: spoof\r\n\r\nNEXT"
	var cr ChunkedReader
	for range 2 { // Reset readies it again
		br := bufio.NewReader(iotest.OneByteReader(strings.NewReader(in)))
		cr.Reset(br)
		b, err := io.ReadAll(&cr)
		if err != nil || string(b) != "hello world" {
			t.Fatalf("%q %v", b, err)
		}
		var got []string
		for _, h := range cr.TrailerHdrs {
			got = append(got, string(h.Name(cr.Trailer))+"="+string(h.Value(cr.Trailer))+":"+strconv.Itoa(int(h.Kind)))
		}
		if !slices.Equal(got, []string{"X-Ok=yes:0", "X-Call-Id=spoof:1"}) {
			t.Fatalf("trailers %q", got)
		}
		if rest, _ := io.ReadAll(br); string(rest) != "NEXT" {
			t.Fatalf("read past the body: rest %q", rest)
		}
	}
}

func TestCopyUntilClose(t *testing.T) {
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	upErr, downErr := CopyUntilClose(bw, bufio.NewReader(strings.NewReader("hello world")))
	_ = bw.Flush()
	if upErr != nil || downErr != nil || out.String() != "b\r\nhello world\r\n0\r\n\r\n" {
		t.Errorf("%q %v %v", out.String(), upErr, downErr)
	}
	upErr, _ = CopyUntilClose(bufio.NewWriter(io.Discard), bufio.NewReader(iotest.ErrReader(io.ErrClosedPipe)))
	if upErr != io.ErrClosedPipe {
		t.Errorf("error %v", upErr)
	}
	if _, downErr := CopyUntilClose(bufio.NewWriterSize(failWriter{}, 16), bufio.NewReader(strings.NewReader("x"))); downErr == nil {
		t.Error("a failed write is not reported")
	}
}

func TestKinds(t *testing.T) {
	for _, c := range []struct {
		name       string
		req, reply Kind
	}{
		{"Host", Host, Fwd}, {"CONTENT-LENGTH", Length, Length}, {"transfer-encoding", TransferEncoding, TransferEncoding},
		{"Connection", Connection, Connection}, {"Upgrade", Handoff, Drop}, {"Expect", Handoff, Fwd}, {"TE", TE, Drop},
		{"Trailer", Drop, Fwd}, {"Keep-Alive", Drop, Drop}, {"Proxy-Connection", Drop, Drop},
		{"X-Forwarded-For", XFF, Fwd}, {"X-Forwarded-Host", Drop, Fwd}, {"X-Brisk-Sandbox", Drop, Drop},
		{"X-Brisk-Timing", Fwd, Drop}, {"X-Call-Id", CallID, Drop}, {"Idempotency-Key", Idem, Fwd},
		{"X-Idempotency-Key", Idem, Fwd}, {"Date", Fwd, Date}, {"X-Other", Fwd, Fwd}, {"", Fwd, Fwd},
		{strings.Repeat("x", 40), Fwd, Fwd},
	} {
		if r, p := RequestKind([]byte(c.name)), ReplyKind([]byte(c.name)); r != c.req || p != c.reply {
			t.Errorf("%q: request %d reply %d, want %d %d", c.name, r, p, c.req, c.reply)
		}
	}
}

func TestBytePredicates(t *testing.T) {
	for _, c := range []struct {
		in                  string
		token, value, vhost bool
	}{
		{"abc", true, true, true},
		{"a-b.c_d~!", true, true, true},
		{"", false, true, true},
		{"a b", false, true, false},
		{"a\tb", false, true, false},
		{"a:b", false, true, true},
		{"[::1]:80", false, true, true},
		{"a%b", true, true, false},
		{"a\x00", false, false, false},
		{"a\x7f", false, false, false},
		{"é", false, true, false},
		{"a\r", false, false, false},
	} {
		b := []byte(c.in)
		if IsToken(b) != c.token || ValidValue(b) != c.value || ValidHost(b) != c.vhost {
			t.Errorf("%q: token %v value %v host %v", c.in, IsToken(b), ValidValue(b), ValidHost(b))
		}
	}
}

func TestSplitHeader(t *testing.T) {
	for _, c := range []struct {
		line, name, value string
		ok                bool
	}{
		{"A: b", "A", "b", true},
		{"A:b", "A", "b", true},
		{"A: \t b c \t", "A", "b c", true},
		{"A:", "A", "", true},
		{"A : b", "", "", false},
		{" A: b", "", "", false},
		{": b", "", "", false},
		{"A b", "", "", false},
		{"A(: b", "", "", false},
	} {
		colon, vs, ve, ok := SplitHeader([]byte(c.line))
		if ok != c.ok || (ok && (c.line[:colon] != c.name || c.line[vs:ve] != c.value)) {
			t.Errorf("%q: %d %d %d %v", c.line, colon, vs, ve, ok)
		}
	}
}

func TestConnectionTokens(t *testing.T) {
	for _, c := range []struct {
		v             string
		close, others bool
	}{
		{"close", true, false}, {"Keep-Alive", false, false}, {"CLOSE, X-A", true, true},
		{" , keep-alive ,, ", false, false}, {"upgrade", false, true}, {"closed", false, true}, {"", false, false},
	} {
		if cl, o := ConnectionTokens([]byte(c.v)); cl != c.close || o != c.others {
			t.Errorf("%q: %v %v", c.v, cl, o)
		}
	}
}

func TestConnectionLists(t *testing.T) {
	b := []byte("HTTP/1.1 200 OK\r\nConnection: close, X-A\r\nConnection: x-b\r\nX-A: 1\r\n\r\n")
	var r ReplyHead
	if err := ParseReplyHead(b, &r); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"X-A": true, "x-a": true, "X-B": true, "X-C": false, "close": true} {
		if got := ConnectionLists(b, r.Hdrs, []byte(name)); got != want {
			t.Errorf("%s: %v", name, got)
		}
	}
}

func TestTokens(t *testing.T) {
	for _, c := range []struct {
		v    string
		toks []string
	}{
		{"a, b ,c", []string{"a", "b", "c"}}, {" , ,", nil}, {"a\t,\tb", []string{"a", "b"}}, {"", nil}, {"a b", []string{"a b"}},
	} {
		var got []string
		for tok := range Tokens(c.v) {
			got = append(got, tok)
		}
		var gotB []string
		for tok := range Tokens([]byte(c.v)) {
			gotB = append(gotB, string(tok))
		}
		if !slices.Equal(got, c.toks) || !slices.Equal(gotB, c.toks) {
			t.Errorf("%q: %q %q", c.v, got, gotB)
		}
	}
	n := 0
	for range Tokens("a,b,c") {
		n++
		break
	}
	if n != 1 {
		t.Error("Tokens goes on after break")
	}
}

func TestTrimOWS(t *testing.T) {
	for in, want := range map[string]string{" a ": "a", "\ta b\t": "a b", "": "", " \t ": "", "a": "a", "\ra\r": "\ra\r"} {
		if got := TrimOWS(in); got != want {
			t.Errorf("%q: %q", in, got)
		}
	}
}

func TestLastCodingIs(t *testing.T) {
	for _, c := range []struct {
		te   string
		want bool
	}{
		{"chunked", true}, {"gzip, Chunked", true}, {"chunked, gzip", false}, {"gzip,chunked ", true}, {"", false}, {"xchunked", false},
	} {
		if got := LastCodingIs(c.te, "chunked"); got != c.want {
			t.Errorf("%q: %v", c.te, got)
		}
	}
}

func TestEqualFold(t *testing.T) {
	for _, c := range []struct {
		b, lower string
		want     bool
	}{
		{"Close", "close", true}, {"CLOSE", "close", true}, {"close", "close", true}, {"clos", "close", false},
		{"closf", "close", false}, {"", "", true}, {"K", "k", true}, {"[", "{", false},
	} {
		if got := EqualFold(c.b, c.lower); got != c.want {
			t.Errorf("%q %q: %v", c.b, c.lower, got)
		}
	}
}

func TestParseLength(t *testing.T) {
	for _, c := range []struct {
		v  string
		n  int64
		ok bool
	}{
		{"0", 0, true}, {"12345", 12345, true}, {"007", 7, true}, {"999999999999999999", 999999999999999999, true},
		{"1000000000000000000", 0, false}, {"", 0, false}, {"+1", 0, false}, {"-1", 0, false}, {"1 ", 0, false}, {"1,1", 0, false}, {"0x1", 0, false},
	} {
		if n, ok := ParseLength([]byte(c.v)); n != c.n || ok != c.ok {
			t.Errorf("%q: %d %v", c.v, n, ok)
		}
	}
}

func TestWriteDate(t *testing.T) {
	var out bytes.Buffer
	bw := bufio.NewWriter(&out)
	WriteDate(bw)
	WriteDate(bw)
	_ = bw.Flush()
	lines := strings.SplitAfter(out.String(), "\r\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "Date: ") || !strings.HasSuffix(lines[0], " GMT\r\n") || len(lines[0]) != len("Date: Mon, 02 Jan 2006 15:04:05 GMT\r\n") {
		t.Fatalf("%q", out.String())
	}
	if n := testing.AllocsPerRun(100, func() { WriteDate(bufio.NewWriter(io.Discard)) }); n > 2 { // the writer; a new second's line
		t.Errorf("WriteDate allocates %v times", n)
	}
}

func TestHeaderSpans(t *testing.T) {
	b := []byte("xxName: value")
	h := Header{NS: 2, NE: 6, VS: 8, VE: 13}
	if string(h.Name(b)) != "Name" || string(h.Value(b)) != "value" {
		t.Fatalf("%q %q", h.Name(b), h.Value(b))
	}
}

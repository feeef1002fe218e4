package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxChunkLine bounds a chunk-size line without its CRLF, extensions
	// included (net/http's limit).
	maxChunkLine = 4095
	// maxTrailers bounds the trailer section, its blank line included
	// (net/http's client finds its end within its 4 KiB buffer).
	maxTrailers = 4096
	// maxExcess bounds the framing overhead beyond what the data pays for
	// (net/http's rule against floods of tiny chunks with extensions).
	maxExcess   = 16 << 10
	copyBufSize = 32 << 10
)

var (
	errChunked  = errors.New("malformed chunked reply")
	errTrailers = errors.New("malformed chunked reply: trailer section")
	errOverhead = errors.New("malformed chunked reply: too much framing for its data")
)

// copyBufs holds the buffers a large body is copied through; it pools
// array pointers, which box without allocating.
var copyBufs sync.Pool

func getBuf() *[copyBufSize]byte {
	if b, ok := copyBufs.Get().(*[copyBufSize]byte); ok {
		return b
	}
	return new([copyBufSize]byte)
}

// ChunkSize parses a chunk-size line as ReadSlice('\n') returns it
// ("1a;ext=v\r\n"), with net/http's rules: CRLF and no other CR, at most
// maxChunkLine bytes, trailing spaces and tabs allowed before the CRLF,
// extensions (from the first ';') ignored, then 1 to 15 hex digits.
func ChunkSize(line []byte) (int64, bool) {
	n := len(line)
	if n < 2 || line[n-1] != '\n' || line[n-2] != '\r' || n-2 > maxChunkLine ||
		bytes.IndexByte(line[:n-2], '\r') >= 0 {
		return 0, false
	}
	line = line[:n-2]
	for len(line) > 0 && (line[len(line)-1] == ' ' || line[len(line)-1] == '\t') {
		line = line[:len(line)-1]
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 15 {
		return 0, false
	}
	var size int64
	for _, b := range line {
		switch {
		case '0' <= b && b <= '9':
			size = size<<4 | int64(b-'0')
		case 'a' <= b && b <= 'f':
			size = size<<4 | int64(b-'a'+10)
		case 'A' <= b && b <= 'F':
			size = size<<4 | int64(b-'A'+10)
		default:
			return 0, false
		}
	}
	return size, true
}

// overhead counts a chunk's framing beyond what its data pays for, as
// net/http's chunked reader does; it reports false past maxExcess.
func overhead(excess *int64, line []byte, size int64) bool {
	*excess = max(*excess+int64(len(line))-16-2*size, 0) // line includes its CRLF
	return *excess <= maxExcess
}

// trailerLine reads one line of a trailer section from src; used counts
// the section's bytes so far. It returns the line without its CRLF, split
// (SplitHeader), or an empty line at the section's end. A trailer line must
// end in CRLF, be a valid header line and fit the section in maxTrailers.
func trailerLine(src *bufio.Reader, used *int) (line []byte, colon, vs, ve int, err error) {
	line, err = src.ReadSlice('\n')
	*used += len(line)
	if err != nil {
		if err == bufio.ErrBufferFull {
			return nil, 0, 0, 0, errTrailers
		}
		return nil, 0, 0, 0, eofIsUnexpected(err)
	}
	n := len(line)
	if *used > maxTrailers || n < 2 || line[n-2] != '\r' {
		return nil, 0, 0, 0, errTrailers
	}
	line = line[:n-2]
	if len(line) == 0 {
		return line, 0, 0, 0, nil
	}
	colon, vs, ve, ok := SplitHeader(line)
	if !ok || !ValidValue(line[vs:ve]) {
		return nil, 0, 0, 0, errTrailers
	}
	return line, colon, vs, ve, nil
}

// CopyFixed copies n bytes of a body from src to dst. upErr is src's
// error (a body cut short is io.ErrUnexpectedEOF), downErr dst's.
func CopyFixed(dst *bufio.Writer, src *bufio.Reader, n int64) (upErr, downErr error) {
	var buf *[copyBufSize]byte
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
				buf = getBuf()
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

// CopyChunks relays a chunked body from src to dst chunk by chunk,
// flushing dst whenever src has nothing further buffered (a streamed body
// reaches the client piece by piece). The framing is h1's own: size lines
// are written anew (extensions dropped) and trailers pass only as valid
// header lines whose ReplyKind is Fwd, so a sender cannot smuggle bytes
// into the framing the receiver parses. upErr is src's error (malformed
// framing included), downErr dst's.
func CopyChunks(dst *bufio.Writer, src *bufio.Reader) (upErr, downErr error) {
	var excess int64
	for {
		line, err := src.ReadSlice('\n')
		if err != nil {
			if err == bufio.ErrBufferFull {
				return errChunked, nil
			}
			return eofIsUnexpected(err), nil
		}
		size, ok := ChunkSize(line)
		if !ok {
			return errChunked, nil
		}
		if !overhead(&excess, line, size) {
			return errOverhead, nil
		}
		dst.Write(strconv.AppendInt(dst.AvailableBuffer(), size, 16))
		dst.WriteString("\r\n")
		if size == 0 { // the last chunk: trailers up to a blank line
			used := 0
			for {
				line, colon, _, _, err := trailerLine(src, &used)
				if err != nil {
					return err, nil
				}
				if len(line) == 0 {
					_, err := dst.WriteString("\r\n")
					return nil, err
				}
				if ReplyKind(line[:colon]) != Fwd {
					continue
				}
				// The line as it came (it is valid): never longer than
				// read, so a reader with net/http's 4 KiB limit takes the
				// whole section whenever this one did ("Name: value" could
				// be a byte longer per line).
				dst.Write(line)
				dst.WriteString("\r\n")
			}
		}
		if upErr, downErr = CopyFixed(dst, src, size); upErr != nil || downErr != nil {
			return upErr, downErr
		}
		if err := readCRLF(src); err != nil {
			return err, nil
		}
		dst.WriteString("\r\n")
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return nil, err
			}
		}
	}
}

// CopyUntilClose relays a body that ends when src's connection closes,
// as chunks, each flushed as it arrives.
func CopyUntilClose(dst *bufio.Writer, src *bufio.Reader) (upErr, downErr error) {
	buf := getBuf()
	defer copyBufs.Put(buf)
	for {
		k, err := src.Read(buf[:])
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

// ChunkedReader decodes a chunked body from R with CopyChunks's rules: Read
// returns the data, and io.EOF once the last chunk and a valid trailer
// section have been read; the trailers are then in Trailer (the section's
// lines, CRLF-ended) and TrailerHdrs (spans of Trailer). The zero value
// with R set is ready; Reset readies it for another body.
type ChunkedReader struct {
	R           *bufio.Reader
	Trailer     []byte
	TrailerHdrs []Header
	n           int64 // data left in the current chunk
	excess      int64
	inChunk     bool
	checkEnd    bool // the CRLF after a chunk's data is still to read
	err         error
}

// Reset readies cr to read a body from r, keeping its trailer storage.
func (cr *ChunkedReader) Reset(r *bufio.Reader) {
	*cr = ChunkedReader{R: r, Trailer: cr.Trailer[:0], TrailerHdrs: cr.TrailerHdrs[:0]}
}

func (cr *ChunkedReader) Read(p []byte) (int, error) {
	for cr.err == nil && !cr.inChunk {
		if cr.checkEnd {
			cr.checkEnd = false
			cr.err = cr.end()
			continue
		}
		cr.err = cr.begin()
	}
	if cr.err != nil {
		return 0, cr.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	k, err := cr.R.Read(p[:min(int64(len(p)), cr.n)])
	cr.n -= int64(k)
	if err != nil {
		cr.err = eofIsUnexpected(err)
		return k, cr.err
	}
	if cr.n == 0 {
		// The CRLF after the data is checked now if it is here, else
		// on the next Read: a streamed chunk goes on at once.
		cr.inChunk = false
		if cr.R.Buffered() >= 2 {
			cr.err = cr.end()
		} else {
			cr.checkEnd = true
		}
	}
	return k, nil
}

// end reads the CRLF that ends a chunk's data.
func (cr *ChunkedReader) end() error { return readCRLF(cr.R) }

// readCRLF reads the two bytes that end a chunk's data: CRLF, nothing else.
func readCRLF(src *bufio.Reader) error {
	b, err := src.Peek(2)
	if len(b) < 2 {
		return eofIsUnexpected(err)
	}
	if string(b) != "\r\n" {
		return errChunked
	}
	_, _ = src.Discard(2)
	return nil
}

// begin reads a chunk-size line, and after the last chunk the trailers.
func (cr *ChunkedReader) begin() error {
	line, err := cr.R.ReadSlice('\n')
	if err != nil {
		if err == bufio.ErrBufferFull {
			return errChunked
		}
		return eofIsUnexpected(err)
	}
	size, ok := ChunkSize(line)
	if !ok {
		return errChunked
	}
	if !overhead(&cr.excess, line, size) {
		return errOverhead
	}
	if size > 0 {
		cr.n, cr.inChunk = size, true
		return nil
	}
	used := 0
	for {
		line, colon, vs, ve, err := trailerLine(cr.R, &used)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return io.EOF
		}
		pos := int32(len(cr.Trailer))
		cr.Trailer = append(append(cr.Trailer, line...), '\r', '\n')
		cr.TrailerHdrs = append(cr.TrailerHdrs, Header{NS: pos, NE: pos + int32(colon), VS: pos + int32(vs), VE: pos + int32(ve), Kind: ReplyKind(line[:colon])})
	}
}

// httpDate is a Date header line, made once a second.
type httpDate struct {
	sec  int64
	line []byte
}

var dateLine atomic.Pointer[httpDate]

// WriteDate writes a Date header line (with its CRLF) for now; the line
// is formatted once a second.
func WriteDate(bw *bufio.Writer) {
	now := time.Now()
	d := dateLine.Load()
	if d == nil || d.sec != now.Unix() {
		b := append([]byte("Date: "), now.UTC().AppendFormat(nil, http.TimeFormat)...)
		d = &httpDate{sec: now.Unix(), line: append(b, "\r\n"...)}
		dateLine.Store(d)
	}
	bw.Write(d.line)
}

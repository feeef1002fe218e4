package dataplane

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// Request bodies on the net/http path are read before the call takes a
// sandbox slot, so that a client sending slowly costs a connection, not a
// sandbox (a max-1 function was locked out by two clients sending a byte a
// second). A body is held in memory up to Config.BodyBufferBytes, within
// a data-plane-wide budget (Config.BodyBufferTotal); the rest of a larger
// body, or of one that finds the budget spent, streams to the sandbox but
// must keep up Config.MinBodyRate. The front end reads its bodies (≤ 64 KiB)
// in full before a call already.

// reqBody is a request body as forward sends it: data read in full
// (rest == nil), or a prefix with the rest to stream.
type reqBody struct {
	data     []byte
	rest     io.Reader
	pooled   []byte // a copy buffer data lives in, given back by release
	reserved int64  // bytes of the buffer budget held
}

// pooledBody is the largest body of known length read into a pooled copy
// buffer (proxy.BufferPool's size).
const pooledBody = 32 << 10

// bodyBudget is the memory the data plane's buffered bodies may hold.
type bodyBudget struct{ left atomic.Int64 }

func (b *bodyBudget) take(n int64) bool {
	if b.left.Add(-n) < 0 {
		b.left.Add(n)
		return false
	}
	return true
}

func (b *bodyBudget) give(n int64) { b.left.Add(n) }

func (d *DataPlane) release(rb *reqBody) {
	if rb.pooled != nil {
		copyBufs.Put(rb.pooled)
		rb.pooled = nil
	}
	if rb.reserved > 0 {
		d.bodyBudget.give(rb.reserved)
		rb.reserved = 0
	}
	rb.data = nil
}

// errBodyTooSlow: the client sent the rest of a streamed body slower than
// Config.MinBodyRate.
var errBodyTooSlow = errors.New("request body arrived slower than the data plane's minimum rate")

// readBody reads r's body ahead of the call (see above). On error the
// caller answers with failBody; whatever was taken is released.
func (d *DataPlane) readBody(w http.ResponseWriter, r *http.Request, rb *reqBody, stream bool) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	var src io.Reader = r.Body
	if r.ContentLength < 0 {
		// Bounded here rather than by replacing r.Body: the server
		// recognises its own body type when it decides whether a
		// connection with an unread rest of a body can be reused.
		src = http.MaxBytesReader(w, r.Body, d.cfg.MaxBodyBytes)
	}
	if stream { // the function takes its bodies as they come (StreamRequests)
		rb.rest = src
		return nil
	}
	d.bodiesReading.Add(1)
	defer d.bodiesReading.Add(-1)
	// A small body of known length: one pooled buffer, no budget.
	if n := r.ContentLength; n > 0 && n <= pooledBody {
		buf := copyBufs.Get()
		rb.pooled, rb.data = buf, buf[:n]
		_, err := io.ReadFull(src, rb.data)
		return err
	}
	limit := d.cfg.BodyBufferBytes
	if r.ContentLength > 0 {
		limit = min(limit, r.ContentLength)
	}
	// Grow as bytes arrive (a client announcing 6 MiB and sending a byte a
	// second holds little), taking budget for each growth.
	var buf []byte
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			grow := min(max(int64(cap(buf)), 64<<10), limit-int64(cap(buf)))
			if !d.bodyBudget.take(grow) {
				break // the budget is spent: stream the rest
			}
			rb.reserved += grow
			nb := make([]byte, len(buf), int64(cap(buf))+grow)
			copy(nb, buf)
			buf = nb
		}
		k, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err == io.EOF {
			if r.ContentLength > 0 && int64(len(buf)) < r.ContentLength {
				return io.ErrUnexpectedEOF
			}
			rb.data = buf
			return nil
		}
		if err != nil {
			return err
		}
	}
	rb.data = buf
	if int64(len(buf)) == r.ContentLength {
		return nil
	}
	if r.ContentLength < 0 {
		// Read to the limit: the body may end right here.
		var one [1]byte
		k, err := io.ReadFull(src, one[:])
		if k == 0 && (err == io.EOF || err == io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil && k == 0 {
			return err
		}
		rb.data = append(rb.data, one[:k]...)
	}
	rb.rest = &minRateReader{r: src, rc: http.NewResponseController(w), rate: d.cfg.MinBodyRate}
	return nil
}

// minRateReader reads the streamed rest of a body, failing it when the
// client falls behind rate bytes a second (after a few seconds' grace) or
// sends nothing for bodyStall: an average alone would let a client bank
// credit with a burst and then hold its sandbox slot for as long.
type minRateReader struct {
	r     io.Reader
	rc    *http.ResponseController
	rate  int64
	start time.Time
	n     int64
}

const minRateGrace = 2 * time.Second

// bodyStall is the longest a streamed body may send nothing (a variable
// for tests).
var bodyStall = 5 * time.Second

func (m *minRateReader) Read(p []byte) (int, error) {
	if m.start.IsZero() {
		m.start = time.Now()
	}
	// By when one byte more than those read so far must have come (a read
	// returns as soon as any arrive): the average since the start must
	// keep up the rate.
	deadline := m.start.Add(minRateGrace + time.Duration(float64(m.n+1)/float64(m.rate)*float64(time.Second)))
	if stall := time.Now().Add(bodyStall); stall.Before(deadline) {
		deadline = stall
	}
	_ = m.rc.SetReadDeadline(deadline)
	k, err := m.r.Read(p)
	m.n += int64(k)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = errBodyTooSlow
	}
	return k, err
}

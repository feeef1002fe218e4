package tracefn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Limits on one request. They reject typos and hostile input, not real
// traces: InVitro clamps runtimes to 60 s and memory to 10240 MiB.
const (
	MaxMillis = 600_000 // 10 minutes
	MaxMiB    = 10_240

	// DefaultMaxBody bounds the request body when Config.MaxBody is zero:
	// the data plane's own default (Lambda's synchronous payload limit),
	// so that what the API accepts the built-ins take (a 5 MiB Lambda
	// payload to a watchdog function failed at 1 MiB).
	DefaultMaxBody = 6 << 20
)

// The InVitro loader's HTTP headers (docs/benchmarks.md, "Method"). requested_cpu carries
// the runtime in milliseconds despite its name.
const (
	HeaderRuntime = "requested_cpu"
	HeaderMemory  = "requested_memory"
)

// Config describes one trace function instance.
type Config struct {
	SandboxID string // reported as MachineName and sandbox
	Function  string // reported as Function
	// Sleep emulates a request by sleeping for its runtime instead of
	// spinning, and skips the memory allocation, so that thousands of
	// emulated sandboxes fit in one process.
	Sleep bool
	// MaxBody bounds the request body in bytes; zero means DefaultMaxBody.
	MaxBody int64
	// FProcess, when set, serves the classic watchdog running it instead
	// of the trace function (watchdog.go); getenv gives its settings.
	FProcess string
	getenv   func(string) string
}

const (
	mib      = 1 << 20
	pageSize = 4096
	// spinBatch square roots run between two clock reads: a dependent chain
	// of SQRTSD takes roughly 1-3 µs, which keeps the overshoot past the
	// requested runtime in the microseconds while the clock read (a vDSO
	// call, ~20 ns) stays a small share of the loop.
	spinBatch = 256
)

var (
	// Request header maps hold canonical keys; precompute them so the hot
	// path indexes the map directly.
	keyRuntime = textproto.CanonicalMIMEHeaderKey(HeaderRuntime)
	keyMemory  = textproto.CanonicalMIMEHeaderKey(HeaderMemory)

	contentTypeJSON = []string{"application/json"}
	contentTypeText = []string{"text/plain; charset=utf-8"}

	bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

	// sink keeps the spin loop's arithmetic observable so the compiler
	// cannot drop it.
	sink atomic.Uint64
)

type handler struct {
	sleep   bool
	maxBody int64
	// The reply's constant parts, JSON-encoded once in one allocation (the
	// emulated runtime makes a handler per sandbox, thousands at a time):
	// every request only appends numbers between them.
	head []byte // {"Status":"OK","Function":...,"MachineName":...,"ExecutionTime":
	mid  []byte // ,"sandbox":...,"exec_us":
	mem  memory
}

// New returns the trace function as an http.Handler. GET /healthz answers
// "ok"; every other method and path runs the function. It is safe for
// concurrent use.
func New(cfg Config) http.Handler {
	h := &handler{sleep: cfg.Sleep, maxBody: cfg.MaxBody}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBody
	}
	const (
		p1 = `{"Status":"OK","Function":`
		p2 = `,"MachineName":`
		p3 = `,"ExecutionTime":`
		p4 = `,"sandbox":`
		p5 = `,"exec_us":`
	)
	b := make([]byte, 0, len(p1+p2+p3+p4+p5)+len(cfg.Function)+2*len(cfg.SandboxID)+6)
	b = appendJSONString(append(b, p1...), cfg.Function)
	b = appendJSONString(append(b, p2...), cfg.SandboxID)
	b = append(b, p3...)
	split := len(b)
	b = appendJSONString(append(b, p4...), cfg.SandboxID)
	b = append(b, p5...)
	h.head, h.mid = b[:split:split], b[split:]
	return h
}

// appendJSONString appends s as a JSON string. Sandbox ids and function
// names are plain ASCII, which it copies as is; anything else goes through
// encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// request is what one invocation asks for.
type request struct {
	Millis float64 // runtime to burn, in milliseconds
	MiB    float64 // memory to allocate and touch, in MiB
}

// requestError is a client error; field names the JSON field or header.
type requestError struct {
	status int
	field  string
	msg    string
}

func (e *requestError) Error() string { return e.field + ": " + e.msg }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
		w.Header()["Content-Type"] = contentTypeText
		_, _ = io.WriteString(w, "ok")
		return
	}
	req, err := h.parse(r)
	if err != nil {
		writeError(w, err)
		return
	}

	start := time.Now()
	if !h.sleep && req.MiB > 0 {
		mem := h.mem.take(int64(req.MiB * mib))
		defer h.mem.give(mem) // the function "uses" its memory until it has replied
	}
	d := time.Duration(req.Millis * float64(time.Millisecond))
	if h.sleep {
		err = sleep(r.Context(), d-time.Since(start))
	} else {
		err = spin(r.Context(), start, d)
	}
	if err != nil {
		return // the caller went away; nobody reads a reply
	}
	us := time.Since(start).Microseconds()

	bp := bufPool.Get().(*[]byte)
	b := append((*bp)[:0], h.head...)
	b = strconv.AppendInt(b, us, 10)
	b = append(b, h.mid...)
	b = strconv.AppendInt(b, us, 10)
	b = append(b, `,"requested_ms":`...)
	b = strconv.AppendFloat(b, req.Millis, 'f', -1, 64)
	b = append(b, `,"mb":`...)
	b = strconv.AppendFloat(b, req.MiB, 'f', -1, 64)
	b = append(b, "}\n"...)
	w.Header()["Content-Type"] = contentTypeJSON
	_, _ = w.Write(b)
	*bp = b
	bufPool.Put(bp)
}

// parse reads the request from the loader's headers or, for fields without a
// header, from a JSON body {"ms":N,"mb":M}. When both headers are present the
// body is not read at all: the loader may send an opaque payload.
func (h *handler) parse(r *http.Request) (request, error) {
	var req request
	hms, hasMS := r.Header[keyRuntime]
	hmb, hasMB := r.Header[keyMemory]
	if !hasMS || !hasMB {
		var err error
		if req, err = h.withBody(r, parseBody); err != nil {
			return req, err
		}
	}
	var err error
	if hasMS {
		if req.Millis, err = parseHeader(HeaderRuntime, hms); err != nil {
			return req, err
		}
	}
	if hasMB {
		if req.MiB, err = parseHeader(HeaderMemory, hmb); err != nil {
			return req, err
		}
	}
	if err := check(HeaderRuntime, "ms", hasMS, req.Millis, MaxMillis); err != nil {
		return req, err
	}
	return req, check(HeaderMemory, "mb", hasMB, req.MiB, MaxMiB)
}

// withBody reads the request body into a pooled buffer and hands it to f,
// which must not keep it. Reading by hand rather than through io.ReadAll and
// http.MaxBytesReader keeps the common small body allocation-free.
func (h *handler) withBody(r *http.Request, f func([]byte) (request, error)) (request, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return f(nil)
	}
	if r.ContentLength > h.maxBody {
		return request{}, h.tooBig()
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	b := (*bp)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > h.maxBody {
			*bp = b[:0]
			return request{}, h.tooBig()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			*bp = b[:0]
			return request{}, &requestError{http.StatusBadRequest, "body", err.Error()}
		}
	}
	*bp = b[:0]
	return f(b)
}

func (h *handler) tooBig() error {
	return &requestError{http.StatusRequestEntityTooLarge, "body", fmt.Sprintf("larger than %d bytes", h.maxBody)}
}

// parseBody decodes {"ms":N,"mb":M}; both fields are optional and an empty
// body means zero for both. Unknown fields are ignored. It does not check
// ranges.
func parseBody(body []byte) (request, error) {
	var req request
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return req, nil
	}
	// Absent and null fields leave zeros, which is what they mean.
	var in struct {
		MS float64 `json:"ms"`
		MB float64 `json:"mb"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		field, msg := "body", `malformed JSON, want {"ms":N,"mb":M}: `+err.Error()
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			field, msg = te.Field, "must be a non-negative number, got JSON "+te.Value
		}
		return req, &requestError{http.StatusBadRequest, field, msg}
	}
	return request{Millis: in.MS, MiB: in.MB}, nil
}

func parseHeader(name string, values []string) (float64, error) {
	v, err := strconv.ParseFloat(values[0], 64)
	if err != nil {
		return 0, &requestError{http.StatusBadRequest, name, fmt.Sprintf("%q is not a number", values[0])}
	}
	return v, nil
}

// check rejects negative, non-finite and absurd values, naming the header
// when the value came from one and the JSON field otherwise.
func check(header, field string, fromHeader bool, v, limit float64) error {
	if v >= 0 && v <= limit { // false for NaN
		return nil
	}
	if fromHeader {
		field = header
	}
	return &requestError{http.StatusBadRequest, field, fmt.Sprintf("%g out of range [0, %g]", v, limit)}
}

func writeError(w http.ResponseWriter, err error) {
	status := http.StatusBadRequest
	if re, ok := errors.AsType[*requestError](err); ok {
		status = re.status
	}
	b, _ := json.Marshal(struct {
		Status string `json:"Status"`
		Error  string `json:"error"`
	}{"Error", err.Error()})
	w.Header()["Content-Type"] = contentTypeJSON
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// memory hands calls the memory they ask for, reusing what earlier calls
// gave back. A fresh allocation per call leaves the last call's memory as
// garbage until the next collection, which Go starts only once the heap
// has doubled, and returns to the system later still: a function whose
// calls ask for most of its limit was OOM-killed by its second call (the
// InVitro loader's memory-hungry trace functions, whose limit is their
// peak: internal/compat/dirigent).
type memory struct {
	mu   sync.Mutex
	free [][]byte
}

// take returns n bytes with one byte written per page, so that the memory
// is really resident, not just reserved.
func (m *memory) take(n int64) []byte {
	var mem []byte
	m.mu.Lock()
	if k := len(m.free); k > 0 {
		mem = m.free[k-1]
		m.free[k-1] = nil // else the array still holds it
		m.free = m.free[:k-1]
	}
	m.mu.Unlock()
	if int64(cap(mem)) < n {
		if mem != nil {
			// Too small: dropped, and collected and returned to the
			// system before the larger one is made. Go would keep both
			// (its heap is returned lazily), and the sandbox's limit
			// counts them. Calls' memory grows to its largest soon, so
			// this full collection is rare.
			mem = nil
			debug.FreeOSMemory()
		}
		mem = make([]byte, n)
	}
	mem = mem[:n]
	for i := int64(0); i < n; i += pageSize {
		mem[i] = 1
	}
	return mem
}

func (m *memory) give(mem []byte) {
	m.mu.Lock()
	m.free = append(m.free, mem)
	m.mu.Unlock()
}

// spin burns CPU until d has passed since start, measured on the monotonic
// clock rather than by a calibrated loop count, so the runtime holds on any
// CPU and under contention (where it then counts wall time, as the loader
// does). It returns ctx's error if ctx ends first.
func spin(ctx context.Context, start time.Time, d time.Duration) error {
	done := ctx.Done()
	x := 2.0
	for time.Since(start) < d {
		for j := range spinBatch {
			x = math.Sqrt(x + float64(j))
		}
		select {
		case <-done:
			return ctx.Err()
		default:
		}
	}
	sink.Store(math.Float64bits(x))
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

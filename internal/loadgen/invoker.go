package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Headers the invoker sends and reads.
const (
	HeaderRuntime = "requested_cpu"    // the loader's: requested runtime in ms, despite the name
	HeaderMemory  = "requested_memory" // MiB
	HeaderSandbox = "X-Brisk-Sandbox"
	HeaderTiming  = "X-Brisk-Timing"
)

// HTTPOptions configure an HTTPInvoker's client.
type HTTPOptions struct {
	// H2C speaks HTTP/2 without TLS (prior knowledge) instead of HTTP/1.1.
	H2C bool
	// MaxConns bounds connections per host (0: 4096). With HTTP/1.1 a call
	// waiting for a connection counts that wait in its response time.
	MaxConns int
	// Timeout bounds one call (0: none; the issuer's grace bounds the run).
	Timeout time.Duration
}

// NewHTTPClient returns the keep-alive pooled client the invokers use.
func NewHTTPClient(o HTTPOptions) *http.Client {
	maxConns := o.MaxConns
	if maxConns <= 0 {
		maxConns = 4096
	}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        maxConns,
		MaxIdleConnsPerHost: maxConns,
		MaxConnsPerHost:     maxConns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		TLSClientConfig:     &tls.Config{},
	}
	if o.H2C {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{Transport: t, Timeout: o.Timeout}
}

// Target is where a call goes: a URL and, for a sandbox reached directly,
// the sandbox id the emulated runtime routes on.
type Target struct {
	URL     string
	Sandbox string
	// Host overrides the URL's host in the Host header (platforms that
	// route on it).
	Host string
}

// HTTPInvoker sends calls over HTTP as the loader does to Dirigent: POST
// with the headers requested_cpu (ms) and requested_memory (MiB) and the
// JSON body {"ms":…,"mb":…}. It reads ExecutionTime (µs) and Function from
// the JSON reply and queue_us and cold from X-Brisk-Timing.
type HTTPInvoker struct {
	Client *http.Client
	// Route picks the target of a call.
	Route func(c *Call) Target
	// Header is added to every call (a platform's or function's own
	// headers); nil adds nothing.
	Header http.Header

	urls sync.Map // target URL → *url.URL
}

// DataPlane routes every call to base/function/NAME on a data plane.
func DataPlane(base string) func(c *Call) Target {
	base = strings.TrimRight(baseURL(base), "/") + "/function/"
	var mu sync.Mutex
	urls := map[string]string{} // saves a concatenation per call
	return func(c *Call) Target {
		mu.Lock()
		u, ok := urls[c.Function]
		if !ok {
			u = base + c.Function
			urls[c.Function] = u
		}
		mu.Unlock()
		return Target{URL: u}
	}
}

// Sandboxes routes each function's calls round-robin over its sandboxes,
// straight to their addresses: brisk's data plane is bypassed.
func Sandboxes(byFunction map[string][]Target) (func(c *Call) Target, error) {
	type ring struct {
		t []Target
		n atomic.Uint64
	}
	rings := make(map[string]*ring, len(byFunction))
	for fn, ts := range byFunction {
		if len(ts) == 0 {
			return nil, fmt.Errorf("function %s has no sandbox to call directly", fn)
		}
		rings[fn] = &ring{t: ts}
	}
	return func(c *Call) Target {
		r := rings[c.Function]
		if r == nil {
			return Target{}
		}
		return r.t[(r.n.Add(1)-1)%uint64(len(r.t))]
	}, nil
}

func baseURL(a string) string {
	if !strings.Contains(a, "://") {
		return "http://" + a
	}
	return a
}

// Invoke implements Invoker.
func (h *HTTPInvoker) Invoke(ctx context.Context, c *Call) Reply {
	tg := h.Route(c)
	if tg.URL == "" {
		return Reply{Err: fmt.Errorf("no target for function %s", c.Function)}
	}
	u, err := h.parse(tg.URL)
	if err != nil {
		return Reply{Err: err}
	}
	body := AppendRequest(make([]byte, 0, 32), c.RuntimeMs, c.MemoryMB)

	start := time.Now()
	rep := Reply{Sent: start}
	// The request is built around the URL parsed once per target, and
	// sent with the transport's RoundTrip rather than Client.Do (which
	// copies the headers for redirects a load generator never follows):
	// the generator shares the CPU and, with --local, the heap with what
	// it measures, so its own garbage is kept small.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(body))
	if err != nil {
		rep.Err = err
		return rep
	}
	req.URL, req.Host = u, u.Host
	if tg.Host != "" {
		req.Host = tg.Host
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header[canonRuntime] = []string{strconv.Itoa(c.RuntimeMs)}
	req.Header[canonMemory] = []string{strconv.Itoa(c.MemoryMB)}
	if c.ID != "" {
		req.Header["X-Call-Id"] = []string{c.ID}
	}
	if tg.Sandbox != "" {
		req.Header[HeaderSandbox] = []string{tg.Sandbox}
	}
	for k, v := range h.Header {
		req.Header[k] = v
	}
	var resp *http.Response
	if rt := h.Client.Transport; rt != nil && h.Client.Timeout == 0 {
		resp, err = rt.RoundTrip(req)
	} else {
		resp, err = h.Client.Do(req)
	}
	if err != nil {
		rep.Response, rep.Err = time.Since(start), err
		return rep
	}
	// The loader records the time until the reply's headers as
	// grpcConnEstablish; so does brisk.
	rep.Conn = time.Since(start)
	buf := replyBufs.Get().(*bytes.Buffer)
	defer replyBufs.Put(buf)
	buf.Reset()
	_, err = buf.ReadFrom(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	data := buf.Bytes()
	rep.Response = time.Since(start)
	rep.Status = resp.StatusCode
	if err != nil {
		rep.Err = fmt.Errorf("reading reply: %w", err)
		return rep
	}
	rep.Sandbox = resp.Header.Get(HeaderSandbox)
	rep.QueueUs, rep.Cold = ParseTiming(resp.Header.Get(HeaderTiming))
	if resp.StatusCode != http.StatusOK {
		rep.Err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(data[:min(len(data), 200)])))
		return rep
	}
	if len(data) == 0 {
		rep.Err = errors.New("empty reply")
		return rep
	}
	ParseReply(&rep, data)
	return rep
}

// AppendRequest appends a trace function's request body to b:
// {"ms":RUNTIME,"mb":MEMORY}.
func AppendRequest(b []byte, runtimeMs, memoryMB int) []byte {
	b = append(b, `{"ms":`...)
	b = strconv.AppendInt(b, int64(runtimeMs), 10)
	b = append(b, `,"mb":`...)
	b = strconv.AppendInt(b, int64(memoryMB), 10)
	return append(b, '}')
}

// ParseReply reads a trace function's JSON reply into rep: ExecutionTime,
// the echoed MiB, Function, and MachineName as the sandbox unless rep has
// one. It copies what it keeps of data.
func ParseReply(rep *Reply, data []byte) {
	rep.ExecUs, _ = jsonInt(data, `"ExecutionTime":`)
	if mb, ok := jsonInt(data, `"mb":`); ok {
		rep.MemoryMB = int(mb)
	}
	rep.Function = jsonString(data, `"Function":`)
	if rep.Sandbox == "" {
		rep.Sandbox = jsonString(data, `"MachineName":`)
	}
}

// replyBufs holds reply bodies while they are parsed.
var replyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// parse returns target's URL parsed, once per distinct target. The parsed
// URL is shared by every request to it: nothing on the send path changes it.
func (h *HTTPInvoker) parse(target string) (*url.URL, error) {
	if u, ok := h.urls.Load(target); ok {
		return u.(*url.URL), nil
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("target %q: not an http URL", target)
	}
	h.urls.Store(target, u)
	return u, nil
}

var (
	canonRuntime = http.CanonicalHeaderKey(HeaderRuntime)
	canonMemory  = http.CanonicalHeaderKey(HeaderMemory)
)

// ParseTiming reads "queue_us=123, cold=true, proxy_us=…".
func ParseTiming(s string) (queueUs int64, cold bool) {
	for s != "" {
		var kv string
		kv, s, _ = strings.Cut(s, ",")
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch k {
		case "queue_us":
			queueUs, _ = strconv.ParseInt(v, 10, 64)
		case "cold":
			cold = v == "true"
		}
	}
	return queueUs, cold
}

// jsonInt finds key in a flat JSON object and parses the number after it.
// The trace function's reply is flat and small; a scan is enough and much
// cheaper than decoding it at thousands of calls per second.
func jsonInt(data []byte, key string) (int64, bool) {
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return 0, false
	}
	rest := bytes.TrimLeft(data[i+len(key):], " ")
	j := 0
	for j < len(rest) && (rest[j] == '-' || rest[j] == '.' || rest[j] >= '0' && rest[j] <= '9' || rest[j] == 'e' || rest[j] == 'E' || rest[j] == '+') {
		j++
	}
	if v, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil {
		return v, true
	}
	f, err := strconv.ParseFloat(string(rest[:j]), 64)
	return int64(f), err == nil
}

// jsonString returns the plain (unescaped) string value after key.
func jsonString(data []byte, key string) string {
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return ""
	}
	rest := bytes.TrimLeft(data[i+len(key):], " ")
	if len(rest) == 0 || rest[0] != '"' {
		return ""
	}
	end := bytes.IndexByte(rest[1:], '"')
	if end < 0 {
		return ""
	}
	return string(rest[1 : 1+end])
}

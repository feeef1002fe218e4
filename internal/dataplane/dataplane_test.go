package dataplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
)

func getWithID(t testing.TB, url, callID string) <-chan result {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Call-Id", callID)
	ch := make(chan result, 1)
	go func() { ch <- do(t, req) }()
	return ch
}

func TestPathRouting(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", addr)}})

	for _, tc := range []struct{ url, path, query string }{
		{"/function/hello/a/b?x=1&y=2", "/a/b", "x=1&y=2"},
		{"/function/hello", "/", ""},
		{"/function/hello/", "/", ""},
		{"/function/hello?q=1", "/", "q=1"},
		{"/function/hello/a%2Fb", "/a/b", ""}, // Path is decoded; the escaped form travels in RawPath
	} {
		r := get(t, srv.URL+tc.url)
		s := decodeSeen(t, r)
		if s.Path != tc.path || s.RawQuery != tc.query {
			t.Errorf("%s: upstream saw path %q query %q, want %q %q", tc.url, s.Path, s.RawQuery, tc.path, tc.query)
		}
		if s.Sandbox != "sb-1" {
			t.Errorf("%s: upstream X-Brisk-Sandbox %q", tc.url, s.Sandbox)
		}
		if s.XFF != "127.0.0.1" || s.XFHost != strings.TrimPrefix(srv.URL, "http://") {
			t.Errorf("%s: X-Forwarded-For %q X-Forwarded-Host %q", tc.url, s.XFF, s.XFHost)
		}
		if got := r.header.Get("X-Brisk-Sandbox"); got != "sb-1" {
			t.Errorf("%s: response X-Brisk-Sandbox %q", tc.url, got)
		}
		if !regexp.MustCompile(`^queue_us=\d+, cold=false, proxy_us=\d+$`).MatchString(r.header.Get("X-Brisk-Timing")) {
			t.Errorf("%s: X-Brisk-Timing %q", tc.url, r.header.Get("X-Brisk-Timing"))
		}
	}

	// The escaped form of the rest of the path is kept.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/function/hello/a%2Fb", nil)
	raw := ""
	addr2 := newSandbox(t, func(w http.ResponseWriter, r *http.Request) { raw = r.URL.EscapedPath() })
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("raw")}, Added: []*briskv1.Endpoint{ep("raw", "sb-raw", addr2)}})
	req.URL.Path, req.URL.RawPath = "/function/raw/a/b", "/function/raw/a%2Fb"
	if r := do(t, req); r.code != 200 || raw != "/a%2Fb" {
		t.Errorf("escaped rest: status %d, upstream saw %q, want /a%%2Fb", r.code, raw)
	}

	// A front end's X-Forwarded-For is appended to, not replaced.
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/function/hello", nil)
	req.Header.Set("X-Forwarded-For", "10.0.0.1")
	if s := decodeSeen(t, do(t, req)); s.XFF != "10.0.0.1, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want appended", s.XFF)
	}
}

func TestHostRouting(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", addr)}})

	for _, host := range []string{"hello.brisk.local", "hello.default.example.com", "hello:8080", "hello", "Hello.Brisk.Local"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x/y?z=1", nil)
		req.Host = host
		s := decodeSeen(t, do(t, req))
		if s.Path != "/x/y" || s.RawQuery != "z=1" || s.Sandbox != "sb-1" {
			t.Errorf("Host %s: upstream saw %+v", host, s)
		}
		if s.XFHost != host {
			t.Errorf("Host %s: X-Forwarded-Host %q", host, s.XFHost)
		}
	}

	// Reserved paths belong to the function when the Host names one...
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/healthz", nil)
	req.Host = "hello.brisk.local"
	if s := decodeSeen(t, do(t, req)); s.Path != "/healthz" {
		t.Errorf("Host-routed /healthz reached %q", s.Path)
	}
	// ...and to the data plane otherwise.
	if r := get(t, srv.URL+"/healthz"); r.code != 200 || r.body != "ok\n" {
		t.Errorf("/healthz: %d %q", r.code, r.body)
	}
}

func TestNotFound(t *testing.T) {
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}})

	wantError(t, get(t, srv.URL+"/function/nope/x"), 404, `function "nope" not found`)
	wantError(t, get(t, srv.URL+"/function/"), 404, `function "" not found`)
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x", nil)
	req.Host = "nope.example.com"
	wantError(t, do(t, req), 404, `function "nope" not found`)
	// A Host that is an address names nothing; the message says how to call.
	wantError(t, get(t, srv.URL+"/x"), 404, "/function/NAME")
	// The path names the function; a matching Host does not override it.
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/function/nope", nil)
	req.Host = "hello.example.com"
	wantError(t, do(t, req), 404, `function "nope" not found`)
}

func TestBodyLimit(t *testing.T) {
	const limit = 1024
	d, srv := newTestDP(t, func(c *Config) { c.MaxBodyBytes = limit })
	var hits sync.Map
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Store(r.Header.Get("X-Call-Id"), true)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", addr)}})

	post := func(id string, body io.Reader, length int64) result {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/function/hello", body)
		req.ContentLength = length
		req.Header.Set("X-Call-Id", id)
		return do(t, req)
	}
	if r := post("fits", strings.NewReader(strings.Repeat("x", limit)), limit); r.code != 200 {
		t.Fatalf("body at the limit: %d %s", r.code, r.body)
	}
	wantError(t, post("declared", strings.NewReader(strings.Repeat("x", limit+1)), limit+1), 413, "larger than 1024 bytes")
	if _, ok := hits.Load("declared"); ok {
		t.Error("a body over the limit by Content-Length reached the sandbox")
	}
	// Chunked: no length up front, so the limit trips while streaming.
	r := post("chunked", io.MultiReader(strings.NewReader(strings.Repeat("x", 4*limit))), -1)
	wantError(t, r, 413, "larger than 1024 bytes")
	if r := post("chunked-ok", io.MultiReader(strings.NewReader("small")), -1); r.code != 200 {
		t.Fatalf("small chunked body: %d %s", r.code, r.body)
	}
}

func TestQueueWaitsForSlot(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", g.addr)}})

	first := getWithID(t, srv.URL+"/function/hello", "first")
	if id := recv(t, g.arrived, "first request at the sandbox"); id != "first" {
		t.Fatalf("arrived %q", id)
	}
	second := getWithID(t, srv.URL+"/function/hello", "second")
	waitFor(t, "second request queued", func() bool { return d.queued("hello") == 1 })
	select {
	case id := <-g.arrived:
		t.Fatalf("%q reached the sandbox while its only slot was taken", id)
	default:
	}
	g.release <- struct{}{}
	if r := recv(t, first, "first response"); r.code != 200 || r.body != "done first" {
		t.Fatalf("first: %d %q", r.code, r.body)
	}
	if id := recv(t, g.arrived, "second request at the sandbox"); id != "second" {
		t.Fatalf("arrived %q", id)
	}
	g.release <- struct{}{}
	r := recv(t, second, "second response")
	if r.code != 200 || r.body != "done second" {
		t.Fatalf("second: %d %q", r.code, r.body)
	}
	if m := regexp.MustCompile(`queue_us=(\d+), cold=false`).FindStringSubmatch(r.header.Get("X-Brisk-Timing")); m == nil || m[1] == "0" {
		t.Errorf("queued request's X-Brisk-Timing %q: want queue_us > 0, cold=false", r.header.Get("X-Brisk-Timing"))
	}
}

func TestQueueFIFO(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", g.addr)}})
	const n = 5
	var res []<-chan result
	for i := range n {
		res = append(res, getWithID(t, srv.URL+"/function/hello", fmt.Sprint(i)))
		if i == 0 {
			recv(t, g.arrived, "first arrival")
		} else {
			waitFor(t, "queued", func() bool { return d.queued("hello") == i })
		}
	}
	for i := range n {
		if i > 0 {
			if id := recv(t, g.arrived, "arrival"); id != fmt.Sprint(i) {
				t.Fatalf("arrival %d was %q: the queue is not FIFO", i, id)
			}
		}
		g.release <- struct{}{}
		if r := recv(t, res[i], "response"); r.code != 200 {
			t.Fatalf("request %d: %d %s", i, r.code, r.body)
		}
	}
}

func TestQueueFull(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("hello", func(s *briskv1.FunctionSpec) { s.QueueDepth = 1 })},
		Added:     []*briskv1.Endpoint{ep("hello", "sb-1", g.addr)}})
	first := getWithID(t, srv.URL+"/function/hello", "1")
	recv(t, g.arrived, "first arrival")
	second := getWithID(t, srv.URL+"/function/hello", "2")
	waitFor(t, "second queued", func() bool { return d.queued("hello") == 1 })
	wantError(t, get(t, srv.URL+"/function/hello"), 503, "queue full")
	g.release <- struct{}{}
	g.release <- struct{}{}
	for _, ch := range []<-chan result{first, second} {
		if r := recv(t, ch, "response"); r.code != 200 {
			t.Fatalf("%d %s", r.code, r.body)
		}
	}
}

func TestQueueTimeout(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("hello", func(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 50 })},
		Added:     []*briskv1.Endpoint{ep("hello", "sb-1", g.addr)}})
	first := getWithID(t, srv.URL+"/function/hello", "1")
	recv(t, g.arrived, "first arrival")
	wantError(t, get(t, srv.URL+"/function/hello"), 504, "timed out after 50ms waiting for a sandbox")
	if q := d.queued("hello"); q != 0 {
		t.Errorf("queue holds %d after the timeout", q)
	}
	g.release <- struct{}{}
	if r := recv(t, first, "first response"); r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
}

func TestClientGoneWhileQueued(t *testing.T) {
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("cold")}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/function/cold", nil)
	done := make(chan result, 1)
	go func() { done <- do(t, req) }()
	waitFor(t, "request queued", func() bool { return d.queued("cold") == 1 })
	cancel()
	if r := recv(t, done, "cancelled request"); r.err == nil {
		t.Fatalf("cancelled request returned %d", r.code)
	}
	waitFor(t, "queue empty after the client left", func() bool { return d.queued("cold") == 0 })
	waitFor(t, "499 counted", func() bool {
		return strings.Contains(get(t, srv.URL+"/metrics").body, `brisk_dataplane_requests_total{code="499",function="cold"} 1`)
	})
}

func TestClientGoneWhileSandboxRuns(t *testing.T) {
	d, srv := newTestDP(t, nil)
	started := make(chan struct{}, 1)
	abandoned := make(chan struct{}, 1)
	sandbox := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") == "" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		started <- struct{}{}
		select { // a long function: only the data plane closing the call ends it
		case <-r.Context().Done():
			abandoned <- struct{}{}
		case <-time.After(time.Minute):
		}
	})
	// One sandbox of concurrency 1 and a long timeout: the slot comes back
	// only if the call is abandoned.
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long", func(s *briskv1.FunctionSpec) { s.TimeoutMs = 60_000; s.QueueTimeoutMs = 60_000 })},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", sandbox)}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/function/long", nil)
	req.Header.Set("X-Block", "1")
	done := make(chan result, 1)
	go func() { done <- do(t, req) }()
	recv(t, started, "the call reached the sandbox")
	cancel()
	if r := recv(t, done, "cancelled request"); r.err == nil {
		t.Fatalf("cancelled request returned %d", r.code)
	}
	recv(t, abandoned, "the sandbox seeing its call abandoned")
	if r := get(t, srv.URL+"/function/long"); r.code != 200 || r.body != "ok" {
		t.Fatalf("next call on the freed slot: %d %q", r.code, r.body)
	}
	waitFor(t, "499 counted", func() bool {
		return strings.Contains(get(t, srv.URL+"/metrics").body, `brisk_dataplane_requests_total{code="499",function="long"} 1`)
	})
}

func TestColdStart(t *testing.T) {
	d, srv := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}})
	res := goGet(t, srv.URL+"/function/hello/x")
	waitFor(t, "request queued", func() bool { return d.queued("hello") == 1 })
	d.Apply(&briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("hello", "sb-new", newSandbox(t, echo))}})
	r := recv(t, res, "cold response")
	if s := decodeSeen(t, r); s.Sandbox != "sb-new" || s.Path != "/x" {
		t.Fatalf("upstream saw %+v", s)
	}
	if timing := r.header.Get("X-Brisk-Timing"); !strings.Contains(timing, "cold=true") {
		t.Errorf("X-Brisk-Timing %q: want cold=true", timing)
	}
	r = get(t, srv.URL+"/function/hello")
	if timing := r.header.Get("X-Brisk-Timing"); r.code != 200 || !strings.HasPrefix(timing, "queue_us=0, cold=false") {
		t.Errorf("warm call: %d, X-Brisk-Timing %q: want queue_us=0, cold=false", r.code, timing)
	}
	m := get(t, srv.URL+"/metrics").body
	for _, want := range []string{
		`brisk_dataplane_cold_starts_total{function="hello"} 1`,
		`brisk_dataplane_requests_total{code="200",function="hello"} 2`,
		`brisk_dataplane_endpoints{function="hello"} 1`,
		`brisk_dataplane_queued{function="hello"} 0`,
		`brisk_dataplane_queue_wait_seconds_count 1`,
		`brisk_dataplane_request_duration_seconds_count{function="hello"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestConcurrencyLimit(t *testing.T) {
	const (
		sandboxes = 3
		requests  = 50
	)
	d, srv := newTestDP(t, nil)
	// Each request holds its slot until every slot is taken (or too few
	// requests remain to take them), so requests overlap as much as the data
	// plane lets them; without the limit they would pile onto one sandbox.
	var (
		mu       sync.Mutex
		cond     = sync.NewCond(&mu)
		inFlight = map[string]int{}
		maxSeen  = map[string]int{}
		total    int
		done     int
	)
	h := func(w http.ResponseWriter, r *http.Request) {
		sb := r.Header.Get("X-Brisk-Sandbox")
		mu.Lock()
		inFlight[sb]++
		total++
		maxSeen[sb] = max(maxSeen[sb], inFlight[sb])
		cond.Broadcast()
		for total < min(sandboxes, requests-done) {
			cond.Wait()
		}
		inFlight[sb]--
		total--
		done++
		cond.Broadcast()
		mu.Unlock()
	}
	var eps []*briskv1.Endpoint
	for i := range sandboxes {
		eps = append(eps, ep("hello", fmt.Sprintf("sb-%d", i), newSandbox(t, h)))
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: eps})

	var wg sync.WaitGroup
	codes := make(chan int, requests)
	for range requests {
		wg.Go(func() { codes <- get(t, srv.URL+"/function/hello").code })
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("status %d", c)
		}
	}
	for sb, m := range maxSeen {
		if m > 1 {
			t.Errorf("sandbox %s saw %d concurrent requests; capacity is 1", sb, m)
		}
	}
	if done != requests {
		t.Errorf("%d requests reached sandboxes, want %d", done, requests)
	}
}

// TestEndpointRemovalMidFlight: a call in a sandbox withdrawn meanwhile
// completes, and until it has, every report lists the sandbox as draining
// (the control plane kills it only then), the first at once.
func TestEndpointRemovalMidFlight(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	idle := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")},
		Added: []*briskv1.Endpoint{ep("hello", "sb-1", g.addr)}})
	res := getWithID(t, srv.URL+"/function/hello", "inflight")
	recv(t, g.arrived, "arrival")
	d.Apply(&briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("hello", "sb-idle", idle)}})
	d.Apply(&briskv1.EndpointBatch{Removed: []string{"sb-1", "sb-idle"}})
	if n := len(d.lookup("hello").set.Load().Endpoints); n != 0 {
		t.Fatalf("%d endpoints after removal", n)
	}
	if len(d.urgentBell) != 1 {
		t.Fatal("withdrawing a sandbox with a call in it rang no report")
	}
	for _, rep := range []*briskv1.MetricsReport{d.collectUrgent(time.Now()), d.collect(time.Now(), time.Second)} {
		if got := rep.GetDraining(); len(got) != 1 || got[0] != "sb-1" {
			t.Fatalf("report lists %v as draining, want [sb-1] (the idle one goes at once)", got)
		}
	}
	g.release <- struct{}{}
	if r := recv(t, res, "response"); r.code != 200 || r.body != "done inflight" {
		t.Fatalf("in-flight request on a removed endpoint: %d %q", r.code, r.body)
	}
	waitFor(t, "the call's slot released", func() bool {
		return len(d.collect(time.Now(), time.Second).GetDraining()) == 0
	})
	// Idle, both are forgotten at the next periodic report after that.
	d.collect(time.Now(), time.Second)
	d.drainMu.Lock()
	left := len(d.draining)
	d.drainMu.Unlock()
	if left != 0 {
		t.Fatalf("%d withdrawn endpoints still watched after two idle reports", left)
	}
}

// A call in flight when its function's concurrency changes runs on the
// endpoint's old tracker; the sandbox withdrawn after that is still listed
// as draining until the call ends, so the control plane does not kill it
// under the call.
func TestDrainSeesCallsAcrossAConcurrencyChange(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")},
		Added: []*briskv1.Endpoint{ep("hello", "sb-1", g.addr)}})
	res := getWithID(t, srv.URL+"/function/hello", "inflight")
	recv(t, g.arrived, "arrival")
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("hello", func(s *briskv1.FunctionSpec) {
		s.Revision, s.Concurrency = 2, 4
	})}})
	if c := d.lookup("hello").set.Load().Endpoints[0].tracker.Capacity(); c != 4 {
		t.Fatalf("endpoint on a tracker of %d after the change, want 4", c)
	}
	d.Apply(&briskv1.EndpointBatch{Removed: []string{"sb-1"}})
	if len(d.urgentBell) != 1 {
		t.Fatal("withdrawing a sandbox with a call in it rang no report")
	}
	if got := d.collect(time.Now(), time.Second).GetDraining(); len(got) != 1 || got[0] != "sb-1" {
		t.Fatalf("report lists %v as draining, want [sb-1]", got)
	}
	g.release <- struct{}{}
	if r := recv(t, res, "response"); r.code != 200 {
		t.Fatalf("the call in flight: %d %q", r.code, r.body)
	}
	waitFor(t, "the call's slot released", func() bool {
		return len(d.collect(time.Now(), time.Second).GetDraining()) == 0
	})
}

// A call that picked a sandbox before two concurrency changes in a row
// may take its slot on the first tracker after both: a drain still counts
// it, whether or not that tracker was busy at the second change.
func TestDrainSeesCallsAcrossTwoQuickConcurrencyChanges(t *testing.T) {
	t0 := loadbalance.NewTracker(1)
	e0 := &endpoint{id: "sb-1", tracker: t0}
	e2 := e0.WithTracker(loadbalance.NewTracker(2)).WithTracker(loadbalance.NewTracker(4))
	if !t0.TryReserve() { // the late call, on the set before both changes
		t.Fatal("reserving on the first tracker")
	}
	if n := e2.inFlight(); n != 1 {
		t.Fatalf("in flight after two changes: %d, want the late call's 1", n)
	}
	t0.Release()
	e5 := e2.WithTracker(loadbalance.NewTracker(5)).WithTracker(loadbalance.NewTracker(6)).WithTracker(loadbalance.NewTracker(7))
	if len(e5.older) != keptIdle {
		t.Errorf("after five changes an idle endpoint keeps %d earlier trackers, want %d", len(e5.older), keptIdle)
	}
}

func TestSnapshotReplacesState(t *testing.T) {
	d, srv := newTestDP(t, nil)
	g := newGate(t)
	gateAddr := g.addr
	echoAddr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("a"), fnSpec("b")},
		Added:     []*briskv1.Endpoint{ep("a", "sb-a", echoAddr), ep("b", "sb-b1", gateAddr)}})
	if s := decodeSeen(t, get(t, srv.URL+"/function/a")); s.Sandbox != "sb-a" {
		t.Fatalf("a served by %q", s.Sandbox)
	}
	busy := getWithID(t, srv.URL+"/function/b", "busy")
	recv(t, g.arrived, "arrival on sb-b1")

	// A resync snapshot: a is gone, b keeps sb-b1 and gains sb-b2, and a
	// stray delta-only field is ignored.
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("b")},
		Added:     []*briskv1.Endpoint{ep("b", "sb-b1", gateAddr), ep("b", "sb-b2", echoAddr)},
		Removed:   []string{"sb-b2"}})
	wantError(t, get(t, srv.URL+"/function/a"), 404, `function "a" not found`)
	// sb-b1 kept its tracker (its slot is still taken), so b's next request
	// must go to sb-b2 rather than double up on sb-b1.
	for range 10 {
		if s := decodeSeen(t, get(t, srv.URL+"/function/b")); s.Sandbox != "sb-b2" {
			t.Fatalf("b served by %q while sb-b1 is busy", s.Sandbox)
		}
	}
	g.release <- struct{}{}
	if r := recv(t, busy, "busy response"); r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	m := get(t, srv.URL+"/metrics").body
	if strings.Contains(m, `function="a"`) {
		t.Error("metrics of the deleted function a are still exported")
	}
	if !strings.Contains(m, `brisk_dataplane_endpoints{function="b"} 2`) {
		t.Error("endpoint gauge of b is not 2")
	}
}

func TestDeltaUpdates(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, echo)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 2 })}})
	// An older revision is ignored; a newer one applies.
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 1; s.Concurrency = 7 })}})
	if c := d.lookup("f").set.Load().Conf; c.revision != 2 || c.capacity != 1 {
		t.Fatalf("stale revision applied: %+v", c)
	}
	d.Apply(&briskv1.EndpointBatch{
		Functions: []*briskv1.FunctionSpec{fnSpec("f", func(s *briskv1.FunctionSpec) { s.Revision = 3; s.Concurrency = 4; s.LoadBalancing = "round-robin" })},
		Added:     []*briskv1.Endpoint{ep("f", "sb-2", addr), ep("f", "sb-1", addr)},
	})
	set := d.lookup("f").set.Load()
	if set.Conf.revision != 3 || set.Conf.capacity != 4 || len(set.Endpoints) != 2 || set.Endpoints[0].id != "sb-1" || set.Endpoints[1].tracker.Capacity() != 4 {
		t.Fatalf("after update: conf %+v, eps %v", set.Conf, set.Endpoints)
	}
	// Deleting fails the function's queued requests.
	wantError(t, get(t, srv.URL+"/function/g"), 404, `function "g" not found`)
	d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("g")}})
	res := goGet(t, srv.URL+"/function/g")
	waitFor(t, "queued", func() bool { return d.queued("g") == 1 })
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"g"}})
	wantError(t, recv(t, res, "response"), 404, `function "g" was deleted`)
}

func TestCallID(t *testing.T) {
	d, srv := newTestDP(t, func(c *Config) { c.MaxBodyBytes = 16 })
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", newSandbox(t, echo))}})

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/function/hello", nil)
	req.Header.Set("X-Call-Id", "client-chosen")
	r := do(t, req)
	if s := decodeSeen(t, r); s.CallID != "client-chosen" || r.header.Get("X-Call-Id") != "client-chosen" {
		t.Errorf("client id: upstream %q, response %q", s.CallID, r.header.Get("X-Call-Id"))
	}

	r = get(t, srv.URL+"/function/hello")
	s := decodeSeen(t, r)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(s.CallID) || r.header.Get("X-Call-Id") != s.CallID {
		t.Errorf("generated id: upstream %q, response %q", s.CallID, r.header.Get("X-Call-Id"))
	}
	if r2 := get(t, srv.URL+"/function/hello"); r2.header.Get("X-Call-Id") == s.CallID {
		t.Error("two calls got the same generated id")
	}
	// brisk-generated errors carry it too.
	for _, path := range []string{"/function/hello", "/function/nope"} {
		req, _ = http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(strings.Repeat("x", 17)))
		req.Header.Set("X-Call-Id", "err-"+path)
		if r := do(t, req); r.code < 400 || r.header.Get("X-Call-Id") != "err-"+path {
			t.Errorf("%s: error response %d has X-Call-Id %q", path, r.code, r.header.Get("X-Call-Id"))
		}
	}
}

func TestUpstreamErrors(t *testing.T) {
	d, srv := newTestDP(t, nil)
	slow := newSandbox(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("broken", shortQueue), fnSpec("slow", func(s *briskv1.FunctionSpec) { s.TimeoutMs = 50 })},
		Added:     []*briskv1.Endpoint{ep("broken", "sb-x", "127.0.0.1:1"), ep("slow", "sb-s", slow)}})
	// (The refusing endpoint leaves the set with the call: kept here. The
	// call waits in the queue for another sandbox, briefly here, and fails
	// with the refusal.)
	eps := map[string]*endpoint{"broken": d.lookup("broken").set.Load().Endpoints[0], "slow": d.lookup("slow").set.Load().Endpoints[0]}
	wantError(t, get(t, srv.URL+"/function/broken"), 502, "sandbox sb-x")
	wantError(t, get(t, srv.URL+"/function/slow"), 504, `function "slow" timed out after 50ms`)
	// Both released their slots.
	for name, ep := range eps {
		if n := ep.tracker.InFlight(); n != 0 {
			t.Errorf("%s: %d slots still taken", name, n)
		}
	}
}

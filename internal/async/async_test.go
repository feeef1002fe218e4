package async

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// scripted is an Invoker whose replies the test chooses per call.
type scripted struct {
	mu     sync.Mutex
	calls  map[string]int // call id -> attempts seen
	reply  func(c *Call, attempt int) Result
	policy Policy
	known  map[string]bool
}

func newScripted(reply func(*Call, int) Result) *scripted {
	return &scripted{calls: map[string]int{}, reply: reply, known: map[string]bool{"fn": true},
		policy: Policy{MaxAttempts: 3, MaxAge: time.Hour, Backoff: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Concurrency: 8}}
}

func (s *scripted) Policy(_ context.Context, fn string) (Policy, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy, s.known[fn]
}

func (s *scripted) Invoke(_ context.Context, c *Call, _ int) Result {
	s.mu.Lock()
	s.calls[c.ID]++
	n := s.calls[c.ID]
	s.mu.Unlock()
	return s.reply(c, n)
}

func (s *scripted) attempts(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[id]
}

func ok(body string) Result {
	return Result{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(body)}
}

type env struct {
	srv *Server
	q   *Queue
	dir string
}

func start(t testing.TB, dir string, cfg Config) *env {
	t.Helper()
	srv, err := StartServer(ServerConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	q, err := Open(context.Background(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: srv, q: q, dir: dir}
	t.Cleanup(func() { nc.Close(); srv.Shutdown() })
	return e
}

func run(t *testing.T, q *Queue, inv Invoker) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx, inv) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return cancel
}

func submit(t *testing.T, q *Queue, id, cb string) {
	t.Helper()
	c := &Call{ID: id, Function: "fn", Method: "POST", Path: "/x", Query: "a=1", Header: http.Header{"X-Test": {id}}, Body: []byte("body-" + id), CallbackURL: cb}
	if err := q.Submit(context.Background(), c); err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
}

func waitStatus(t *testing.T, q *Queue, id string, want Status) *Record {
	t.Helper()
	var last *Record
	testutil.Eventually(t, 20*time.Second, func() bool {
		r, err := q.Get(context.Background(), id)
		if err != nil {
			return false
		}
		last = r
		return r.Status == want
	}, "call %s never reached %s (last: %+v)", id, want, last)
	return last
}

func TestSubmitRunSucceeds(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	var got *Call
	var mu sync.Mutex
	inv := newScripted(func(c *Call, _ int) Result {
		mu.Lock()
		got = c
		mu.Unlock()
		return ok("hello " + string(c.Body))
	})
	submit(t, e.q, "c1", "")
	// Before any consumer runs, the call is queued.
	if r, err := e.q.Get(context.Background(), "c1"); err != nil || r.Status != StatusQueued || r.Function != "fn" {
		t.Fatalf("before run: %+v %v", r, err)
	}
	run(t, e.q, inv)
	r := waitStatus(t, e.q, "c1", StatusSucceeded)
	if r.Attempts != 1 || r.Result == nil || string(r.Result.Body) != "hello body-c1" || r.Result.Status != 200 {
		t.Fatalf("record: %+v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.Method != "POST" || got.Path != "/x" || got.Query != "a=1" || got.Header.Get("X-Test") != "c1" {
		t.Fatalf("the invoker saw %+v", got)
	}
	if _, err := e.q.Get(context.Background(), "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown call: %v", err)
	}
	if _, err := e.q.Get(context.Background(), "bad.id"); !errors.Is(err, ErrBadID) {
		t.Fatalf("bad id: %v", err)
	}
}

func TestQueuedFoundWithoutRecord(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	submit(t, e.q, "lost-record", "")
	testutil.Eventually(t, 5*time.Second, func() bool {
		_, err := e.q.status.Get(context.Background(), "lost-record")
		return err == nil
	}, "queued record never written")
	if err := e.q.status.Purge(context.Background(), "lost-record"); err != nil {
		t.Fatal(err)
	}
	r, err := e.q.Get(context.Background(), "lost-record")
	if err != nil || r.Status != StatusQueued || r.Function != "fn" {
		t.Fatalf("from the stream: %+v %v", r, err)
	}
}

func TestPlatformFailuresRetryThenDeadThenRetryByHand(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	var fail atomic.Bool
	fail.Store(true)
	inv := newScripted(func(c *Call, n int) Result {
		if fail.Load() {
			return Result{Status: 503, PlatformError: "no-capacity"}
		}
		return ok("fine")
	})
	run(t, e.q, inv)
	start := time.Now()
	submit(t, e.q, "d1", "")
	r := waitStatus(t, e.q, "d1", StatusDead)
	if inv.attempts("d1") != 3 || r.Attempts != 3 {
		t.Fatalf("attempts: invoker %d, record %d; want 3", inv.attempts("d1"), r.Attempts)
	}
	// Back-off 20 ms then 40 ms at least.
	if el := time.Since(start); el < 60*time.Millisecond {
		t.Fatalf("three attempts in %v: back-off not applied", el)
	}
	if r.Error == "" || r.Result == nil || r.Result.PlatformError != "no-capacity" {
		t.Fatalf("dead record: %+v", r)
	}
	if n, err := e.q.dead.Info(context.Background()); err != nil || n.State.Msgs != 1 {
		t.Fatalf("dead letters: %+v %v", n, err)
	}
	fail.Store(false)
	if _, err := e.q.Retry(context.Background(), "d1", "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("retry as another function's call: %v", err)
	}
	if _, err := e.q.Retry(context.Background(), "d1", "fn"); err != nil {
		t.Fatal(err)
	}
	r = waitStatus(t, e.q, "d1", StatusSucceeded)
	if r.Attempts != 1 || inv.attempts("d1") != 4 {
		t.Fatalf("after retry: record attempts %d, invoker %d", r.Attempts, inv.attempts("d1"))
	}
	if n, _ := e.q.dead.Info(context.Background()); n.State.Msgs != 0 {
		t.Fatalf("retried call still in the dead-letter stream: %d", n.State.Msgs)
	}
	if _, err := e.q.Retry(context.Background(), "d1", "fn"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("retry of a call not dead: %v", err)
	}
}

func TestFunctionErrors(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	inv := newScripted(func(c *Call, n int) Result { return Result{Status: 500, Body: []byte("boom")} })
	run(t, e.q, inv)
	submit(t, e.q, "f1", "")
	r := waitStatus(t, e.q, "f1", StatusFailed)
	if inv.attempts("f1") != 1 || r.Result.Status != 500 {
		t.Fatalf("a function's 500 is not retried by default: %d attempts, %+v", inv.attempts("f1"), r)
	}
	inv.mu.Lock()
	inv.policy.RetryFunctionErrors = true
	inv.mu.Unlock()
	submit(t, e.q, "f2", "")
	waitStatus(t, e.q, "f2", StatusDead)
	if inv.attempts("f2") != 3 {
		t.Fatalf("retry_function_errors: %d attempts, want 3", inv.attempts("f2"))
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		res         Result
		retryFnErrs bool
		retry       bool
	}{
		{Result{Status: 200}, false, false},
		{Result{Status: 404}, true, false},
		{Result{Status: 429}, false, true},
		{Result{Status: 500}, false, false},
		{Result{Status: 500}, true, true},
		{Result{Status: 503, PlatformError: "no-capacity"}, false, true},
		{Result{Status: 504, PlatformError: "queue-timeout"}, false, true},
		{Result{Status: 502, PlatformError: "sandbox-failed"}, false, true},
		{Result{Status: 0, PlatformError: "connection refused"}, false, true},
		{Result{Status: 504, PlatformError: "function-timeout"}, false, false},
		{Result{Status: 504, PlatformError: "function-timeout"}, true, true},
		{Result{Status: 404, PlatformError: "function-deleted"}, true, false},
	} {
		if got, why := classify(&c.res, Policy{RetryFunctionErrors: c.retryFnErrs}); got != c.retry {
			t.Errorf("%+v (retry function errors %v): retry %v (%s), want %v", c.res, c.retryFnErrs, got, why, c.retry)
		}
	}
	p := Policy{Backoff: time.Second, BackoffMax: 5 * time.Second}
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 10: 5 * time.Second} {
		if d := backoff(p, n); d < want || d > want+want/10 {
			t.Errorf("backoff after attempt %d: %v, want %v plus at most 10%%", n, d, want)
		}
	}
}

func TestUnknownFunctionAndExpiry(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	inv := newScripted(func(c *Call, n int) Result { return ok("x") })
	inv.known = map[string]bool{}
	run(t, e.q, inv)
	submit(t, e.q, "gone", "")
	r := waitStatus(t, e.q, "gone", StatusDead)
	if inv.attempts("gone") != 0 || r.Error == "" {
		t.Fatalf("a call of a deleted function ran or has no reason: %+v", r)
	}
	inv.mu.Lock()
	inv.known["fn"] = true
	inv.policy.MaxAge = time.Minute
	inv.mu.Unlock()
	old := &Call{ID: "old", Function: "fn", Method: "GET", Path: "/", Submitted: time.Now().Add(-2 * time.Minute)}
	if err := e.q.Submit(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.q, "old", StatusDead)
	if inv.attempts("old") != 0 {
		t.Fatal("an expired call ran")
	}
}

func TestCallback(t *testing.T) {
	type got struct {
		h    http.Header
		body string
	}
	ch := make(chan got, 4)
	var fails atomic.Int32
	fails.Store(1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fails.Add(-1) >= 0 {
			w.WriteHeader(500) // the first try fails: it must be retried
			return
		}
		b, _ := io.ReadAll(r.Body)
		ch <- got{r.Header.Clone(), string(b)}
	}))
	defer cb.Close()
	e := start(t, t.TempDir(), Config{CallbackAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	inv := newScripted(func(c *Call, n int) Result { return ok("result of " + c.ID) })
	run(t, e.q, inv)
	submit(t, e.q, "cb1", cb.URL+"/done")
	select {
	case g := <-ch:
		if g.body != "result of cb1" || g.h.Get("X-Call-Id") != "cb1" || g.h.Get("X-Function-Name") != "fn" ||
			g.h.Get("X-Function-Status") != "200" || g.h.Get("X-Duration-Seconds") == "" {
			t.Fatalf("callback: %+v", g)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no callback")
	}
	r := waitStatus(t, e.q, "cb1", StatusSucceeded)
	if r.Callback != "delivered" {
		t.Fatalf("record callback %q", r.Callback)
	}
}

func TestCallbackToLoopbackRefusedByDefault(t *testing.T) {
	hit := make(chan struct{}, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit <- struct{}{} }))
	defer cb.Close()
	e := start(t, t.TempDir(), Config{CallbackAttempts: 1})
	run(t, e.q, newScripted(func(c *Call, n int) Result { return ok("x") }))
	submit(t, e.q, "ssrf", cb.URL)
	r := waitStatus(t, e.q, "ssrf", StatusSucceeded)
	if r.Callback == "delivered" || len(hit) != 0 {
		t.Fatalf("callback to loopback went through: %q", r.Callback)
	}
}

func TestDuplicateSubmitStoredOnce(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	submit(t, e.q, "dup", "")
	submit(t, e.q, "dup", "")
	d, err := e.q.Depth(context.Background())
	if err != nil || d["fn"] != 1 {
		t.Fatalf("depth %v %v, want 1", d, err)
	}
}

func TestQueueFull(t *testing.T) {
	e := start(t, t.TempDir(), Config{MaxQueued: 2, NamespaceShare: 1})
	submit(t, e.q, "a", "")
	submit(t, e.q, "b", "")
	err := e.q.Submit(context.Background(), &Call{ID: "c", Function: "fn", Method: "GET", Path: "/"})
	if !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third submit: %v, want ErrQueueFull", err)
	}
}

func TestPurge(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	for i := range 5 {
		submit(t, e.q, fmt.Sprintf("p%d", i), "")
	}
	n, err := e.q.Purge(context.Background(), "fn", false)
	if err != nil || n != 5 {
		t.Fatalf("purged %d %v", n, err)
	}
	if d, _ := e.q.Depth(context.Background()); d["fn"] != 0 {
		t.Fatalf("depth after purge %v", d)
	}
}

// Accepted calls survive the server stopping (and its process dying:
// test/e2e kills it with SIGKILL) and run after it restarts.
func TestSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	e := start(t, dir, Config{})
	for i := range 50 {
		submit(t, e.q, fmt.Sprintf("r%d", i), "")
	}
	e.q.nc.Close()
	e.srv.Shutdown()
	e2 := start(t, dir, Config{})
	inv := newScripted(func(c *Call, n int) Result { return ok("x") })
	run(t, e2.q, inv)
	for i := range 50 {
		waitStatus(t, e2.q, fmt.Sprintf("r%d", i), StatusSucceeded)
	}
}

// A call running longer than the ack wait is kept in progress: it is not
// delivered a second time while it runs.
func TestLongCallNotRedelivered(t *testing.T) {
	e := start(t, t.TempDir(), Config{AckWait: 300 * time.Millisecond})
	release := make(chan struct{})
	inv := newScripted(func(c *Call, n int) Result {
		<-release
		return ok("slow")
	})
	run(t, e.q, inv)
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	t.Cleanup(done) // before Run's cleanup, which waits for the attempts
	submit(t, e.q, "long", "")
	waitStatus(t, e.q, "long", StatusRunning)
	// Five ack waits pass with the call running: a redelivery would show
	// as a second attempt starting.
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := inv.attempts("long"); n != 1 {
			t.Fatalf("the running call was delivered again: %d attempts", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	done()
	r := waitStatus(t, e.q, "long", StatusSucceeded)
	if r.Attempts != 1 || inv.attempts("long") != 1 {
		t.Fatalf("attempts %d / %d, want 1", r.Attempts, inv.attempts("long"))
	}
}

// Callbacks reach public addresses only, in any spelling the dialer takes
// (names, mapped IPv6, userinfo, NAT64).
func TestCallbackAddressesRefused(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	hc := newCallbackClient(nil, 5*time.Second)
	for _, host := range []string{"127.0.0.1", "127.0.0.2", "localhost", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
		"user:pw@127.0.0.1", "evil.example@127.0.0.1", "0.0.0.0", "[::]", "[::ffff:0.0.0.0]"} {
		resp, err := hc.Post("http://"+host+":"+port+"/cb", "text/plain", nil)
		if err == nil {
			_ = resp.Body.Close()
		}
		if !errors.Is(err, errCallbackAddr) {
			t.Errorf("callback to %s: %v, want refused", host, err)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d callbacks reached a loopback server", n)
	}

	// Addresses never dialled here (no network beyond loopback in tests):
	// the check itself.
	for _, tc := range []struct {
		addr  string
		allow string
		ok    bool
	}{
		{"169.254.169.254", "", false}, // cloud metadata
		{"::ffff:169.254.169.254", "", false},
		{"fe80::1", "", false},
		{"fd00:ec2::254", "", false},      // AWS's IPv6 metadata service (not link-local)
		{"100.100.100.200", "", false},    // Alibaba Cloud's metadata service
		{"64:ff9b::a9fe:a9fe", "", false}, // NAT64 for 169.254.169.254
		{"64:ff9b::7f00:1", "", false},    // NAT64 for 127.0.0.1
		{"64:ff9b::a00:1", "", false},     // NAT64 for 10.0.0.1
		{"224.0.0.1", "", false},
		{"ff02::1", "", false},
		// The cluster's own network: callbacks go to public addresses
		// unless --async-callback-allow lists a range.
		{"10.1.2.3", "", false},
		{"172.16.0.1", "", false},
		{"192.168.1.1", "", false},
		{"::ffff:192.168.1.1", "", false},
		{"fd12:3456::1", "", false},
		{"100.64.0.1", "", false}, // carrier-grade NAT, and many overlay networks
		{"0.1.2.3", "", false},
		{"93.184.216.34", "", true},
		{"2001:db8::1", "", true},
		{"64:ff9b::5db8:d822", "", true}, // NAT64 for a public address
		{"127.0.0.1", "127.0.0.0/8", true},
		{"169.254.169.254", "169.254.0.0/16", true},
		{"10.1.2.3", "10.0.0.0/8", true},
		{"64:ff9b::a00:1", "10.0.0.0/8", true},
	} {
		var allow []netip.Prefix
		if tc.allow != "" {
			allow = []netip.Prefix{netip.MustParsePrefix(tc.allow)}
		}
		if got := callbackAllowed(netip.MustParseAddr(tc.addr), allow); got != tc.ok {
			t.Errorf("callbackAllowed(%s, %q) = %v, want %v", tc.addr, tc.allow, got, tc.ok)
		}
	}
}

// Every address of the host's own interfaces is refused, a public one too
// (issue 36: a callback reached a listener on the host's public address):
// checked inside a network namespace the test makes, whose interface has
// a public-looking address.
func TestCallbackRefusesTheHostsAddresses(t *testing.T) {
	testutil.RequiresRoot(t)
	const ns = "bcbhost"
	_ = exec.Command("ip", "netns", "del", ns).Run()
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"-n", ns, "addr", "add", "198.51.100.7/32", "dev", "d0"},
		{"-n", ns, "link", "set", "d0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	var own, other bool
	if err := testutil.InNetNS("/run/netns/"+ns, func() error {
		own = callbackAllowed(netip.MustParseAddr("198.51.100.7"), nil)
		other = callbackAllowed(netip.MustParseAddr("198.51.100.8"), nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if own || !other {
		t.Fatalf("the host's own public address allowed %v, its neighbour %v: want refused, allowed", own, other)
	}
	if callbackAllowed(netip.MustParseAddr("255.255.255.255"), nil) {
		t.Fatal("the broadcast address allowed")
	}
}

// A callback's redirect is not followed: the 3xx is its answer.
func TestCallbackRedirectNotFollowed(t *testing.T) {
	var hits atomic.Int32
	inner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer inner.Close()
	outer := httptest.NewServer(http.RedirectHandler(inner.URL+"/latest/meta-data/", http.StatusTemporaryRedirect))
	defer outer.Close()
	hc := newCallbackClient([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, 5*time.Second)
	resp, err := hc.Post(outer.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusTemporaryRedirect || hits.Load() != 0 {
		t.Fatalf("redirect: %d, %d hits on its target", resp.StatusCode, hits.Load())
	}
}

// A list holds at most MaxList records, however many match and whatever
// limit is asked: the newest.
func TestListIsBounded(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	base := time.Now()
	n := MaxList + 50
	for i := range n {
		c := &Call{ID: fmt.Sprintf("l%d", i), Function: "fn", Method: "GET", Path: "/", Submitted: base.Add(time.Duration(i) * time.Second)}
		if err := e.q.Submit(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{1 << 30, MaxList + 1} {
		recs, err := e.q.List(context.Background(), Filter{Function: "fn", Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != MaxList || recs[0].ID != fmt.Sprintf("l%d", n-1) || recs[MaxList-1].ID != fmt.Sprintf("l%d", n-MaxList) {
			t.Fatalf("limit %d: %d records, %s .. %s", limit, len(recs), recs[0].ID, recs[len(recs)-1].ID)
		}
	}
	recs, err := e.q.List(context.Background(), Filter{Function: "fn", Limit: 3})
	if err != nil || len(recs) != 3 || recs[0].ID != fmt.Sprintf("l%d", n-1) || recs[2].ID != fmt.Sprintf("l%d", n-3) {
		t.Fatalf("limit 3: %v %+v", err, recs)
	}
}

// One function's backlog, stuck behind its concurrency, does not hold the
// consumer's slots: another function's call still runs, and calls put back
// meanwhile are not counted as attempts.
func TestBusyFunctionDoesNotBlockOthers(t *testing.T) {
	e := start(t, t.TempDir(), Config{MaxInFlight: 4})
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	inv := newScripted(func(c *Call, n int) Result {
		if c.Function == "slow" {
			<-release
		}
		return ok("x")
	})
	inv.known["slow"] = true
	inv.known["other"] = true
	inv.policy.Concurrency = 1
	run(t, e.q, inv)
	t.Cleanup(done)
	for i := range 10 {
		if err := e.q.Submit(context.Background(), &Call{ID: fmt.Sprintf("s%d", i), Function: "slow", Method: "POST", Path: "/"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.q.Submit(context.Background(), &Call{ID: "o1", Function: "other", Method: "POST", Path: "/"}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.q, "o1", StatusSucceeded)
	done()
	for i := range 10 {
		r := waitStatus(t, e.q, fmt.Sprintf("s%d", i), StatusSucceeded)
		if r.Attempts != 1 {
			t.Fatalf("s%d: %d attempts; calls put back while their function was busy are not attempts", i, r.Attempts)
		}
	}
}

// A call id submitted again once its call ran is the same call: accepted,
// not run a second time.
func TestResubmitIsIdempotent(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	inv := newScripted(func(c *Call, n int) Result { return ok("once") })
	run(t, e.q, inv)
	submit(t, e.q, "idem", "")
	waitStatus(t, e.q, "idem", StatusSucceeded)
	submit(t, e.q, "idem", "")
	// Another call after it, to know the consumer had its chance.
	submit(t, e.q, "after", "")
	waitStatus(t, e.q, "after", StatusSucceeded)
	if n := inv.attempts("idem"); n != 1 {
		t.Fatalf("resubmitted call ran %d times", n)
	}
}

// A call with a fresh (server-made) id is stored with one write, the call
// alone: it has no record until its attempt, yet Get and List say it is
// queued (from the stream); a record written already is what Get and List
// show; a call the stream refuses is not found.
func TestFreshSubmit(t *testing.T) {
	e := start(t, t.TempDir(), Config{MaxQueued: 2, NamespaceShare: 1})
	ctx := context.Background()
	fresh := func(id string) error {
		return e.q.Submit(ctx, &Call{ID: id, Function: "fn", Method: "POST", Path: "/", Body: []byte(id), Fresh: true})
	}
	if err := fresh("f1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.q.status.Get(ctx, "f1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a fresh submit wrote a record: %v", err)
	}
	if r, err := e.q.Get(ctx, "f1"); err != nil || r.Status != StatusQueued || r.Function != "fn" {
		t.Fatalf("f1 from the stream: %+v %v", r, err)
	}
	// A state written already is the call's.
	if err := e.q.putStatus(ctx, &Record{ID: "f2", Function: "fn", Status: StatusSucceeded}); err != nil {
		t.Fatal(err)
	}
	if err := fresh("f2"); err != nil {
		t.Fatal(err)
	}
	if r, err := e.q.Get(ctx, "f2"); err != nil || r.Status != StatusSucceeded {
		t.Fatalf("f2: %+v %v, want its record's succeeded", r, err)
	}
	list := func(f Filter) string {
		t.Helper()
		recs, err := e.q.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, r := range recs {
			fmt.Fprintf(&b, "%s:%s ", r.ID, r.Status)
		}
		return strings.TrimSpace(b.String())
	}
	if got := list(Filter{Function: "fn", Status: StatusQueued}); got != "f1:queued" {
		t.Fatalf("queued calls: %q, want f1 from the stream (f2 has a record)", got)
	}
	if got := list(Filter{}); got != "f1:queued f2:succeeded" && got != "f2:succeeded f1:queued" {
		t.Fatalf("all calls: %q, want f1 once and f2's record", got)
	}
	if got := list(Filter{Function: "other"}); got != "" {
		t.Fatalf("another function's calls: %q", got)
	}
	// The queue is full (MaxQueued 2): refused, and nothing to be found.
	if err := fresh("f3"); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third fresh submit: %v, want ErrQueueFull", err)
	}
	if _, err := e.q.Get(ctx, "f3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refused call: %v, want not found", err)
	}
	// The stored one runs, and leaves the queued list.
	run(t, e.q, newScripted(func(c *Call, _ int) Result { return ok("ran " + string(c.Body)) }))
	if r := waitStatus(t, e.q, "f1", StatusSucceeded); string(r.Result.Body) != "ran f1" || r.Attempts != 1 {
		t.Fatalf("f1: %+v", r)
	}
	if got := list(Filter{Status: StatusQueued}); got != "" {
		t.Fatalf("queued after the run: %q", got)
	}
}

// Listing record-less queued calls reads the queue's head (the next to
// run) of all functions or of one among others', bounded like the records,
// and a call stored twice (put back at the tail) is listed once.
func TestListFreshIsBounded(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	ctx := context.Background()
	base := time.Now()
	n := MaxList + 50
	for i := range n {
		fn := "fn"
		if i%3 == 0 {
			fn = "other"
		}
		c := &Call{ID: fmt.Sprintf("l%d", i), Function: fn, Method: "GET", Path: "/", Submitted: base.Add(time.Duration(i) * time.Second), Fresh: true}
		if err := e.q.Submit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := e.q.List(ctx, Filter{Limit: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != MaxList || recs[0].ID != fmt.Sprintf("l%d", MaxList-1) || recs[MaxList-1].ID != "l0" {
		t.Fatalf("all: %d records, %s .. %s; want the queue's first %d, newest first", len(recs), recs[0].ID, recs[len(recs)-1].ID, MaxList)
	}
	// "other" holds every third call: its first 5 are l0, l3 .. l12.
	recs, err = e.q.List(ctx, Filter{Function: "other", Status: StatusQueued, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 5 || recs[0].ID != "l12" || recs[4].ID != "l0" || recs[0].Function != "other" {
		t.Fatalf("other's first 5: %+v", recs)
	}
	all, err := e.q.List(ctx, Filter{Function: "other", Limit: MaxList})
	if err != nil || len(all) != (n+2)/3 {
		t.Fatalf("all of other's: %d, %v; want %d", len(all), err, (n+2)/3)
	}
	// l0 put back at the tail, as the consumer's requeue does: still one call.
	m, err := e.q.calls.GetLastMsgForSubject(ctx, callsPrefix+"other.l0")
	if err != nil {
		t.Fatal(err)
	}
	again := nats.NewMsg(m.Subject)
	again.Header = m.Header
	again.Header.Set(jetstream.MsgIDHeader, "l0.requeue.1")
	again.Data = m.Data
	if _, err := e.q.js.PublishMsg(ctx, again); err != nil {
		t.Fatal(err)
	}
	again2, err := e.q.List(ctx, Filter{Function: "other", Limit: MaxList})
	if err != nil || len(again2) != len(all) {
		t.Fatalf("after a requeue: %d calls (%v), want %d", len(again2), err, len(all))
	}
}

// An id a data-plane submit made is taken while its call waits, although
// it has no record: a client's submit of the same id to another function
// is refused (it would otherwise claim the call's status and, as its
// record, make the waiting call look settled), to the same function it is
// the same call; and a record of another function under the id never
// settles the call.
func TestFreshIDIsTaken(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	ctx := context.Background()
	if err := e.q.Submit(ctx, &Call{ID: "victim1", Function: "fn", Method: "POST", Path: "/", Fresh: true}); err != nil {
		t.Fatal(err)
	}
	err := e.q.Submit(ctx, &Call{ID: "victim1", Function: "attacker", Method: "POST", Path: "/"})
	if !errors.Is(err, ErrIDTaken) {
		t.Fatalf("another function's submit of a waiting call's id: %v, want ErrIDTaken", err)
	}
	if err := e.q.Submit(ctx, &Call{ID: "victim1", Function: "fn", Method: "POST", Path: "/"}); err != nil {
		t.Fatalf("the same function's submit of the id: %v, want accepted (the same call)", err)
	}
	if r, err := e.q.Get(ctx, "victim1"); err != nil || r.Function != "fn" || r.Status != StatusQueued {
		t.Fatalf("victim1: %+v %v, want fn's queued call", r, err)
	}
	if n, err := e.q.calls.Info(ctx); err != nil || n.State.Msgs != 1 {
		t.Fatalf("calls stored: %v %v, want 1", n.State.Msgs, err)
	}
	// A foreign final record (written however) does not settle fn's call
	// when it is delivered again: it runs.
	if err := e.q.putStatus(ctx, &Record{ID: "victim1", Function: "attacker", Status: StatusSucceeded, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if n, settled := e.q.priorAttempts(ctx, &Call{ID: "victim1", Function: "fn"}); n != 0 || settled {
		t.Fatalf("priorAttempts of fn's call under attacker's record: %d, %v; want 0, false", n, settled)
	}
}

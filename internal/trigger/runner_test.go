package trigger

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The runner is tested against the real queue (JetStream on an embedded
// NATS server) and its consumer; only the invocation at the end, the data
// plane's part, is this recorder.
type recorder struct {
	clk   clock.Clock
	mu    sync.Mutex
	runs  map[string]int // call id -> executions
	calls map[string]*async.Call
	early []string // calls run before their tick
}

const fnUID = "uid-fn"

func (r *recorder) Policy(_ context.Context, fn string) (async.Policy, bool) {
	return async.Policy{MaxAttempts: 3, MaxAge: time.Hour, Backoff: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Concurrency: 64, UID: fnUID}, fn == "fn"
}

func (r *recorder) Invoke(_ context.Context, c *async.Call, _ int) async.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[c.ID]++
	r.calls[c.ID] = c
	if tt := c.Header.Get("X-Brisk-Trigger-Time"); tt != "" && r.clk != nil {
		if tick, _ := time.Parse(time.RFC3339, tt); r.clk.Now().Before(tick) {
			r.early = append(r.early, c.ID)
		}
	}
	return async.Result{Status: 200}
}

func (r *recorder) ran(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

func (r *recorder) total() (calls, runs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.runs {
		calls++
		runs += n
	}
	return calls, runs
}

func (r *recorder) call(id string) *async.Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[id]
}

type rig struct {
	srv *async.Server
	nc  *nats.Conn
	q   *async.Queue
	rec *recorder
}

func newRig(t *testing.T, clk clock.Clock) *rig {
	t.Helper()
	srv, err := async.StartServer(async.ServerConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	q, err := async.Open(context.Background(), nc, async.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{clk: clk, runs: map[string]int{}, calls: map[string]*async.Call{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = q.Run(ctx, rec); close(done) }()
	t.Cleanup(func() { cancel(); <-done; nc.Close(); srv.Shutdown() })
	return &rig{srv: srv, nc: nc, q: q, rec: rec}
}

// run starts r until the test ends (or stop is called).
func run(t *testing.T, r *Runner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// records is a Record that keeps the last tick per trigger (fail: refuse).
type records struct {
	mu   sync.Mutex
	last map[string]time.Time
	fail bool
}

func (r *records) record(key string, tick time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return errors.New("registry unavailable")
	}
	r.last[key] = tick
	return nil
}

func (r *records) get(key string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[key]
}

func cronEntry(name, expr string, last time.Time) Entry {
	return Entry{Trigger: spec.Trigger{Name: name, Namespace: "default", Function: "fn", UID: "u" + name, FunctionUID: fnUID,
		Cron: &spec.CronSource{Schedule: expr, Payload: `{"from":"cron"}`, ContentType: "application/json"}}, LastTick: last}
}

// advanceUntil moves the fake clock a second at a time until cond holds:
// the runner fires on its own goroutine, so a tick may be noticed one step
// late, never early (the recorder checks).
func advanceUntil(t *testing.T, clk *clock.Fake, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool {
		if cond() {
			return true
		}
		clk.Advance(time.Second)
		return cond()
	}, what)
}

// Cron on a fake clock: each tick runs once, under its tick's id, with the
// payload, never before the tick, and the last tick is recorded.
func TestCronFiresEachTickOnceOnTheFakeClock(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	rg := newRig(t, clk)
	recs := &records{last: map[string]time.Time{}}
	r := New(Config{Queue: rg.q, Record: recs.record, Clock: clk})
	e := cronEntry("every10", "@every 10s", t0)
	r.Put(e)
	run(t, r)
	for k := 1; k <= 3; k++ {
		tick := t0.Add(time.Duration(k) * 10 * time.Second)
		id := CronCallID("uevery10", tick)
		advanceUntil(t, clk, "tick "+tick.String(), func() bool { return rg.rec.ran(id) == 1 })
		c := rg.rec.call(id)
		if string(c.Body) != `{"from":"cron"}` || c.Header.Get("Content-Type") != "application/json" || c.Header.Get("X-Brisk-Trigger") != "default/every10" {
			t.Errorf("call %s: body %q, headers %v", id, c.Body, c.Header)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return recs.get(e.Key()).Equal(t0.Add(30 * time.Second)) }, "the last tick recorded")
	if calls, runs := rg.rec.total(); calls != 3 || runs != 3 {
		t.Errorf("%d calls, %d runs; want 3 ticks run once each", calls, runs)
	}
	if len(rg.rec.early) > 0 {
		t.Errorf("calls ran before their tick: %v", rg.rec.early)
	}
	if st := r.Status(e.Key()); st.Fired != 3 || st.State != "active" || !st.LastTick.Equal(t0.Add(30*time.Second)) {
		t.Errorf("status %+v", st)
	}
}

// A trigger's own headers go on every call; with Ce-Specversion the call
// is a CloudEvent whose id is the call's and whose time is the tick.
func TestCloudEventHeaders(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	rg := newRig(t, clk)
	e := cronEntry("ce", "@every 10s", t0)
	e.Trigger.Headers = map[string]string{"Ce-Specversion": "1.0", "Ce-Type": "dev.knative.sources.ping", "X-Team": "a"}
	r := New(Config{Queue: rg.q, Clock: clk})
	r.Put(e)
	run(t, r)
	tick := t0.Add(10 * time.Second)
	id := CronCallID("uce", tick)
	advanceUntil(t, clk, "the tick", func() bool { return rg.rec.ran(id) == 1 })
	h := rg.rec.call(id).Header
	if h.Get("Ce-Id") != id || h.Get("Ce-Time") != tick.Format(time.RFC3339Nano) || h.Get("Ce-Type") != "dev.knative.sources.ping" || h.Get("X-Team") != "a" {
		t.Errorf("headers %v", h)
	}
}

// A control plane that fired a tick but could not record it (it died, or
// the registry refused) leaves the tick to the next one, which fires it
// again under the same id: the queue runs it once.
func TestTickFiredTwiceRunsOnce(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	rg := newRig(t, clk)
	recs := &records{last: map[string]time.Time{}, fail: true}
	e := cronEntry("m", "* * * * *", t0)
	a := New(Config{Queue: rg.q, Record: recs.record, Clock: clk})
	a.Put(e)
	stopA := run(t, a)
	tick := t0.Add(time.Minute)
	id := CronCallID("um", tick)
	advanceUntil(t, clk, "the first control plane's firing", func() bool { return rg.rec.ran(id) == 1 })
	stopA()
	if !recs.get(e.Key()).IsZero() {
		t.Fatal("the tick was recorded")
	}
	// The next leader starts from the registry's last tick, t0.
	recs.fail = false
	b := New(Config{Queue: rg.q, Record: recs.record, Clock: clk})
	b.Put(e)
	run(t, b)
	testutil.Eventually(t, 10*time.Second, func() bool { return recs.get(e.Key()).Equal(tick) }, "the tick fired again and recorded")
	if st := b.Status(e.Key()); st.Fired != 1 {
		t.Errorf("second runner: %+v, want the tick queued again", st)
	}
	if calls, runs := rg.rec.total(); calls != 1 || runs != 1 {
		t.Errorf("%d calls, %d runs; want the tick run once", calls, runs)
	}
}

// After an outage, catch_up once fires the latest missed tick once;
// catch_up skip fires none that is late, and both go on from the next.
func TestCatchUp(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := t0.Add(5*time.Minute + 30*time.Second) // ticks 12:01..12:05 missed; 12:05 is 30 s late
	clk := clock.NewFake(now)
	rg := newRig(t, clk)
	once := cronEntry("once", "* * * * *", t0)
	skip := cronEntry("skip", "* * * * *", t0)
	skip.Trigger.Cron.CatchUp = spec.CatchUpSkip
	recs := &records{last: map[string]time.Time{}}
	r := New(Config{Queue: rg.q, Record: recs.record, Clock: clk})
	r.Put(once)
	r.Put(skip)
	run(t, r)
	latest := t0.Add(5 * time.Minute)
	testutil.Eventually(t, 10*time.Second, func() bool { return rg.rec.ran(CronCallID("uonce", latest)) == 1 }, "the latest missed tick fired once")
	// Both were planned in the same pass as the firing above.
	if calls, _ := rg.rec.total(); calls != 1 {
		t.Errorf("%d calls after the outage, want 1 (catch_up once's latest tick only)", calls)
	}
	if st := r.Status(skip.Key()); st.Fired != 0 || !st.Next.Equal(t0.Add(6*time.Minute)) {
		t.Errorf("skip: %+v, want nothing fired and 12:06 next", st)
	}
	next := t0.Add(6 * time.Minute)
	advanceUntil(t, clk, "both fire at the next tick", func() bool {
		return rg.rec.ran(CronCallID("uonce", next)) == 1 && rg.rec.ran(CronCallID("uskip", next)) == 1
	})
}

// A paused trigger does not fire; resumed, it fires from the next tick.
func TestPauseAndResume(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	rg := newRig(t, clk)
	r := New(Config{Queue: rg.q, Clock: clk})
	paused := cronEntry("p", "@every 10s", t0)
	paused.Trigger.Paused = true
	control := cronEntry("c", "@every 10s", t0)
	r.Put(paused)
	r.Put(control)
	run(t, r)
	for k := 1; k <= 3; k++ {
		id := CronCallID("uc", t0.Add(time.Duration(k)*10*time.Second))
		advanceUntil(t, clk, "the control trigger", func() bool { return rg.rec.ran(id) == 1 })
	}
	if calls, _ := rg.rec.total(); calls != 3 {
		t.Errorf("%d calls: the paused trigger fired", calls)
	}
	if st := r.Status(paused.Key()); st.State != "paused" || st.Fired != 0 {
		t.Errorf("paused: %+v", st)
	}
	resumed := paused
	resumed.Trigger.Paused = false
	resumed.LastTick = clk.Now()
	r.Put(resumed)
	next := clk.Now().Add(10 * time.Second).Truncate(time.Second)
	advanceUntil(t, clk, "the resumed trigger's next tick", func() bool { return rg.rec.ran(CronCallID("up", next)) == 1 })
	rg.rec.mu.Lock()
	defer rg.rec.mu.Unlock()
	for id := range rg.rec.runs {
		if strings.HasPrefix(id, CallIDPrefix+"up-") && id != CronCallID("up", next) {
			t.Errorf("resumed trigger fired %s: a tick from its pause", id)
		}
	}
}

// subjectCalls counts the calls made of messages on subject.
func subjectCalls(rec *recorder, subject string) int {
	n := 0
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, c := range rec.calls {
		if c.Header.Get("X-Brisk-Subject") == subject {
			n++
		}
	}
	return n
}

func natsEntry(name string, n spec.NATSSource) Entry {
	return Entry{Trigger: spec.Trigger{Name: name, Namespace: "default", Function: "fn", UID: "u" + name, FunctionUID: fnUID, NATS: &n}}
}

// A core NATS trigger on the cluster's connection makes a call of every
// message published while it is subscribed, with its headers.
func TestNATSTriggerOnTheClusterConnection(t *testing.T) {
	rg := newRig(t, nil)
	r := New(Config{Queue: rg.q, NATS: rg.nc})
	e := natsEntry("orders", spec.NATSSource{Subject: "default.orders.>"})
	r.Put(e)
	run(t, r)
	pub, err := rg.srv.Connect("publisher")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// Messages published before the subscription exists are lost (core
	// NATS): probe until one arrives.
	testutil.Eventually(t, 10*time.Second, func() bool {
		_ = pub.Publish("default.orders.probe", nil)
		_ = pub.Flush()
		return subjectCalls(rg.rec, "default.orders.probe") > 0
	}, "subscribed")
	const n = 500
	for i := range n {
		m := nats.NewMsg("default.orders.created")
		m.Header.Set("X-Order", string(rune('a'+i%26)))
		m.Header.Set("Nats-Msg-Id", "x") // NATS's own: not passed on
		m.Data = []byte(`{"order":1}`)
		if err := pub.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	_ = pub.Flush()
	// Counted by subject: probes still in flight when before was read
	// arrive later.
	testutil.Eventually(t, 30*time.Second, func() bool { return subjectCalls(rg.rec, "default.orders.created") >= n }, "every message called")
	rg.rec.mu.Lock()
	for _, c := range rg.rec.calls {
		if c.Header.Get("X-Brisk-Subject") != "default.orders.created" {
			continue
		}
		if c.Header.Get("X-Order") == "" || c.Header.Get("Nats-Msg-Id") != "" || string(c.Body) != `{"order":1}` || c.Header.Get("X-Brisk-Trigger") != "default/orders" {
			t.Errorf("call %s: headers %v body %q", c.ID, c.Header, c.Body)
			break
		}
	}
	rg.rec.mu.Unlock()
	// The runner counts a message after its submit returns, which the
	// recorder sees first: await the count.
	testutil.Eventually(t, 10*time.Second, func() bool { return r.Status(e.Key()).Fired >= n }, "every message counted")
	if st := r.Status(e.Key()); st.Failed != 0 {
		t.Errorf("status %+v", st)
	}
}

// A JetStream trigger reads its stream with a durable consumer: messages
// published while no runner runs (a leader change) are called once the
// next one starts, and a message delivered again is stored once.
func TestJetStreamTriggerIsDurable(t *testing.T) {
	rg := newRig(t, nil)
	js, err := jetstream.New(rg.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"default.js.>"}}); err != nil {
		t.Fatal(err)
	}
	e := natsEntry("js", spec.NATSSource{Subject: "default.js.>", Stream: "ORDERS"})
	a := New(Config{Queue: rg.q, NATS: rg.nc})
	a.Put(e)
	stopA := run(t, a)
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, err := js.Consumer(ctx, "ORDERS", "brisk-ujs")
		return err == nil
	}, "the durable consumer")
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := js.Publish(ctx, "default.js.new", []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish(0, 200)
	testutil.Eventually(t, 30*time.Second, func() bool { c, _ := rg.rec.total(); return c == 200 }, "200 messages called")
	stopA()
	publish(200, 300) // while no runner runs
	b := New(Config{Queue: rg.q, NATS: rg.nc})
	b.Put(e)
	run(t, b)
	// Before the ack wait (30 s): a message the stopped runner took is
	// handed back, and its pull requests expire in 5 s.
	testutil.Eventually(t, 20*time.Second, func() bool { c, _ := rg.rec.total(); return c == 300 }, "the messages published meanwhile called before the ack wait")
	for seq := uint64(1); seq <= 300; seq++ {
		if n := rg.rec.ran(MessageCallID("ujs", seq)); n != 1 {
			t.Fatalf("message %d ran %d times", seq, n)
		}
	}
	// Delivered again (a crash between queueing and acknowledging): the
	// same id, stored once.
	j := &job{e: e, stats: &stats{}}
	if err := b.submitMessage(ctx, j, MessageCallID("ujs", 7), true, "default.js.new", nil, []byte{7}); err != nil {
		t.Fatal(err)
	}
	if err := b.submitMessage(ctx, j, MessageCallID("ujs", 301), true, "default.js.new", nil, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return rg.rec.ran(MessageCallID("ujs", 301)) == 1 }, "a later call")
	if n := rg.rec.ran(MessageCallID("ujs", 7)); n != 1 {
		t.Errorf("message 7 submitted again ran %d times in all, want 1", n)
	}
}

// An external NATS server with credentials from a secret: wrong ones and
// an address the operator did not allow fail, saying why; right ones
// deliver.
func TestExternalNATSWithCredentials(t *testing.T) {
	ext, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "orders", Password: "s3cret"}}})
	if err != nil {
		t.Fatal(err)
	}
	go ext.Start()
	if !ext.ReadyForConnections(10 * time.Second) {
		t.Fatal("external NATS not ready")
	}
	defer ext.Shutdown()
	rg := newRig(t, nil)
	secrets := map[string]string{"good": "orders:s3cret", "bad": "orders:wrong"}
	secret := func(ns, name string) ([]byte, bool) { v, ok := secrets[name]; return []byte(v), ok && ns == "default" }
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	failing := func(r *Runner, key, want string) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, func() bool {
			st := r.Status(key)
			return st.State == "failing" && strings.Contains(st.LastError, want)
		}, "trigger failing with "+want)
	}

	notAllowed := New(Config{Queue: rg.q, Secret: secret})
	e := natsEntry("ext", spec.NATSSource{Subject: "orders.>", URL: ext.ClientURL(), CredentialsSecret: "good"})
	notAllowed.Put(e)
	stop := run(t, notAllowed)
	failing(notAllowed, e.Key(), "address not allowed")
	stop()

	wrong := New(Config{Queue: rg.q, Secret: secret, OutboundAllow: loopback})
	bad := natsEntry("ext", spec.NATSSource{Subject: "orders.>", URL: ext.ClientURL(), CredentialsSecret: "bad"})
	wrong.Put(bad)
	stop = run(t, wrong)
	failing(wrong, bad.Key(), "Authorization")
	stop()

	r := New(Config{Queue: rg.q, Secret: secret, OutboundAllow: loopback})
	r.Put(e)
	run(t, r)
	pub, err := nats.Connect(ext.ClientURL(), nats.UserInfo("orders", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	testutil.Eventually(t, 20*time.Second, func() bool {
		_ = pub.Publish("orders.created", []byte("hello"))
		_ = pub.Flush()
		c, _ := rg.rec.total()
		return c > 0
	}, "a message from the external server called")
	if st := r.Status(e.Key()); st.State != "active" {
		t.Errorf("status %+v", st)
	}
}

// A message too large for the queue is dropped for good (terminated),
// not delivered again forever, and counted as failed.
func TestOversizedMessageIsTerminated(t *testing.T) {
	rg := newRig(t, nil)
	r := New(Config{Queue: rg.q, NATS: rg.nc})
	j := &job{e: natsEntry("big", spec.NATSSource{Subject: "default.big"}), stats: &stats{}}
	err := r.submitMessage(context.Background(), j, CallIDPrefix+"ubig-1", true, "default.big", nil, make([]byte, rg.q.MaxBody()+1))
	if !permanent(err) {
		t.Errorf("oversized message: %v, want a permanent error", err)
	}
}

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/workload"
)

// fakeClock jumps to the requested time at once, plus lag(t): the issuer
// then sees each send lag late.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
	lag func(at time.Time) time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) SleepUntil(_ context.Context, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	if c.lag != nil {
		c.now = c.now.Add(c.lag(t))
	}
}

// echoInvoker answers every call at once with its requested runtime.
type echoInvoker struct{ calls atomic.Int64 }

func (e *echoInvoker) Invoke(_ context.Context, c *Call) Reply {
	e.calls.Add(1)
	return Reply{Status: 200, Response: time.Duration(c.RuntimeMs+1) * time.Millisecond, ExecUs: int64(c.RuntimeMs) * 1000,
		Function: c.Function, Sandbox: "sb-" + c.Function, Cold: c.Phase == 1}
}

func calls(fns, perFn int, gap time.Duration) []Call {
	var out []Call
	for f := range fns {
		for k := range perFn {
			out = append(out, Call{Function: fmt.Sprintf("f%d", f), Offset: time.Duration(k) * gap, RuntimeMs: k, Phase: 2, ID: fmt.Sprintf("min0.inv%d", k)})
		}
	}
	return out
}

func TestIssuerSendsEveryCallOnceOnTime(t *testing.T) {
	inv := &echoInvoker{}
	clk := &fakeClock{now: time.Unix(1000, 0)}
	is := &Issuer{Invoker: inv, Clock: clk}
	cs := calls(1, 500, time.Millisecond)
	recs, err := is.Run(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if inv.calls.Load() != 500 || is.Issued() != 500 || is.Done() != 500 {
		t.Fatalf("invoked %d, issued %d, done %d; want 500", inv.calls.Load(), is.Issued(), is.Done())
	}
	for i, r := range recs {
		if r.LatenessUs != 0 || r.StartTime != time.Unix(1000, 0).Add(cs[i].Offset).UnixMicro() {
			t.Fatalf("call %d: lateness %d µs, start %d", i, r.LatenessUs, r.StartTime)
		}
		if !r.OK() || r.RequestedUs != int64(i)*1000 || r.ActualUs != int64(i)*1000 || r.InvocationID != cs[i].ID || r.Instance != "f0" || r.Sandbox != "sb-f0" {
			t.Fatalf("call %d recorded as %+v", i, r)
		}
	}
	if err := DefaultLateness.Check(recs); err != nil {
		t.Fatalf("on-time run refused: %v", err)
	}
}

func TestIssuerManyFunctionsConcurrently(t *testing.T) {
	// Real clock, tiny offsets: checks counts and the race detector, not
	// timing.
	inv := &echoInvoker{}
	is := &Issuer{Invoker: inv}
	cs := calls(50, 20, 50*time.Microsecond)
	recs, err := is.Run(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	if inv.calls.Load() != 1000 {
		t.Fatalf("%d calls invoked, want 1000", inv.calls.Load())
	}
	for i, r := range recs {
		if r.Function != cs[i].Function || r.InvocationID != cs[i].ID || !r.OK() {
			t.Fatalf("record %d is %+v for call %+v", i, r, cs[i])
		}
	}
}

func TestLatenessRefusesABehindRun(t *testing.T) {
	// Every 20th send is 50 ms late: 5 % > 1 %.
	n := 0
	clk := &fakeClock{now: time.Unix(1e6, 0), lag: func(time.Time) time.Duration {
		n++
		if n%20 == 0 {
			return 50 * time.Millisecond
		}
		return 0
	}}
	is := &Issuer{Invoker: &echoInvoker{}, Clock: clk}
	// 1 s between calls, so a late send never delays the next one.
	recs, err := is.Run(context.Background(), calls(1, 400, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	err = DefaultLateness.Check(recs)
	if !errors.Is(err, ErrBehind) || !strings.Contains(err.Error(), "20 of 400 measured sends (5.00%) were more than 10ms late") {
		t.Fatalf("lateness check: %v", err)
	}
	// The same run passes a looser limit.
	if err := (Lateness{Late: 10 * time.Millisecond, MaxFraction: 0.06}).Check(recs); err != nil {
		t.Fatalf("6%% limit: %v", err)
	}
	// Hand-made records: 0.5 % late passes, an unsent call fails.
	var rs []workload.Record
	for i := range 1000 {
		r := workload.Record{StartTime: 1, LatenessUs: 100}
		if i < 5 {
			r.LatenessUs = 20_000
		}
		rs = append(rs, r)
	}
	if err := DefaultLateness.Check(rs); err != nil {
		t.Fatalf("0.5%% late refused: %v", err)
	}
	rs[999] = workload.Record{}
	if err := DefaultLateness.Check(rs); !errors.Is(err, ErrBehind) || !strings.Contains(err.Error(), "1 calls not sent") {
		t.Fatalf("unsent call: %v", err)
	}
}

// blockingInvoker holds every call until its context ends.
type blockingInvoker struct{}

func (blockingInvoker) Invoke(ctx context.Context, _ *Call) Reply {
	<-ctx.Done()
	return Reply{Err: ctx.Err()}
}

func TestIssuerBoundsInFlightAndGrace(t *testing.T) {
	is := &Issuer{Invoker: blockingInvoker{}, Clock: &fakeClock{now: time.Unix(1e6, 0)}, MaxInFlight: 2, Grace: 10 * time.Millisecond}
	recs, err := is.Run(context.Background(), calls(1, 5, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		if !r.ConnTimeout || r.OK() {
			t.Fatalf("call %d: %+v, want a connection timeout", i, r)
		}
		overload := strings.HasPrefix(r.Error, "generator overload")
		if overload != (i >= 2) {
			t.Fatalf("call %d: error %q; want the first 2 sent and cancelled after the grace, the rest refused", i, r.Error)
		}
	}
	if err := DefaultLateness.Check(recs); !errors.Is(err, ErrBehind) {
		t.Fatalf("an overloaded generator's run was accepted: %v", err)
	}
}

func TestIssuerStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	inv := invokerFunc(func(ctx context.Context, c *Call) Reply {
		if c.ID == "min0.inv2" {
			cancel()
		}
		<-ctx.Done()
		return Reply{Err: ctx.Err()}
	})
	is := &Issuer{Invoker: inv}
	recs, err := is.Run(ctx, calls(1, 1000, time.Millisecond))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
	if len(recs) != 1000 || recs[999].StartTime != 0 {
		t.Fatal("calls after the cancel were sent")
	}
}

type invokerFunc func(ctx context.Context, c *Call) Reply

func (f invokerFunc) Invoke(ctx context.Context, c *Call) Reply { return f(ctx, c) }

func TestHTTPInvokerSpeaksTheLoadersProtocol(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2c=%v", h2c), func(t *testing.T) {
			var proto atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				proto.Store(int32(r.ProtoMajor))
				body, _ := io.ReadAll(r.Body)
				switch {
				case r.URL.Path == "/function/busy":
					w.Header().Set("X-Brisk-Timing", "queue_us=0, cold=false, proxy_us=3")
					http.Error(w, `{"error":"queue full"}`, http.StatusServiceUnavailable)
					return
				case r.URL.Path == "/" && r.Header.Get("X-Brisk-Sandbox") != "sb-9":
					http.Error(w, "no sandbox header", http.StatusBadGateway)
					return
				case r.Method != http.MethodPost || r.Header.Get("Requested_cpu") != "25" || r.Header.Get("requested_memory") != "64" ||
					string(body) != `{"ms":25,"mb":64}` || r.Header.Get("X-Call-Id") != "min3.inv4":
					http.Error(w, fmt.Sprintf("bad request %s %v %s", r.Method, r.Header, body), http.StatusBadRequest)
					return
				}
				w.Header().Set("X-Brisk-Sandbox", "sb-1")
				w.Header().Set("X-Brisk-Timing", "queue_us=1234, cold=true, proxy_us=99")
				io.WriteString(w, `{"Status":"OK","Function":"hello","MachineName":"sb-1","ExecutionTime":25017,"sandbox":"sb-1","exec_us":25017,"requested_ms":25,"mb":64}`)
			}))
			if h2c {
				srv.Config.Protocols = new(http.Protocols)
				srv.Config.Protocols.SetHTTP1(true)
				srv.Config.Protocols.SetUnencryptedHTTP2(true)
			}
			srv.Start()
			defer srv.Close()
			cl := NewHTTPClient(HTTPOptions{H2C: h2c, Timeout: 10 * time.Second})
			inv := &HTTPInvoker{Client: cl, Route: DataPlane(strings.TrimPrefix(srv.URL, "http://"))}
			call := &Call{Function: "hello", RuntimeMs: 25, MemoryMB: 64, ID: "min3.inv4"}
			rep := inv.Invoke(context.Background(), call)
			if rep.Err != nil || rep.Status != 200 {
				t.Fatalf("reply %+v", rep)
			}
			if rep.ExecUs != 25017 || rep.QueueUs != 1234 || !rep.Cold || rep.Sandbox != "sb-1" || rep.Function != "hello" || rep.MemoryMB != 64 || rep.Response <= 0 {
				t.Fatalf("reply parsed as %+v", rep)
			}
			if want := map[bool]int32{false: 1, true: 2}[h2c]; proto.Load() != want {
				t.Fatalf("server saw HTTP/%d, want HTTP/%d", proto.Load(), want)
			}
			rep = inv.Invoke(context.Background(), &Call{Function: "busy", RuntimeMs: 25, MemoryMB: 64})
			var r workload.Record
			fill(&r, &rep)
			if rep.Status != 503 || r.OK() || !r.FuncTimeout || r.ConnTimeout || !strings.Contains(r.Error, "queue full") {
				t.Fatalf("503 recorded as %+v", r)
			}
			// Straight to a sandbox, with the routing header.
			route, err := Sandboxes(map[string][]Target{"hello": {{URL: srv.URL + "/", Sandbox: "sb-9"}}})
			if err != nil {
				t.Fatal(err)
			}
			direct := &HTTPInvoker{Client: cl, Route: route}
			if rep := direct.Invoke(context.Background(), call); rep.Status != 200 || rep.ExecUs != 25017 {
				t.Fatalf("direct reply %+v", rep)
			}
		})
	}
	// No server: a connection failure.
	inv := &HTTPInvoker{Client: NewHTTPClient(HTTPOptions{}), Route: DataPlane("127.0.0.1:1")}
	rep := inv.Invoke(context.Background(), &Call{Function: "x"})
	var r workload.Record
	fill(&r, &rep)
	if !r.ConnTimeout || r.Status != 0 || r.Error == "" {
		t.Fatalf("refused connection recorded as %+v", r)
	}
	if _, err := Sandboxes(map[string][]Target{"x": nil}); err == nil {
		t.Fatal("a function without sandboxes was accepted for direct calls")
	}
}

func TestParseTiming(t *testing.T) {
	q, cold := ParseTiming("queue_us=42, cold=true, proxy_us=7")
	if q != 42 || !cold {
		t.Fatalf("parseTiming: %d %v", q, cold)
	}
	if q, cold := ParseTiming(""); q != 0 || cold {
		t.Fatal("empty timing header parsed as non-zero")
	}
}

func TestLatenessCountsTheInvokersOwnStartDelay(t *testing.T) {
	// The driver dispatches on time, but each call's goroutine only starts
	// sending 20 ms later (a starved generator): that is lateness too.
	start := time.Unix(1e6, 0)
	inv := invokerFunc(func(_ context.Context, c *Call) Reply {
		return Reply{Status: 200, Sent: start.Add(c.Offset + 20*time.Millisecond), Response: time.Millisecond}
	})
	is := &Issuer{Invoker: inv, Clock: &fakeClock{now: start}}
	cs := calls(1, 10, time.Second)
	recs, err := is.Run(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		if r.LatenessUs != 20_000 || r.StartTime != start.Add(cs[i].Offset+20*time.Millisecond).UnixMicro() {
			t.Fatalf("call %d: lateness %d µs, start %d", i, r.LatenessUs, r.StartTime)
		}
	}
	if err := DefaultLateness.Check(recs); !errors.Is(err, ErrBehind) {
		t.Fatalf("20 ms late sends accepted: %v", err)
	}
}

// BenchmarkHTTPInvoker is the generator's cost per call (client side and a
// minimal server): with --local it shares the CPU and the heap with brisk.
func BenchmarkHTTPInvoker(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"Status":"OK","Function":"f","MachineName":"m","ExecutionTime":12}`))
	}))
	defer srv.Close()
	inv := &HTTPInvoker{Client: NewHTTPClient(HTTPOptions{}), Route: DataPlane(strings.TrimPrefix(srv.URL, "http://"))}
	c := &Call{Function: "f", ID: "sec0.inv0"}
	b.ReportAllocs()
	for b.Loop() {
		if rep := inv.Invoke(context.Background(), c); rep.Err != nil || rep.ExecUs != 12 {
			b.Fatalf("%+v", rep)
		}
	}
}

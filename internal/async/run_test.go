package async

// Run's Fetch loop: small MaxInFlight, shutdown, and a call that ends as
// Run stops.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startTimes is an Invoker recording when each call started; hold, when
// set, is called inside the attempt.
type startTimes struct {
	mu      sync.Mutex
	started map[string]time.Time
	runs    map[string]int
	ch      chan string
	hold    func(ctx context.Context, c *Call)
	cur     atomic.Int32
	peak    atomic.Int32
}

func newStartTimes() *startTimes {
	return &startTimes{started: map[string]time.Time{}, runs: map[string]int{}, ch: make(chan string, 1024)}
}

func (s *startTimes) Policy(context.Context, string) (Policy, bool) {
	return Policy{MaxAttempts: 3, MaxAge: time.Hour, Backoff: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Concurrency: 64}, true
}

func (s *startTimes) Invoke(ctx context.Context, c *Call, _ int) Result {
	now := time.Now()
	n := s.cur.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	s.mu.Lock()
	if _, ok := s.started[c.ID]; !ok {
		s.started[c.ID] = now
	}
	s.runs[c.ID]++
	s.mu.Unlock()
	select {
	case s.ch <- c.ID:
	default:
	}
	if s.hold != nil {
		s.hold(ctx, c)
	}
	s.cur.Add(-1)
	return ok("ok")
}

func (s *startTimes) runsOf(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// With MaxInFlight 1 or 2, no more than that many attempts run at once,
// every call runs once, and the queue drains.
func TestRunSmallMaxInFlight(t *testing.T) {
	for _, mif := range []int{1, 2} {
		t.Run(fmt.Sprintf("MaxInFlight=%d", mif), func(t *testing.T) {
			e := start(t, t.TempDir(), Config{MaxInFlight: mif})
			inv := newStartTimes()
			inv.hold = func(context.Context, *Call) { time.Sleep(10 * time.Millisecond) }
			const n = 40
			for i := range n {
				submit(t, e.q, fmt.Sprintf("s%d", i), "")
			}
			t0 := time.Now()
			run(t, e.q, inv)
			for i := range n {
				waitStatus(t, e.q, fmt.Sprintf("s%d", i), StatusSucceeded)
			}
			t.Logf("%d calls in %v", n, time.Since(t0))
			for i := range n {
				if r := inv.runsOf(fmt.Sprintf("s%d", i)); r != 1 {
					t.Errorf("call s%d ran %d times", i, r)
				}
			}
			if p := inv.peak.Load(); int(p) > mif {
				t.Errorf("%d attempts at once, MaxInFlight %d", p, mif)
			}
		})
	}
}

// Run returns promptly once ctx ends (also in the middle of an idle
// Fetch), and not before its attempts have returned.
func TestRunShutdown(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	// Idle: a Fetch is open.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.q.Run(ctx, newStartTimes()) }()
	time.Sleep(400 * time.Millisecond)
	t0 := time.Now()
	cancel()
	select {
	case <-done:
		if d := time.Since(t0); d > 2*time.Second { // a hang, not a speed
			t.Errorf("idle Run returned %v after its context ended", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("idle Run did not return within 3 s of its context ending")
	}

	// Busy: an attempt that outlives the context by 300 ms. A queue of
	// its own: the idle Run's pull request may outlive it at the server
	// (the client's unsubscribe races the next publish), and a message
	// handed to it waits out the ack deadline, longer than this test.
	e = start(t, t.TempDir(), Config{})
	inv := newStartTimes()
	var ended atomic.Bool
	inv.hold = func(ctx context.Context, _ *Call) {
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond)
		ended.Store(true)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- e.q.Run(ctx, inv) }()
	submit(t, e.q, "busy", "")
	select {
	case <-inv.ch:
	case <-time.After(5 * time.Second):
		t.Fatal("busy call never started")
	}
	cancel()
	select {
	case <-done:
		if !ended.Load() {
			t.Error("Run returned before its attempt did")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("busy Run did not return within 3 s")
	}
}

// An attempt that succeeds as Run stops still stores its final record
// before its message is acknowledged (settle's writes outlive Run's
// context): otherwise the call would be gone and its record say queued.
func TestRunStopKeepsAFinishedCallsRecord(t *testing.T) {
	e := start(t, t.TempDir(), Config{})
	inv := newStartTimes()
	inv.hold = func(ctx context.Context, _ *Call) { <-ctx.Done() } // it replies 200 as Run stops
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.q.Run(ctx, inv) }()
	submit(t, e.q, "at-stop", "")
	<-inv.ch
	cancel()
	<-done
	r, err := e.q.Get(context.Background(), "at-stop")
	info, _ := e.q.calls.Info(context.Background())
	t.Logf("after stop: record %+v err %v; calls stream holds %d", r, err, info.State.Msgs)
	if err == nil && r.Status == StatusQueued && info.State.Msgs == 0 {
		t.Fatalf("the call ran (200), left the queue, and its record says %s: the result is lost and nothing will run it", r.Status)
	}
}

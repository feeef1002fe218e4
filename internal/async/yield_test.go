package async

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// enterAsync starts an enter and reports on the channel when it succeeds.
func enterAsync(ctx context.Context, y *yielder, entered chan<- struct{}) {
	go func() {
		if y.enter(ctx) {
			entered <- struct{}{}
		}
	}()
}

// stillBlocked fails if an enter succeeds within a short while.
func stillBlocked(t *testing.T, entered <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-entered:
		t.Fatal(what)
	case <-time.After(50 * time.Millisecond):
	}
}

// The consumer yields to submits: while a data plane is accepting, at most
// floor attempts start; an attempt's end lets the next one in, and once
// submits stop every waiting attempt goes.
func TestYieldToSubmits(t *testing.T) {
	ctx := context.Background()
	y := newYielder(2)
	// Not busy: no limit.
	for range 5 {
		if !y.enter(ctx) {
			t.Fatal("enter refused while idle")
		}
	}
	for range 5 {
		y.leave()
	}

	done := y.accepting()
	for range 2 {
		if !y.enter(ctx) {
			t.Fatal("enter refused below the floor")
		}
	}
	entered := make(chan struct{}, 2)
	enterAsync(ctx, y, entered)
	enterAsync(ctx, y, entered)
	stillBlocked(t, entered, "an attempt started past the floor while submits were in flight")
	y.leave() // one ends: one waiter takes its place
	<-entered
	stillBlocked(t, entered, "two attempts started for one that ended")
	if got := y.running.Load(); got != 2 {
		t.Fatalf("running %d, want the floor 2", got)
	}
	done() // submits stop: after the quiet time, the last waiter goes
	<-entered
	if got := y.yielded.Load(); got != 2 {
		t.Fatalf("yielded %d, want 2", got)
	}
	for range 3 {
		y.leave()
	}

	// A waiter gives up when its context ends.
	done = y.accepting()
	for range 2 {
		y.enter(ctx)
	}
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan bool)
	go func() { res <- y.enter(cctx) }()
	cancel()
	if <-res {
		t.Fatal("enter succeeded after its context ended")
	}
	for range 2 {
		y.leave()
	}
	done()
}

// Yielding is for bursts: once the submits have gone on without a quiet
// moment for the burst limit, attempts start at full speed again.
func TestYieldEndsWithTheBurst(t *testing.T) {
	ctx := context.Background()
	y := newYielder(1)
	y.burst = 100 * time.Millisecond
	done := y.accepting()
	defer done()
	y.enter(ctx)
	entered := make(chan struct{}, 1)
	enterAsync(ctx, y, entered)
	<-entered
	if age := time.Since(time.Unix(0, y.since.Load())); age < y.burst {
		t.Fatalf("an attempt past the floor started %s into the burst, before its limit %s", age, y.burst)
	}
}

// Many waiting attempts are let in one per free slot, oldest first, and
// all of them once the submits calm down (the queue's timer, not a
// wake-up of each).
func TestYieldManyWaiters(t *testing.T) {
	ctx := context.Background()
	y := newYielder(1)
	done := y.accepting()
	if !y.enter(ctx) {
		t.Fatal("enter refused below the floor")
	}
	const waiters = 100
	order := make(chan int, waiters)
	for i := range waiters {
		go func() {
			if y.enter(ctx) {
				order <- i
			}
		}()
		// Joined the queue before the next starts: the order is known.
		for y.waiting.Load() != int32(i+1) {
			runtime.Gosched()
		}
	}
	y.leave()
	if got := <-order; got != 0 {
		t.Fatalf("waiter %d went first, want the oldest, 0", got)
	}
	select {
	case i := <-order:
		t.Fatalf("waiter %d started too: two attempts for one that ended", i)
	case <-time.After(50 * time.Millisecond):
	}
	done()
	for range waiters - 1 {
		<-order
	}
	if got := y.running.Load(); got != waiters {
		t.Fatalf("running %d, want %d", got, waiters)
	}
	if got := y.waiting.Load(); got != 0 {
		t.Fatalf("%d still counted as waiting", got)
	}
}

package queue

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// pool is n interchangeable slots, numbered by the order they were taken.
type pool struct {
	free   atomic.Int64
	taken  atomic.Int64
	refuse atomic.Pointer[error]
	onPick atomic.Pointer[func()] // runs in Pick, under the queue's lock
}

func (p *pool) Pick() (int64, bool) {
	if f := p.onPick.Load(); f != nil {
		(*f)()
	}
	for {
		f := p.free.Load()
		if f <= 0 {
			return 0, false
		}
		if p.free.CompareAndSwap(f, f-1) {
			return p.taken.Add(1), true
		}
	}
}

func (p *pool) Release(int64) { p.free.Add(1) }

func (p *pool) Refuse() error {
	if e := p.refuse.Load(); e != nil {
		return *e
	}
	return nil
}

func newQueue(free int64) (*Queue[int64], *pool) {
	p := &pool{}
	p.free.Store(free)
	q := &Queue[int64]{}
	q.Init(p)
	return q, p
}

// result is one Wait's outcome, tagged with the caller's number.
type result struct {
	who int
	err error
}

// waitAsync starts a Wait and returns once it is queued.
func waitAsync(t *testing.T, q *Queue[int64], ctx context.Context, who int, low bool, depth int, timeout time.Duration, out chan<- result) {
	t.Helper()
	before := q.Len()
	go func() {
		_, err := q.Wait(ctx, depth, timeout, low, func() {})
		out <- result{who, err}
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return q.Len() == before+1 }, "the call never queued")
}

// free releases one slot to the line (what a finished call does).
func free(q *Queue[int64], p *pool) {
	p.Release(0)
	q.Dispatch()
}

func TestFirstComeFirstServedAndAsyncBehind(t *testing.T) {
	q, p := newQueue(0)
	out := make(chan result, 8)
	ctx := context.Background()
	// Arrival order: async 0, sync 1, async 2, sync 3. Served: 1, 3, 0, 2.
	waitAsync(t, q, ctx, 0, true, 10, time.Minute, out)
	waitAsync(t, q, ctx, 1, false, 10, time.Minute, out)
	waitAsync(t, q, ctx, 2, true, 10, time.Minute, out)
	waitAsync(t, q, ctx, 3, false, 10, time.Minute, out)
	for _, want := range []int{1, 3, 0, 2} {
		free(q, p)
		r := <-out
		if r.who != want || r.err != nil {
			t.Fatalf("served %d (err %v), want %d", r.who, r.err, want)
		}
	}
	if q.Len() != 0 || p.free.Load() != 0 {
		t.Fatalf("after serving all: %d waiting, %d slots free; want 0, 0", q.Len(), p.free.Load())
	}
}

func TestDepthBoundsSynchronousCallsOnly(t *testing.T) {
	q, _ := newQueue(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan result, 8)
	waitAsync(t, q, ctx, 0, false, 2, time.Minute, out)
	waitAsync(t, q, ctx, 1, true, 2, time.Minute, out) // async: not counted
	waitAsync(t, q, ctx, 2, true, 2, time.Minute, out)
	waitAsync(t, q, ctx, 3, false, 2, time.Minute, out)
	if _, err := q.Wait(ctx, 2, time.Minute, false, func() {}); !errors.Is(err, ErrFull) {
		t.Fatalf("third synchronous call with depth 2: %v, want ErrFull", err)
	}
	if q.Len() != 4 {
		t.Fatalf("%d waiting, want 4", q.Len())
	}
}

func TestTimeoutAndCancelLeaveTheLine(t *testing.T) {
	q, p := newQueue(0)
	queued := 0
	if _, err := q.Wait(context.Background(), 10, time.Millisecond, false, func() { queued++ }); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait with no slot: %v, want ErrTimeout", err)
	}
	if queued != 1 {
		t.Fatalf("onQueued ran %d times, want 1", queued)
	}
	gone := errors.New("client gone")
	ctx, cancel := context.WithCancelCause(context.Background())
	out := make(chan result, 1)
	waitAsync(t, q, ctx, 0, false, 10, time.Minute, out)
	cancel(gone)
	if r := <-out; !errors.Is(r.err, gone) {
		t.Fatalf("cancelled wait: %v, want the context's cause", r.err)
	}
	if q.Len() != 0 {
		t.Fatalf("%d waiting after timeout and cancel, want 0", q.Len())
	}
	// A slot freed now stays free: nobody is left to take it.
	free(q, p)
	if p.free.Load() != 1 {
		t.Fatalf("%d slots free, want 1", p.free.Load())
	}
}

func TestCloseAndRefuse(t *testing.T) {
	q, p := newQueue(0)
	out := make(chan result, 4)
	waitAsync(t, q, context.Background(), 0, false, 10, time.Minute, out)
	refused := errors.New("no room")
	q.FailIfRefused() // nothing refused yet: the waiter stays
	if q.Len() != 1 {
		t.Fatalf("%d waiting after FailIfRefused with nothing refused, want 1", q.Len())
	}
	p.refuse.Store(&refused)
	q.FailIfRefused()
	if r := <-out; !errors.Is(r.err, refused) {
		t.Fatalf("refused waiter: %v, want %v", r.err, refused)
	}
	queued := 0
	if _, err := q.Wait(context.Background(), 10, time.Minute, false, func() { queued++ }); !errors.Is(err, refused) || queued != 1 {
		t.Fatalf("wait while refused: %v, onQueued %d times; want %v and 1 (the demand still counts)", err, queued, refused)
	}
	p.refuse.Store(nil)
	waitAsync(t, q, context.Background(), 1, true, 10, time.Minute, out)
	deleted := errors.New("deleted")
	q.Close(deleted)
	if r := <-out; !errors.Is(r.err, deleted) {
		t.Fatalf("waiter at close: %v, want %v", r.err, deleted)
	}
	if _, err := q.Wait(context.Background(), 10, time.Minute, false, func() {}); !errors.Is(err, deleted) {
		t.Fatalf("wait after close: %v, want %v", err, deleted)
	}
}

// TestSlotOfAGoneCallerPassesOn: a slot handed to a waiter whose caller
// left at that moment goes back, not lost. The caller's cancel lands inside
// the handoff (Pick cancels it), so its Wait sees both the slot and the
// cancel and may take either; both must add up.
func TestSlotOfAGoneCallerPassesOn(t *testing.T) {
	q, p := newQueue(0)
	gaveBack := 0
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan result, 1)
		waitAsync(t, q, ctx, 0, false, 10, time.Minute, out)
		f := func() { cancel() }
		p.onPick.Store(&f) // queued: the next Pick is the handoff's, on this goroutine
		free(q, p)
		r := <-out
		p.onPick.Store(nil)
		switch {
		case r.err == nil && p.free.Load() == 0: // served: the caller keeps the slot
		case r.err != nil && p.free.Load() == 1: // gone: the slot came back
			gaveBack++
			p.free.Add(-1) // none free for the next try
		default:
			t.Fatalf("wait returned %v with %d slots free: the slot is lost or held twice", r.err, p.free.Load())
		}
	}
	if gaveBack == 0 {
		t.Fatal("no caller left during a handoff in 200 tries: the test did not exercise the case")
	}
}

// TestNoSlotLost runs callers that wait, hold a slot briefly and release
// it, while others give up at random moments: every slot must come back,
// including those handed to a caller that had just left.
func TestNoSlotLost(t *testing.T) {
	const slots, callers, rounds = 3, 12, 200
	q, p := newQueue(slots)
	var held atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(c), 7))
			for range rounds {
				ctx, cancel := context.WithCancel(context.Background())
				if rnd.IntN(3) == 0 {
					go cancel() // races the handoff
				}
				if _, err := q.Wait(ctx, callers, time.Minute, rnd.IntN(2) == 0, func() {}); err == nil {
					if n := held.Add(1); n > slots {
						t.Errorf("%d slots held at once, only %d exist", n, slots)
					}
					held.Add(-1)
					free(q, p)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if got := p.free.Load(); got != slots || q.Len() != 0 {
		t.Fatalf("after the run: %d of %d slots free, %d waiting; want all free, none waiting", got, slots, q.Len())
	}
}

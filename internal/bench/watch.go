package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/rpc"
)

// readyWatch follows the control plane's endpoint stream — what every
// data plane receives — and stamps each sandbox of the wanted functions
// the first time it arrives as a ready endpoint. It is push-based and
// exact, and costs the control plane what one more data plane costs.
type readyWatch struct {
	mu    sync.Mutex
	t0    time.Time
	want  map[string]int
	got   map[string]int
	seen  map[string]bool
	at    []float64 // seconds since t0, in arrival order
	total int
	full  chan struct{} // closed when total sandboxes are ready
	err   error         // the stream's end, if it ended
	ended chan struct{}
}

// watchReady subscribes and returns once the first (snapshot) batch has
// arrived, so that everything later is a change.
func watchReady(ctx context.Context, grpcAddr string, creds credentials.TransportCredentials, want map[string]int, total int) (*readyWatch, error) {
	conn, err := rpc.Dial(grpcAddr, creds)
	if err != nil {
		return nil, fmt.Errorf("endpoint watch: %w", err)
	}
	stream, err := briskv1.NewControlPlaneClient(conn).WatchEndpoints(ctx, &briskv1.WatchEndpointsRequest{DataPlaneId: "bench-scale-watch"})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("endpoint watch on %s: %w", grpcAddr, err)
	}
	first, err := stream.Recv()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("endpoint watch on %s: %w", grpcAddr, err)
	}
	w := &readyWatch{want: want, got: map[string]int{}, seen: map[string]bool{}, total: total,
		full: make(chan struct{}), ended: make(chan struct{})}
	w.apply(first, false)
	go func() {
		defer close(w.ended)
		defer conn.Close()
		for {
			b, err := stream.Recv()
			if err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
			w.apply(b, true)
		}
	}()
	return w, nil
}

// start sets the clock's zero; call it before the changes being timed.
func (w *readyWatch) start(t0 time.Time) {
	w.mu.Lock()
	w.t0 = t0
	w.mu.Unlock()
}

func (w *readyWatch) apply(b *briskv1.EndpointBatch, stamp bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Since(w.t0).Seconds()
	for _, e := range b.GetAdded() {
		fn, id := e.GetFunction(), e.GetSandboxId()
		limit, ok := w.want[fn]
		if !ok || w.seen[id] || w.got[fn] >= limit {
			continue
		}
		w.seen[id] = true
		w.got[fn]++
		if stamp {
			w.at = append(w.at, now)
		} else {
			w.at = append(w.at, 0) // ready before the clock started
		}
		if len(w.at) == w.total {
			close(w.full)
		}
	}
}

// wait blocks until every sandbox is ready, the stream ends, ctx ends or
// the deadline passes.
func (w *readyWatch) wait(ctx context.Context, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-w.full:
		return nil
	case <-w.ended:
		w.mu.Lock()
		defer w.mu.Unlock()
		return fmt.Errorf("endpoint watch ended: %w", w.err)
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return errTimeout
	}
}

var errTimeout = errors.New("timed out")

// ready returns the ready times so far and how many there are.
func (w *readyWatch) ready() []float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]float64(nil), w.at...)
}

func (w *readyWatch) count() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(len(w.at))
}

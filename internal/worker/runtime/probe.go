package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// ErrExited is returned by WaitReady when the sandbox ended before it
// accepted a connection.
var ErrExited = errors.New("sandbox exited while starting")

// Readiness probe pacing. Cold-start latency is what brisk measures, and a
// native sandbox serves a few milliseconds after Create, so the first probes
// are 0.5 ms apart; the gap then grows by a quarter each time (the probe
// notices readiness at most ~25% late) up to 10 ms, so a slow starter costs
// at most ~100 connects a second.
const (
	probeFirstGap = 500 * time.Microsecond
	probeMaxGap   = 10 * time.Millisecond
	// probeDialTimeout bounds one connect: a loopback connect is answered at
	// once, but an address in another network namespace may drop SYNs.
	probeDialTimeout = 250 * time.Millisecond
)

// WaitReady returns nil as soon as a TCP connection to addr succeeds. It
// returns an error wrapping ErrExited if exited closes first (exited may be
// nil when the runtime cannot observe exits), and one wrapping ctx's error if
// ctx ends first; both carry the last connect error.
func WaitReady(ctx context.Context, addr string, exited <-chan struct{}) error {
	return waitReady(ctx, addr, exited, DialTCP)
}

// DialTCP is one connect to addr, within probeDialTimeout, closed at once:
// the readiness probe's, and the worker's check of a sandbox a data plane
// reported unreachable.
func DialTCP(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, probeDialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// waitReady is WaitReady with the connect injected, so tests can tell when
// probing has begun.
func waitReady(ctx context.Context, addr string, exited <-chan struct{}, dial func(context.Context, string) error) error {
	gap := probeFirstGap
	// Reset before each wait; since Go 1.23 it never leaves a stale tick.
	timer := time.NewTimer(probeMaxGap)
	defer timer.Stop()
	for {
		// Check for an exit before connecting: a dead sandbox's port may
		// already belong to someone else.
		select {
		case <-exited:
			return fmt.Errorf("%w (probing %s)", ErrExited, addr)
		default:
		}
		err := dial(ctx, addr)
		if err == nil {
			return nil
		}
		timer.Reset(gap)
		select {
		case <-timer.C:
		case <-exited:
			return fmt.Errorf("%w (probing %s, last connect: %v)", ErrExited, addr, err)
		case <-ctx.Done():
			return fmt.Errorf("sandbox at %s not ready (last connect: %v): %w", addr, err, ctx.Err())
		}
		gap = min(gap*5/4, probeMaxGap)
	}
}

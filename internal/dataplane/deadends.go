package dataplane

import (
	"context"
	"errors"
	"math"
	"net"
	"slices"
	"sync"
	"syscall"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/proxy"
)

// maxUnreachable bounds the reports kept for a control plane that does not
// answer; the oldest go first.
const maxUnreachable = 1024

// unreachable holds the endpoints calls could not connect to until the link
// reports them (reportUnreachable). Only failing calls touch it.
type unreachable struct {
	mu      sync.Mutex
	pending []*briskv1.UnreachableEndpoint
	bell    chan struct{} // 1 slot: rings coalesce while a report is in flight
}

// connectFailed is called by a call that could not connect to its sandbox.
// A refused connect means nothing listens at the endpoint's address any
// more (the sandbox died, and its worker may not have noticed: one adopted
// after a restart, a runtime without exit events): the endpoint leaves the
// function's rotation here at once, so the next call picks another sandbox
// or waits for a new one, and the control plane is told, which has the
// sandbox's worker check it and replace it if it is dead. A timeout proves
// nothing (a busy host, or a link cut for now): the endpoint stays, but its
// idle connections go, since over a cut link a call sent on one would wait
// out its whole timeout for a reply. The hot path never gets here.
func (d *DataPlane) connectFailed(st *reqState, err error) {
	if st == nil || st.fn == nil || st.ep == nil {
		return
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		if nothingSent(err) {
			st.ep.conns.Prune(math.MaxInt64)
		}
		return
	}
	if !d.dropEndpoint(st.fn, st.ep) {
		return // out of rotation already: reported by the call that took it out
	}
	d.log.Warn("sandbox refused a connection: out of rotation, reported to the control plane",
		"function", st.fn.name, "sandbox", st.ep.id, "addr", st.ep.addr, "err", err)
	u := &d.unreach
	u.mu.Lock()
	if len(u.pending) >= maxUnreachable {
		u.pending = slices.Delete(u.pending, 0, 1)
	}
	u.pending = append(u.pending, &briskv1.UnreachableEndpoint{
		SandboxId: st.ep.id, Function: st.fn.name, Address: st.ep.addr, Error: err.Error()})
	u.mu.Unlock()
	u.ring()
}

// maxReroutes bounds how many sandboxes one call moves past: unreachable
// ones (a connect timed out: they stay in rotation, and each costs the
// call a timeout), and refusing ones (each leaves the rotation, so a call
// meets a function's dead sandboxes once each: after a long partition all
// of them may be dead at once, the lab's finding 1).
const (
	maxReroutes        = 3
	maxRefusedReroutes = 16
)

// reroute moves a call that could not connect to its sandbox (nothing of
// the call was sent) to another of its function's sandboxes, so that the
// dead, withdrawn or unreachable one costs the call a connect, not a
// failure: a sandbox withdrawn after the call took its slot (evicted as
// idle: the InVitro loader met it at a burst on a full node), a refused
// connect (a sandbox that died before the control plane withdrew
// it, or after a partition healed: the partition lab's finding 1,
// docs/reliability.md) or a connect that timed out (a worker cut off from
// this data plane: finding 4). With no free slot elsewhere the call waits
// in the function's queue as a new call would (up to the queue timeout,
// asking for a sandbox): after a long partition every sandbox the data
// plane knows may be gone at once while new ones start. It reports whether
// st has a new endpoint; for a refused connect connectFailed has taken the
// old one out, a timed-out one stays in rotation (it proves nothing).
// While it waits the call keeps its slot on the old endpoint, which is
// released once it has a new one (finish releases it otherwise), except on
// a withdrawn one, released at once: a call that then finds no sandbox is
// answered as one that waited in the queue (st.waitErr).
func (d *DataPlane) reroute(ctx context.Context, st *reqState, err error, done *int) bool {
	limit := maxReroutes
	if errors.Is(err, syscall.ECONNREFUSED) {
		limit = maxRefusedReroutes
	}
	if *done >= limit || !nothingSent(err) {
		return false
	}
	set := st.fn.set.Load()
	if set == nil {
		return false
	}
	withdrawn := errors.Is(err, proxy.ErrPoolClosed)
	if withdrawn {
		// The sandbox has left the set: its slot serves the call no more,
		// and held while the call waits it would keep the sandbox draining
		// (its kill waits for the call) and its room from the function it
		// was evicted for, perhaps the call's own.
		st.fn.release(st.ep)
		st.slotGone = true
	}
	ep, _, aerr := st.fn.acquire(ctx, set, d.markUrgent, st.low)
	if aerr != nil {
		if withdrawn {
			st.waitErr = aerr
		}
		return false
	}
	if !withdrawn {
		st.fn.release(st.ep)
	}
	st.ep, st.slotGone = ep, false
	*done++
	d.prom.reroutes.Inc()
	return true
}

// nothingSent reports whether err is a connect that failed: refused, or
// timed out; or a call's sandbox withdrawn between the call taking a slot
// on it and connecting (its pool closed: the control plane evicted it as
// idle on a report that predates the call).
func nothingSent(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, proxy.ErrPoolClosed) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && op.Timeout()
}

// dropEndpoint takes ep out of fn's set, as a removal from the control
// plane would, and reports whether it was still there.
func (d *DataPlane) dropEndpoint(fn *function, ep *endpoint) bool {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	if d.lookup(fn.name) != fn {
		return false
	}
	d.table.Begin(false)
	dropped := d.table.RemoveEndpoint(fn.name, ep)
	d.publish(d.table.Commit())
	return dropped
}

func (u *unreachable) ring() {
	select {
	case u.bell <- struct{}{}:
	default:
	}
}

func (u *unreachable) take() []*briskv1.UnreachableEndpoint {
	u.mu.Lock()
	defer u.mu.Unlock()
	p := u.pending
	u.pending = nil
	return p
}

// putBack returns reports whose sending failed, ahead of newer ones.
func (u *unreachable) putBack(eps []*briskv1.UnreachableEndpoint) {
	u.mu.Lock()
	u.pending = append(eps, u.pending...)
	if n := len(u.pending); n > maxUnreachable {
		u.pending = u.pending[n-maxUnreachable:]
	}
	u.mu.Unlock()
}

// reportUnreachable sends the endpoints calls could not connect to as soon
// as there are any; a report that fails is sent again after a backoff (the
// control plane may be failing over).
func (l *link) reportUnreachable(ctx context.Context) {
	u := &l.d.unreach
	delay := backoffMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.bell:
		}
		eps := u.take()
		if len(eps) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		_, err := l.client.ReportUnreachable(rctx, &briskv1.UnreachableReport{DataPlaneId: l.d.ID(), Endpoints: eps})
		cancel()
		if err == nil {
			delay = backoffMin
			continue
		}
		if ctx.Err() != nil {
			return
		}
		l.d.log.Debug("report unreachable sandboxes", "endpoints", len(eps), "err", err)
		u.putBack(eps)
		if !sleepCtx(ctx, delay) {
			return
		}
		delay = min(delay*2, backoffMax)
		u.ring()
	}
}

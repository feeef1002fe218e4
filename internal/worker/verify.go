package worker

import (
	"context"
	"errors"
	"syscall"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// How the worker checks a sandbox a data plane could not connect to: a few
// connects a little apart, all of which must be refused for it to count as
// dead. A connect that times out is not a death (a busy sandbox's accept
// queue drops SYNs); only a refusal or the sandbox's exit is.
const (
	verifyAttempts = 3
	verifyGap      = 20 * time.Millisecond
)

// verify answers a control plane's request to check a sandbox that a data
// plane reported unreachable. A sandbox that has exited, that its runtime
// no longer knows, or that refuses connections is finished as EXITED, so the control plane replaces it as it
// does any sandbox that dies; a live one has its record announced again,
// which tells the control plane to put it back into rotation. The report
// alone never kills a sandbox: only the worker's own check does.
func (n *Node) verify(ctx context.Context, id string) {
	ctx = context.WithoutCancel(ctx) // short: bounded by the dial timeouts
	n.mu.Lock()
	sb := n.sandboxes[id]
	if sb == nil {
		if _, known := n.terminated[id]; !known {
			// Unknown here: nothing serves under this id. GONE makes the
			// control plane drop its record (and replace the sandbox).
			n.terminated[id] = time.Now()
			rec := &briskv1.SandboxRecord{Id: id, State: briskv1.SandboxState_SANDBOX_STATE_GONE, Message: "unknown to the worker"}
			n.emitLocked(&sandbox{rec: rec})
		}
		n.mu.Unlock()
		return
	}
	if sb.killing || sb.rec.GetState() != briskv1.SandboxState_SANDBOX_STATE_READY {
		n.mu.Unlock() // its change of state is on its way already
		return
	}
	addr := sb.rec.Address
	var exited <-chan struct{}
	if sb.inst != nil {
		exited = sb.inst.Exited
	}
	n.mu.Unlock()

	dead, why := false, ""
	if w, ok := n.rt.(runtime.Watcher); ok {
		if _, _, known := w.Watch(id); !known {
			dead, why = true, "its runtime no longer runs it"
		}
	}
	if !dead {
		dead, why = refuses(ctx, addr, exited, n.dial)
	}
	n.mu.Lock()
	if n.sandboxes[id] != sb || sb.killing {
		n.mu.Unlock()
		return
	}
	if !dead {
		n.emitLocked(sb) // alive: announce it again
		n.mu.Unlock()
		n.log.Info("sandbox a data plane could not reach answers the worker", "sandbox", id, "function", sb.rec.Function, "addr", addr)
		return
	}
	if exited != nil {
		select {
		case <-exited:
			n.mu.Unlock() // watchExit reports it, with the reason
			return
		default:
		}
	}
	sb.killing = true
	sb.rec.State, sb.rec.Message = briskv1.SandboxState_SANDBOX_STATE_EXITED, why
	n.finishLocked(sb)
	n.mu.Unlock()
	n.cleanup(id)
	n.log.Warn("sandbox refuses connections: replaced", "sandbox", id, "function", sb.rec.Function, "reason", why)
}

// refuses reports whether the sandbox at addr is dead: it exited, or every
// one of verifyAttempts connects was refused.
func refuses(ctx context.Context, addr string, exited <-chan struct{}, dial func(context.Context, string) error) (bool, string) {
	var err error
	for i := range verifyAttempts {
		select {
		case <-exited:
			return true, "exited"
		default:
		}
		if i > 0 {
			t := time.NewTimer(verifyGap)
			select {
			case <-t.C:
			case <-exited:
				t.Stop()
				return true, "exited"
			case <-ctx.Done():
				t.Stop()
				return false, ""
			}
		}
		if err = dial(ctx, addr); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return false, ""
		}
	}
	return true, "refuses connections at " + addr + " (" + err.Error() + ")"
}

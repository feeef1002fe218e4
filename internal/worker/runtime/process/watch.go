package process

import (
	"errors"
	"fmt"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
)

// adoptedPoll paces the exit watch of an adopted sandbox where pidfds are
// not available (Linux before 5.3): its /proc entry is read this often.
const adoptedPoll = 50 * time.Millisecond

// Watch implements runtime.Watcher. A sandbox this Runtime started is
// watched by its wait(2); one an earlier worker started (found in the
// table) through a pidfd, from the first call on.
func (r *Runtime) Watch(id string) (<-chan struct{}, func() error, bool) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return nil, nil, false
	}
	if sb.owned() {
		return sb.exited, sb.ownExitErr, true
	}
	return r.watchAdopted(sb), func() error { return r.adoptedExitErr(sb) }, true
}

// watchAdopted returns a channel closed when the main process of a sandbox
// an earlier worker started ends, starting its watch the first time. This
// Runtime cannot wait(2) for such a process (it is not its child), so it
// holds a pidfd to it and the Go netpoller reports the process's exit; a
// restarted worker thereby learns of the death of a sandbox it adopted as
// soon as of one it started.
func (r *Runtime) watchAdopted(sb *sandbox) <-chan struct{} {
	sb.watchOnce.Do(func() {
		sb.gone = make(chan struct{})
		go r.watchPID(sb)
	})
	return sb.gone
}

func (r *Runtime) watchPID(sb *sandbox) {
	defer close(sb.gone)
	procs.WaitExitNotify(sb.rec.PID, sb.rec.StartTime, adoptedPoll, func(err error) {
		r.log.Debug("no pidfd for an adopted sandbox; polling its process", "sandbox", sb.rec.ID, "pid", sb.rec.PID, "err", err)
	})
}

// adoptedExitErr says why an adopted sandbox ended, as far as this Runtime
// can tell: its exit status went to the process that reaped it.
func (r *Runtime) adoptedExitErr(sb *sandbox) error {
	select {
	case <-sb.gone:
	default:
		return nil
	}
	if sb.stopping.Load() {
		return fmt.Errorf("%w (started by an earlier worker)", ErrKilled)
	}
	if sb.cg != nil {
		if n, _ := sb.cg.OOMKills(); n > 0 {
			return fmt.Errorf("exited after a process in the sandbox was %w", ErrOOMKilled)
		}
	}
	return errors.New("exited (started by an earlier worker: the exit status is not known)")
}

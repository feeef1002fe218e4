package process

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
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
	pid, start := sb.rec.PID, sb.rec.StartTime
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	switch {
	case errors.Is(err, unix.ESRCH):
		return // already gone (and reaped)
	case err == nil:
		f := os.NewFile(uintptr(fd), "pidfd")
		defer f.Close()
		// The pid names whatever runs as pid now: only once the pidfd is
		// open does checking the start time prove it is the sandbox's.
		if !alive(pid, start) {
			return
		}
		if err = waitPidfd(f); err == nil {
			return
		}
	}
	r.log.Debug("no pidfd for an adopted sandbox; polling its process", "sandbox", sb.rec.ID, "pid", pid, "err", err)
	t := time.NewTicker(adoptedPoll)
	defer t.Stop()
	for alive(pid, start) {
		<-t.C
	}
}

// waitPidfd blocks until the process f refers to has ended: a pidfd polls
// readable then. It fails at once if f cannot use the netpoller.
func waitPidfd(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = rc.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err != nil && err != unix.EINTR {
			perr = err
			return true
		}
		return n > 0
	})
	if err == nil {
		err = perr
	}
	return err
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
		if n, _ := sb.cg.oomKills(); n > 0 {
			return fmt.Errorf("exited after a process in the sandbox was %w", ErrOOMKilled)
		}
	}
	return errors.New("exited (started by an earlier worker: the exit status is not known)")
}

package procs

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// WaitExit blocks until the process (pid, start) has ended: through a pidfd
// when possible, which the Go netpoller reports readable once the process
// ends (it need not be the caller's child, nor be reaped), else by reading
// its /proc entry every poll. It returns at once if the process is gone. It
// reports whether it relied on pidfd_open rather than on polling.
func WaitExit(pid int, start uint64, poll time.Duration) (usedPidfd bool) {
	return WaitExitNotify(pid, start, poll, nil)
}

// WaitExitNotify is WaitExit that calls fallback, when not nil, with the
// reason before it falls back to polling (Linux before 5.3 has no pidfds).
func WaitExitNotify(pid int, start uint64, poll time.Duration, fallback func(err error)) (usedPidfd bool) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	switch {
	case errors.Is(err, unix.ESRCH):
		return true // already gone (and reaped)
	case err == nil:
		f := os.NewFile(uintptr(fd), "pidfd")
		defer f.Close()
		// The pid names whatever runs as pid now: only once the pidfd is
		// open does checking the start time prove it is the process meant.
		if !Alive(pid, start) {
			return true
		}
		if err = WaitPidfd(f); err == nil {
			return true
		}
	}
	if fallback != nil {
		fallback(err)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for Alive(pid, start) {
		<-t.C
	}
	return false
}

// WaitPidfd blocks until the process f refers to has ended: a pidfd polls
// readable then. It fails at once if f cannot use the netpoller.
func WaitPidfd(f *os.File) error {
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

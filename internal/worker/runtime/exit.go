package runtime

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
)

// WaitStatus words how a process that wait(2) reaped ended: "exited with
// status N" (nil err: 0) or "killed by signal N (name)", and the signal;
// ok is false when err is neither nil nor an *exec.ExitError.
func WaitStatus(err error) (status string, sig syscall.Signal, ok bool) {
	if err == nil {
		return "exited with status 0", 0, true
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return "", 0, false
	}
	ws, _ := ee.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal()), ws.Signal(), true
	}
	return fmt.Sprintf("exited with status %d", ws.ExitStatus()), 0, true
}

// Ended is why a sandbox ended, the same for every runtime: status as the
// runtime saw it, wrapped in ErrKilled when Kill stopped it, else in
// ErrOOMKilled when its cgroup counted OOM kills (memMB: its limit).
func Ended(status string, killed bool, oomKills, memMB int64) error {
	switch {
	case killed:
		return fmt.Errorf("%w (%s)", ErrKilled, status)
	case oomKills > 0:
		return fmt.Errorf("%s after a process in the sandbox was %w (memory limit %d MiB)", status, ErrOOMKilled, memMB)
	}
	return errors.New(status)
}

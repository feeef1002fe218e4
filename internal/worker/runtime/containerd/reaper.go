package containerd

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

var reaperOnce sync.Once

// BecomeSubreaper makes this process the child subreaper of its descendants
// (prctl PR_SET_CHILD_SUBREAPER) and reaps every child that exits, so that
// orphaned shims and container processes re-parented to it never linger as
// zombies (PID 1 on these machines reaps orphans only now and then).
//
// The reaper calls wait4(-1, WNOHANG) on each SIGCHLD, so it also takes the
// exit status of children the process started itself: a process that uses
// it must not wait for children of its own (os/exec). A containerd worker
// starts none; the process runtime does and must not run in the same
// process. Calling it more than once is harmless.
func BecomeSubreaper(log *slog.Logger) error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	reaperOnce.Do(func() {
		sigc := make(chan os.Signal, 1)
		signal.Notify(sigc, unix.SIGCHLD)
		go func() {
			for {
				reapAll(log)
				<-sigc // SIGCHLDs coalesce: each wake-up reaps all there is
			}
		}()
	})
	return nil
}

func reapAll(log *slog.Logger) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil { // 0: children left but none exited; ECHILD: none left
			return
		}
		if log != nil {
			log.Debug("reaped orphan", "pid", pid, "status", int(ws))
		}
	}
}

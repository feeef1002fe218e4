package procs

import (
	"fmt"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// SpawnThread runs f on an OS thread of its own that nothing else ever
// runs on again: f may set no_new_privs on it or move it between cgroups
// (both per-thread), and the child it forks inherits both. The thread ends
// when f returns (Go terminates a thread whose goroutine exits locked), so
// neither can leak to other goroutines. Go never terminates the main
// thread, so f does not run there.
func SpawnThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		goruntime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread: hold it, so that the goroutine below runs
			// on another thread, and give it back untouched.
			defer goruntime.UnlockOSThread()
			SpawnThread(f)
			return
		}
		f()
	}()
	<-done
}

// SetNoNewPrivs sets no_new_privs on the calling thread, for good.
func SetNoNewPrivs() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	return nil
}

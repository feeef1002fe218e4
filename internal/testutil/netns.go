package testutil

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// InNetNS runs f on an OS thread inside the network namespace at path;
// the sockets f opens belong to that namespace for good. The thread moves
// back after f, or dies with its goroutine if it cannot.
func InNetNS(path string, f func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread() // setns failed, so the thread did not move
			done <- fmt.Errorf("enter %s: %w", path, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("leave %s: %w", path, err))
			return // still locked: the thread dies with the goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

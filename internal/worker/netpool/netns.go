package netpool

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2, containerd and CNI look for named namespaces.
const netnsDir = "/var/run/netns"

var netnsDirState struct {
	sync.Mutex
	ready bool
}

// ensureNetnsDir makes netnsDir a shared mount point, as `ip netns add` does:
// a mount namespace cloned from ours afterwards (a container's, say) then
// sees our later unmounts, instead of keeping a copy of a bind mount that
// would pin the namespace alive after we destroyed it.
func ensureNetnsDir() error {
	netnsDirState.Lock()
	defer netnsDirState.Unlock()
	if netnsDirState.ready {
		return nil
	}
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("netpool: %w", err)
	}
	madeBind := false
	for {
		err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			break
		}
		// EINVAL: not a mount point yet; bind it onto itself and try again.
		if err != unix.EINVAL || madeBind {
			return fmt.Errorf("netpool: make %s shared: %w", netnsDir, err)
		}
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netpool: bind %s: %w", netnsDir, err)
		}
		madeBind = true
	}
	netnsDirState.ready = true
	return nil
}

// newNamedNS creates a network namespace, bind-mounts it on path (an
// existing empty file) so that it outlives every process, brings its
// loopback up, and returns a handle to it and a netlink socket inside it.
// The socket lets later configuration and recycling run from any thread.
//
// The work happens on a goroutine of its own, locked to its OS thread: if
// that thread cannot be switched back to our namespace, the goroutine exits
// still locked, and the Go runtime destroys the thread instead of handing it
// to other goroutines while it sits in the wrong namespace.
func newNamedNS(path string) (ns netns.NsHandle, h *netlink.Handle, mounted bool, err error) {
	type result struct {
		ns      netns.NsHandle
		h       *netlink.Handle
		mounted bool
		err     error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		r := result{ns: -1}
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{ns: -1, err: fmt.Errorf("get current netns: %w", err)}
			return
		}
		defer orig.Close()
		r.err = func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
			if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind-mount %s: %w", path, err)
			}
			r.mounted = true
			var err error
			if r.ns, err = netns.Get(); err != nil {
				return fmt.Errorf("open netns: %w", err)
			}
			// A netlink socket belongs to the namespace of the thread that opens it.
			if r.h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
				return fmt.Errorf("netlink socket in netns: %w", err)
			}
			// A new namespace's loopback is always ifindex 1.
			if err := r.h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1}}); err != nil {
				return fmt.Errorf("set lo up: %w", err)
			}
			return nil
		}()
		if err := netns.Set(orig); err != nil {
			// Stay locked: this thread dies with the goroutine.
			r.err = errors.Join(r.err, fmt.Errorf("return to original netns: %w", err))
			done <- r
			return
		}
		runtime.UnlockOSThread()
		done <- r
	}()
	r := <-done
	return r.ns, r.h, r.mounted, r.err
}

package netpool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LockDir holds the host-wide locks of HostLock (tmpfs on Debian: gone with
// a reboot, as the namespaces are).
var LockDir = "/run/brisk/netpool"

// HostLock claims cfg's name prefix, bridge and subnet on this host for
// the calling process, until release (or its exit: the locks are flocks).
// Two clusters on one host that share any of them would tear down each
// other's namespaces and bridge at start and stop; the second is refused
// before it touches anything, with the holder (owner: who the caller is,
// e.g. its data dir) in the message.
func HostLock(cfg Config, owner string) (release func(), err error) {
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, fmt.Errorf("netpool: host lock: %w", err)
	}
	claims := []struct{ what, key string }{
		{"name prefix " + cfg.NamePrefix, "prefix-" + cfg.NamePrefix},
		{"bridge " + cfg.Bridge, "bridge-" + cfg.Bridge},
		{"subnet " + cfg.Subnet.String(), "subnet-" + strings.ReplaceAll(cfg.Subnet.String(), "/", "_")},
	}
	var held []*os.File
	release = func() {
		for _, f := range held {
			f.Close()
		}
	}
	for _, c := range claims {
		path := filepath.Join(LockDir, c.key+".lock")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			release()
			return nil, fmt.Errorf("netpool: host lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder, _ := os.ReadFile(path)
			f.Close()
			release()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("netpool: the sandbox network's %s is in use by another brisk worker on this host (%s): give this one its own --net-prefix, --net-bridge and --net-subnet",
					c.what, strings.TrimSpace(string(holder)))
			}
			return nil, fmt.Errorf("netpool: host lock %s: %w", path, err)
		}
		_ = f.Truncate(0)
		_, _ = f.WriteAt([]byte(fmt.Sprintf("pid %d, %s\n", os.Getpid(), owner)), 0)
		held = append(held, f)
	}
	return release, nil
}

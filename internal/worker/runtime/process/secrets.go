package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Secrets (runtime.CheckSecrets says what a function may carry).
//
// As root, a sandbox of a function with secrets is started from a thread
// that has first left the worker's mount namespace (procs.SpawnThread
// throws the thread away afterwards, so nothing else ever runs in that
// namespace but the sandbox): mountSecrets makes every mount a slave, so
// nothing mounted there propagates back to the host while the host's own
// later mounts still reach the sandbox, mounts a small tmpfs on
// spec.SecretsDir, writes the files and remounts it read-only. The child
// inherits the namespace; so do the processes it forks (the watchdog's
// fprocess). The values never touch a disk, no other mount namespace has
// the mount, and it ends with the sandbox's last process: Kill, and a
// restarted worker that reaps or adopts, have nothing to clean up. The
// one thing left on the host is the empty mount point itself, made once.
// The tmpfs's pages are charged to the worker's memory cgroup, which
// wrote them, not the sandbox's. What this does not stop: sandboxes share
// one user (Config.User), and a process of that user can reach another
// sandbox's mount namespace through /proc/<pid>/root, as it can read that
// sandbox's environment and memory; the native and containerd runtimes
// (PID namespaces) close that.
//
// Without root there are no mount namespaces: the files go to
// <StateDir>/secrets/<sandbox-id>/ (the parent 0700: the sandbox runs as
// the worker's own user, who alone can enter it), $BRISK_SECRETS_DIR points
// there, and Kill, List's drop of an ended sandbox, a failed Create and
// New (for directories no table entry claims) remove it. The values then
// sit on whatever file system holds the state directory.

// secretsDirName is the state directory's subdirectory for secrets when
// the worker is not root.
const secretsDirName = runtime.SecretsSubdir

// secretsError is mountSecrets's: a failure to set up the secrets, not to
// start the command.
type secretsError struct{ err error }

func (e *secretsError) Error() string { return "secrets: " + e.err.Error() }
func (e *secretsError) Unwrap() error { return e.err }

// mountSecrets runs on the sandbox's spawn thread (procs.SpawnThread)
// before the child is forked; see above. Its errors are *secretsError.
func mountSecrets(f *spec.Function) error {
	if err := mkdirPublic(spec.SecretsDir); err != nil {
		return &secretsError{fmt.Errorf("mount point: %w", err)}
	}
	if err := ownMountNS(); err != nil {
		return &secretsError{err}
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", spec.SecretsDir, "tmpfs", flags, runtime.SecretsTmpfsData(f)); err != nil {
		return &secretsError{fmt.Errorf("tmpfs on %s: %w", spec.SecretsDir, err)}
	}
	// While a value's file is open for writing, no other goroutine of the
	// worker may fork (exec.Command takes ForkLock to fork): the child
	// would hold a copy of the descriptor until its exec, and the remount
	// below fails with EBUSY while a file is open for writing on the
	// tmpfs (a template failed to start so, once in CI).
	syscall.ForkLock.RLock()
	err := runtime.WriteSecrets(spec.SecretsDir, f)
	syscall.ForkLock.RUnlock()
	if err != nil {
		return &secretsError{err}
	}
	// The superblock read-only: writes fail with EROFS, whoever tries.
	if err := unix.Mount("", spec.SecretsDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return &secretsError{fmt.Errorf("remount %s read-only: %w", spec.SecretsDir, err)}
	}
	return nil
}

// ownMountNS moves the spawn thread into a mount namespace of its own whose
// mounts are slaves of the host's (see above). CLONE_NEWNS implies
// CLONE_FS: this thread alone gets the new namespace, and its own root and
// working directory.
func ownMountNS() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make mounts slaves: %w", err)
	}
	return nil
}

// tmpDirs are the world-writable directories a sandbox gets its own of.
var tmpDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// privateTmp gives the sandbox's mount namespace (ownMountNS, on the spawn
// thread) a /tmp, /var/tmp and /dev/shm of its own, each a tmpfs of
// sizeMB charged to the sandbox's cgroup: files there are created
// world-readable by default, and in the host's directories another
// function's sandbox (another user) could read them, or fill the host's
// disk. A directory the host lacks is left out.
func privateTmp(sizeMB int) error {
	for _, dir := range tmpDirs {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		data := "mode=1777,size=" + strconv.Itoa(sizeMB) + "m"
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
			return &secretsError{fmt.Errorf("tmpfs on %s: %w", dir, err)}
		}
	}
	return nil
}

// namesHostTmp says whether a command names a file in one of the host's
// tmpDirs (a program or script installed there, as in quick tests): such a
// sandbox keeps the host's directories, or it could not find it. Other
// sandboxes' files are not there either way.
func namesHostTmp(argv []string) bool {
	for _, a := range argv {
		for _, dir := range tmpDirs {
			if strings.HasPrefix(a, dir+"/") {
				return true
			}
		}
	}
	return false
}

// defaultTmpfsMB is Config.TmpfsMB's default.
const defaultTmpfsMB = 64

// bindMounts gives the sandbox's mount namespace (ownMountNS, on the spawn
// thread) its read-only binds (runtime.Spec.Mounts: a code function's
// source and runner). The mount points are made on the host, empty, once.
func bindMounts(ms []runtime.Mount) error {
	for _, m := range ms {
		if err := mkdirPublic(m.Target); err != nil {
			return &secretsError{fmt.Errorf("mount point: %w", err)}
		}
	}
	for _, m := range ms {
		if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return &secretsError{fmt.Errorf("bind %s on %s: %w", m.Source, m.Target, err)}
		}
		const flags = unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV
		if err := unix.Mount("", m.Target, "", flags, ""); err != nil {
			return &secretsError{fmt.Errorf("remount %s read-only: %w", m.Target, err)}
		}
	}
	return nil
}

// mkdirPublic makes dir and its missing parents 0755 whatever the umask,
// so that the sandbox's user can reach the mount.
func mkdirPublic(dir string) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := mkdirPublic(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// secretsDir is where sandbox id's secrets are without root.
func (r *Runtime) secretsDir(id string) string { return runtime.SecretsDirIn(r.cfg.StateDir, id) }

// writeSecretsDir writes f's secrets into sandbox id's directory under the
// state directory (without root) and returns it.
func (r *Runtime) writeSecretsDir(id string, f *spec.Function) (string, error) {
	r.secretsWarn.Do(func() {
		r.log.Warn("without root, sandboxes find their secrets where $"+runtime.EnvSecretsDir+" points, not at "+spec.SecretsDir,
			"dir", filepath.Dir(r.secretsDir(id)))
	})
	// The directory is 0555: the sandbox cannot add files (though, as the
	// owner, it could chmod).
	return runtime.WriteSecretsDir(r.cfg.StateDir, id, f)
}

// reapSecrets removes the secrets directories no table entry claims: those
// of sandboxes whose Create or removal a worker's exit cut short.
func reapSecrets(stateDir string, recs []record) error {
	return runtime.ReapSecretsDirs(stateDir, func(id string) bool {
		return slices.ContainsFunc(recs, func(rec record) bool { return rec.Secrets && rec.ID == id })
	})
}

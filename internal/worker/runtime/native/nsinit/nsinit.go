// Package nsinit is the first program of a native sandbox: a parked process,
// already in the sandbox's namespaces and cgroup, that waits for the worker
// to bind it to a function and then builds the root file system, drops its
// privileges and execs the function's entrypoint. It links only the standard
// library and x/sys, so that it starts in about a millisecond; the worker
// does everything that needs more (image resolution, the seccomp program).
package nsinit

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Subcommand is the hidden brisk subcommand that runs Main when the lean
// brisk-sandbox-init binary is not installed.
const Subcommand = "__native-init"

// BinaryName is the lean init binary the worker prefers (cmd/brisk-sandbox-init).
const BinaryName = "brisk-sandbox-init"

// ControlFD is the descriptor of the init's end of the control socket.
const ControlFD = 3

// MaxMessage bounds the bind message (the seccomp program is most of it).
// Secrets' values do not travel in it (Bind.Secrets).
const MaxMessage = 256 << 10

// SecretsDir is where a sandbox finds its secrets: spec.SecretsDir, which
// this package, linking only the standard library and x/sys, cannot import
// (the native runtime's tests check that the two agree).
const SecretsDir = "/var/openfaas/secrets"

// Secret is one file of SecretsDir: its name (a single path element) and
// the length of its value in the secrets descriptor.
type Secret struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// Bind is what the worker sends to bind a parked init to a function. The
// message carries the log file (for stdout and stderr), with ExecFD the
// executable, and with Secrets the secrets descriptor as SCM_RIGHTS
// descriptors, in that order.
type Bind struct {
	// Lower is the read-only lower layer of the root file system: an
	// unpacked image, or "/" to run on the host's root file system.
	Lower string `json:"lower"`
	// Argv, Env and Dir are the entrypoint; Argv[0] is looked up in the
	// PATH of Env inside the new root when it has no slash.
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// ExecFD says Argv[0] is to be executed from the passed descriptor (a
	// binary the sandbox's user could not reach by path).
	ExecFD   bool   `json:"exec_fd"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
	Hostname string `json:"hostname"`
	// Caps are the capabilities kept in the bounding set, and, for uid 0,
	// in the effective, permitted and inheritable sets.
	Caps []int `json:"caps"`
	// Seccomp is the classic BPF filter loaded just before exec, in the
	// kernel's struct sock_filter layout (EncodeFilter); empty means none.
	// Bytes, not a JSON array: the worker encodes it once, and the init
	// decodes a few kilobytes of base64 instead of hundreds of objects.
	Seccomp []byte `json:"seccomp,omitempty"`
	// Secrets are the files of SecretsDir, in the order their values
	// follow one another in the secrets descriptor: a sealed memfd the
	// worker wrote them to. Up to 32 MiB of values would not fit a
	// datagram (MaxMessage), and in a memfd they never touch a disk. The
	// init mounts a tmpfs on SecretsDir in the new root, writes the files
	// (0444) and remounts it read-only before it drops privileges; the
	// mount lives and ends with the sandbox's mount namespace, which no
	// later sandbox shares (a shell is never bound twice).
	Secrets []Secret `json:"secrets,omitempty"`
}

// Main is the init's whole life; it never returns. Its arguments (after
// the subcommand, if any) are the staging directory and the size of the
// writable layer in MiB: the init prepares everything that does not depend
// on the function while it is parked.
func Main() {
	// One thread does everything: the seccomp filter and the credentials
	// it sets apply to the thread that execs.
	goruntime.LockOSThread()
	args := os.Args[1:]
	if len(args) > 0 && args[0] == Subcommand {
		args = args[1:]
	}
	ctl := os.NewFile(ControlFD, "control")
	perr := errors.New("usage: init STAGING TMPFS-MB")
	if len(args) == 2 {
		perr = prepare(args[0], args[1])
	}
	b, fds, err := receive(ctl)
	switch {
	case err != nil:
	case perr != nil:
		err = perr
	default:
		err = start(b, fds, args[0])
	}
	// Only a failure gets here: say why and end; the worker sees the
	// message, or EOF when the exec went through.
	msg := "init: " + err.Error()
	_, _ = ctl.Write([]byte(msg))
	fmt.Fprintln(os.Stderr, "brisk sandbox", msg)
	os.Exit(127)
}

func receive(ctl *os.File) (*Bind, []int, error) {
	buf := make([]byte, MaxMessage)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := unix.Recvmsg(int(ctl.Fd()), buf, oob, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("receive: %w", err)
	}
	if n == 0 {
		return nil, nil, errors.New("the worker closed the control socket")
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, nil, fmt.Errorf("receive: %w", err)
	}
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, nil, fmt.Errorf("receive: %w", err)
		}
		fds = append(fds, got...)
	}
	var b Bind
	if err := json.Unmarshal(buf[:n], &b); err != nil {
		return nil, nil, fmt.Errorf("bind message: %w", err)
	}
	want := 1
	if b.ExecFD {
		want++
	}
	if len(b.Secrets) > 0 {
		want++
	}
	if len(fds) != want || len(b.Argv) == 0 {
		return nil, nil, fmt.Errorf("bind message: %d descriptors and %d arguments", len(fds), len(b.Argv))
	}
	return &b, fds, nil
}

// start builds the sandbox and execs its entrypoint; it returns only on
// failure.
func start(b *Bind, fds []int, staging string) error {
	logFD := fds[0]
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(logFD, fd, 0); err != nil {
			return fmt.Errorf("log: %w", err)
		}
	}
	_ = unix.Close(logFD)
	if err := buildRoot(b, staging); err != nil {
		return err
	}
	if len(b.Secrets) > 0 {
		err := mountSecrets(b.Secrets, fds[len(fds)-1])
		_ = unix.Close(fds[len(fds)-1]) // not for the function
		if err != nil {
			return fmt.Errorf("secrets: %w", err)
		}
	}
	if err := unix.Sethostname([]byte(b.Hostname)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	path := b.Argv[0]
	if b.ExecFD {
		path = "/proc/self/fd/" + strconv.Itoa(fds[1])
	} else if !strings.Contains(path, "/") {
		p, err := lookPath(path, b.Env)
		if err != nil {
			return err
		}
		path = p
	}
	dir := b.Dir
	if dir == "" {
		dir = "/"
	}
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("working directory %s: %w", dir, err)
	}
	if err := dropPrivileges(b); err != nil {
		return err
	}
	if filter := decodeFilter(b.Seccomp); len(filter) > 0 {
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
			return fmt.Errorf("seccomp: %w", e)
		}
	}
	unix.CloseOnExec(ControlFD)
	err := unix.Exec(path, b.Argv, b.Env)
	return fmt.Errorf("exec %s: %w", b.Argv[0], err)
}

// prepare builds, while the init is parked, what does not depend on the
// function, all inside its mount namespace: a tmpfs on staging holding the
// writable layer's directories, /proc of its PID namespace, a minimal /dev
// and a read-only /sys, to be moved under the root at bind.
func prepare(staging, sizeMB string) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", staging, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size="+sizeMB+"m"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", staging, err)
	}
	for _, d := range []string{"upper", "work", "root", "proc", "dev", "sys"} {
		if err := os.Mkdir(filepath.Join(staging, d), 0o755); err != nil {
			return err
		}
	}
	type mnt struct {
		src, dst, fstype string
		flags            uintptr
		data             string
		optional         bool
	}
	for _, m := range []mnt{
		{"proc", "proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", false},
		{"tmpfs", "dev", "tmpfs", unix.MS_NOSUID | unix.MS_STRICTATIME, "mode=755,size=65536k", false},
		{"shm", "dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "mode=1777,size=65536k", false},
		{"sysfs", "sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY, "", true},
	} {
		dst := filepath.Join(staging, m.dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, dst, m.fstype, m.flags, m.data); err != nil && !m.optional {
			return fmt.Errorf("mount %s on /%s: %w", m.fstype, m.dst, err)
		}
	}
	// Device nodes made, not bind-mounted from the host (as runc does
	// outside a user namespace): six mounts fewer to make and to tear down.
	// Where mknod is not allowed (a worker in a user namespace), they are
	// bind-mounted, as runc does there.
	for _, dev := range devices {
		dst := filepath.Join(staging, "dev", dev.name)
		err := unix.Mknod(dst, unix.S_IFCHR|0o666, int(unix.Mkdev(dev.major, dev.minor)))
		if errors.Is(err, unix.EPERM) {
			err = bindDevice(dev.name, dst)
		} else if err == nil {
			err = unix.Chmod(dst, 0o666) // whatever the umask
		}
		if err != nil {
			return fmt.Errorf("make /dev/%s: %w", dev.name, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(staging, "dev", name)); err != nil {
			return err
		}
	}
	return nil
}

// bindDevice bind-mounts the host's /dev/name on dst.
func bindDevice(name, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	f.Close()
	return unix.Mount("/dev/"+name, dst, "", unix.MS_BIND, "")
}

// devices are the character devices of a sandbox's /dev: runc's defaults.
var devices = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}

// EncodeFilter lays a BPF program out as the kernel's struct sock_filter
// array (u16 code, u8 jt, u8 jf, u32 k, native byte order), for Bind.Seccomp.
func EncodeFilter(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		out = binary.NativeEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out
}

func decodeFilter(b []byte) []unix.SockFilter {
	out := make([]unix.SockFilter, len(b)/8)
	for i := range out {
		in := b[8*i:]
		out[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.NativeEndian.Uint32(in[4:])}
	}
	return out
}

// buildRoot mounts the sandbox's root file system — the tmpfs upper layer
// over the read-only lower layer — moves the prepared /proc, /dev and /sys
// under it and pivots into it. Every mount lives in the sandbox's mount
// namespace and ends with it.
func buildRoot(b *Bind, st string) error {
	upper, work, root := filepath.Join(st, "upper"), filepath.Join(st, "work"), filepath.Join(st, "root")
	opts := "lowerdir=" + b.Lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("overlay root over %s: %w", b.Lower, err)
	}
	for _, d := range []string{"proc", "dev", "sys"} {
		dst := filepath.Join(root, d)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(filepath.Join(st, d), dst, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move /%s: %w", d, err)
		}
	}
	// An image without /tmp gets one anyone can write to, as in a container.
	if tmp := filepath.Join(root, "tmp"); !exists(tmp) {
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(tmp, 0o1777); err != nil { // Mkdir's mode is cut by the umask
			return err
		}
	}
	// pivot_root(".", ".") stacks the old root under the new one; unmounting
	// "." then drops it, with no directory needed for it.
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return unix.Chdir("/")
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// dropPrivileges leaves the process with what runc gives a container: the
// bounding set cut to b.Caps, no supplementary groups, the sandbox's uid and
// gid (a non-root uid then has no capabilities at all), and no_new_privs.
func dropPrivileges(b *Bind) error {
	keep := map[int]bool{}
	for _, c := range b.Caps {
		keep[c] = true
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	// Raw syscalls: they must change only this thread, the one that execs
	// (the syscall package's versions change every thread, which is not
	// needed and not possible once a thread is stuck in the kernel).
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(b.GID), uintptr(b.GID), uintptr(b.GID)); e != 0 {
		return fmt.Errorf("setresgid %d: %w", b.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(b.UID), uintptr(b.UID), uintptr(b.UID)); e != 0 {
		return fmt.Errorf("setresuid %d: %w", b.UID, e)
	}
	if b.UID == 0 {
		if err := setCaps(b.Caps); err != nil {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}

// setCaps sets the effective, permitted and inheritable sets to caps.
func setCaps(caps []int) error {
	var data [2]unix.CapUserData
	for _, c := range caps {
		data[c/32].Effective |= 1 << (uint(c) % 32)
	}
	for i := range data {
		data[i].Permitted, data[i].Inheritable = data[i].Effective, data[i].Effective
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// lookPath finds name in env's PATH inside the new root.
func lookPath(name string, env []string) (string, error) {
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in the sandbox's PATH %q: %w", name, path, syscall.ENOENT)
}

// mountSecrets mounts a tmpfs on SecretsDir inside the new root (the init
// has pivoted into it, so every path resolves inside the sandbox's root),
// writes secrets there from fd and remounts it read-only.
func mountSecrets(secrets []Secret, fd int) error {
	var total, size int64
	page := int64(os.Getpagesize())
	for _, s := range secrets {
		if s.Name == "" || s.Name == "." || s.Name == ".." || strings.ContainsAny(s.Name, "/\x00") || s.Size < 0 {
			return fmt.Errorf("bad secret %q", s.Name)
		}
		total += s.Size
		size += (s.Size + page - 1) / page * page
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Size != total {
		return fmt.Errorf("%d bytes of values, want %d", st.Size, total)
	}
	if err := mkdirPublic(SecretsDir); err != nil {
		return err
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	data := "mode=0755,size=" + strconv.FormatInt(size+16*page, 10) + ",nr_inodes=" + strconv.Itoa(len(secrets)+16)
	if err := unix.Mount("tmpfs", SecretsDir, "tmpfs", flags, data); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", SecretsDir, err)
	}
	src := os.NewFile(uintptr(fd), "secrets")
	var off int64
	for _, s := range secrets {
		if err := writeSecret(filepath.Join(SecretsDir, s.Name), io.NewSectionReader(src, off, s.Size)); err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		off += s.Size
	}
	if err := unix.Mount("", SecretsDir, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", SecretsDir, err)
	}
	return nil
}

func writeSecret(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Chmod(0o444) // whatever the umask
	}
	return errors.Join(err, f.Close())
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
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Chmod(dir, 0o755)
}

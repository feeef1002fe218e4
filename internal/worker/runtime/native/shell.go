package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// shell is a pre-created sandbox: a network namespace with its address, a
// cgroup, and a parked init process already in both and in fresh mount,
// PID, UTS and IPC namespaces, waiting on its control socket to be bound.
type shell struct {
	name string // the cgroup's name under brisk/
	ep   *netpool.Endpoint
	cg   *cgroups.Cgroup
	ctl  *os.File // the worker's end of the control socket; nil once bound
	pid  int
	// proc is the init when this worker started it (nil when adopted).
	proc *os.Process
	// start is the init's start time (procs.Stat), which with pid names it.
	start uint64
	// oomBase is the cgroup's OOM kill count when the shell took it: a
	// recycled cgroup counts its earlier sandboxes' kills too. oomFinal is
	// the count at teardown, once oomCounted.
	oomBase    int64
	oomFinal   atomic.Int64
	oomCounted atomic.Bool

	destroyMu sync.Mutex // serialises destroy
	destroyed bool       // destroy has finished

	exited  chan struct{} // closed once the worker has reaped the init
	exitErr error         // how it ended, set before exited closes
	bound   atomic.Bool

	// A template's child (template.go) is a shell of its own cgroup whose
	// network namespace is its template's: tpl is that template, nsPid
	// the child's pid as the template sees it, port its port.
	tpl   *forkserver.Template
	tplSh *shell
	nsPid int
	port  int
}

func (sh *shell) hasExited() bool {
	select {
	case <-sh.exited:
		return true
	default:
		return false
	}
}

// spawn makes one shell: it takes a network namespace from the pool, makes
// a cgroup, and starts the init in both from a thread that has entered the
// namespace (a child inherits the forking thread's network namespace and,
// on cgroup v1, its cgroups; on v2 it is cloned into its cgroup).
func (r *Runtime) spawn(ctx context.Context) (sh *shell, err error) {
	ep, err := r.cfg.Pool.Take(ctx)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	sh = &shell{ep: ep, exited: make(chan struct{})}
	select {
	case sp := <-r.spareCgroups:
		sh.cg, sh.oomBase = sp.cg, sp.oomKills
		sh.name = path.Base(sh.cg.Rel())
	default:
		sh.name = r.prefix + strconv.FormatUint(r.seq.Add(1), 10)
	}
	r.unbound.Store(sh.name, struct{}{})
	defer func() {
		if err != nil {
			r.unbound.Delete(sh.name)
			r.cfg.Pool.Release(ep)
			if sh.cg != nil {
				_ = sh.cg.RemoveNow()
			}
		}
	}()
	if r.cg != nil && sh.cg == nil {
		if sh.cg, err = r.cg.Create(sh.name, spec.Resources{}); err != nil {
			return nil, err
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	parent, child := os.NewFile(uintptr(fds[0]), "control"), os.NewFile(uintptr(fds[1]), "control-child")
	defer child.Close()
	var cmd *exec.Cmd
	procs.SpawnThread(func() { cmd, err = r.startInit(sh, child) })
	if err != nil {
		parent.Close()
		return nil, fmt.Errorf("start init: %w", err)
	}
	sh.ctl, sh.pid, sh.proc = parent, cmd.Process.Pid, cmd.Process
	// Not reaped before the goroutine below waits: the entry exists.
	_, sh.start, _ = procs.Stat(sh.pid)
	go func() {
		err := cmd.Wait()
		sh.exitErr = err
		close(sh.exited)
	}()
	return sh, nil
}

// startInit runs on a thread of its own (procs.SpawnThread), which it
// moves into the shell's network namespace and, on cgroup v1, cgroups.
func (r *Runtime) startInit(sh *shell, child *os.File) (*exec.Cmd, error) {
	ns, err := os.Open(sh.ep.NetNS)
	if err != nil {
		return nil, err
	}
	err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
	ns.Close()
	if err != nil {
		return nil, fmt.Errorf("enter %s: %w", sh.ep.NetNS, err)
	}
	attr := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
	}
	if sh.cg != nil {
		if r.cg.V2() {
			fd, err := sh.cg.OpenDir()
			if err != nil {
				return nil, err
			}
			defer syscall.Close(fd)
			attr.UseCgroupFD, attr.CgroupFD = true, fd
		} else if _, err := sh.cg.JoinThread(); err != nil {
			return nil, err // the thread ends with this call: no need to leave
		}
	}
	argv := append(slices.Clone(r.initArgv), r.staging, strconv.Itoa(r.cfg.TmpfsMB))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{child} // fd 3: nsinit.ControlFD
	cmd.SysProcAttr = attr
	return cmd, cmd.Start()
}

// bind sends the shell its function and waits until the init has exec'd
// the entrypoint (the control socket closes on exec) or reported why not.
func (r *Runtime) bind(ctx context.Context, sh *shell, b *nsinit.Bind, files []*os.File) error {
	msg, err := b.Encode()
	if err != nil {
		return err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	rc, err := sh.ctl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, unix.UnixRights(fds...), nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("bind: %w", serr)
	}
	sh.bound.Store(true)
	if dl, ok := ctx.Deadline(); ok {
		_ = sh.ctl.SetReadDeadline(dl)
	} else {
		_ = sh.ctl.SetReadDeadline(time.Now().Add(bindTimeout))
	}
	buf := make([]byte, 4096)
	n, err := sh.ctl.Read(buf)
	sh.ctl.Close()
	switch {
	case n > 0:
		return errors.New(string(buf[:n]))
	case errors.Is(err, io.EOF):
		// The socket closed on exec (close-on-exec): the init reports every
		// failure before it with a message. A function that exits at once
		// may already be reaped here; its exit is the instance's to report
		// (Exited, ExitErr), not a failed bind.
		return nil
	default:
		return fmt.Errorf("bind: %w", err)
	}
}

// killWait is how long destroy waits for a SIGKILLed init to be reaped
// before it kills the rest of its cgroup as well.
const killWait = time.Second

// bindTimeout bounds a bind when ctx has no deadline.
const bindTimeout = 30 * time.Second

// destroy ends a shell's processes and gives back what it held. It waits for
// the init to be reaped when the worker started it. A shell is destroyed
// once: a second call (a failed Create's cleanup racing List's) waits for
// the first and does nothing after it succeeded, for by then the cgroup may
// be another sandbox's.
func (r *Runtime) destroy(ctx context.Context, sh *shell) error {
	sh.destroyMu.Lock()
	defer sh.destroyMu.Unlock()
	if sh.destroyed {
		return nil
	}
	kept := false // the cgroup, now spare, keeps its name in unbound
	defer func() {
		if !kept {
			r.unbound.Delete(sh.name)
		}
	}()
	if sh.ctl != nil {
		sh.ctl.Close()
	}
	// SIGKILL to the init ends the sandbox: every other process is in its
	// PID namespace, which the kernel empties when its first process dies,
	// before the init can be reaped. It goes through the process handle (a
	// pidfd): an init whose main thread has exited while others run is a
	// zombie that procs.Alive counts as gone, and its pid is not reused
	// before this worker reaps it. An init this worker did not start
	// (adopted) is not awaited that way, so its cgroup is killed as well.
	if sh.proc != nil {
		_ = sh.proc.Signal(syscall.SIGKILL)
	} else {
		if sh.cg != nil {
			sh.cg.Kill()
		}
		if sh.pid > 0 && procs.Alive(sh.pid, sh.start) {
			_ = syscall.Kill(sh.pid, syscall.SIGKILL)
		}
	}
	if sh.exited != nil {
		select {
		case <-sh.exited:
		case <-time.After(killWait):
			// Not reaped yet: whatever holds it up goes too.
			if sh.cg != nil {
				sh.cg.Kill()
			}
			select {
			case <-sh.exited:
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	} else if err := waitGone(ctx, sh.pid, sh.start); err != nil {
		return err
	}
	if sh.cg != nil {
		// Counted before the cgroup may pass to another shell.
		n, _ := sh.cg.OOMKills()
		sh.oomFinal.Store(n)
		sh.oomCounted.Store(true)
		if kept = r.recycleCgroup(sh.cg, n); !kept {
			if err := sh.cg.Remove(ctx); err != nil {
				return err
			}
		}
	}
	switch {
	case sh.tpl != nil: // the template's network namespace and port
		releaseChild(sh)
		sh.ep = nil
	case sh.ep != nil:
		r.cfg.Pool.Release(sh.ep)
		sh.ep = nil
	}
	sh.destroyed = true
	return nil
}

// oomKills is the shell's cgroup's OOM kill count since the shell took it:
// as counted at teardown once the shell is destroyed.
func (sh *shell) oomKills() int64 {
	n := sh.oomFinal.Load()
	if !sh.oomCounted.Load() {
		n, _ = sh.cg.OOMKills()
	}
	return n - sh.oomBase
}

// recycleMaxMemory is the most memory a cgroup may still be charged with to
// be recycled: page cache of a small tenant, not its unfreed shared memory.
const recycleMaxMemory = 16 << 20

// spareCgroup is a recycled shell cgroup and its OOM kill count when it was
// emptied, the next shell's base.
type spareCgroup struct {
	cg       *cgroups.Cgroup
	oomKills int64
}

// recycleCgroup keeps the cgroup of a shell whose processes have all ended,
// its limits lifted, for the next shell to take: making and removing a
// cgroup (one per controller on v1, and the kernel's deferred teardown of
// each) cost more than the rest of a shell's teardown. oomKills is its
// count at teardown. It reports whether it kept the cgroup.
func (r *Runtime) recycleCgroup(cg *cgroups.Cgroup, oomKills int64) bool {
	// Not while adopting (before Start): adopt removes every cgroup it
	// does not keep right after.
	if !r.started.Load() || r.closed.Load() || len(r.spareCgroups) == cap(r.spareCgroups) || len(cg.Procs()) > 0 {
		return false
	}
	// Memory the kernel frees after the last process (a dead tenant's
	// SysV shared memory goes with its IPC namespace, later) would stay
	// charged and could make the next tenant's lower limit fail.
	if n, ok := cg.MemoryUsage(); ok && n > recycleMaxMemory {
		return false
	}
	if cg.Reset() != nil {
		return false
	}
	r.unbound.Store(path.Base(cg.Rel()), struct{}{})
	select {
	case r.spareCgroups <- spareCgroup{cg, oomKills}:
		return true
	default:
		return false
	}
}

// waitGone polls until the process (pid, start), not a child of this
// worker, has ended.
func waitGone(ctx context.Context, pid int, start uint64) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for procs.Alive(pid, start) {
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// catchesSIGTERM reports whether pid has a SIGTERM handler. The first
// process of a PID namespace gets only the signals it handles (and
// SIGKILL), so a SIGTERM to one without a handler would only cost the grace.
func catchesSIGTERM(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(uint(syscall.SIGTERM)-1)) != 0
		}
	}
	return false
}

package native

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Templates on the native runtime (docs/languages.md, "Templates";
// docs/security.md, "Templates").
//
// A template is a shell bound to the function's runner like a sandbox —
// its network namespace, cgroup, mount, PID, UTS and IPC namespaces, the
// sandbox's user and seccomp program, the code at /var/task — with two
// differences (nsinit.Bind.Template): its control socket reaches the
// runner, and after dropping every privilege the init makes the process
// root of a user namespace of its own, mapped to the sandbox's user. The
// runner imports the function there. It holds capabilities over what its
// children make in that user namespace and over nothing else: on the
// host, and in every namespace the worker made, it is the sandbox's
// unprivileged user, and the seccomp program it runs under is the
// default one with CAP_SYS_ADMIN's system calls allowed (mount, unshare).
//
// A sandbox is a fork of it. The child unshares its mount, UTS and IPC
// namespaces (owned by that user namespace), mounts a fresh /tmp and
// /dev/shm, makes the root read-only, sets its hostname, drops every
// capability and locks them out (securebits), becomes non-dumpable and
// loads the sandbox's seccomp program on top of the template's, then
// listens on its own port of the template's address. The worker moves it
// into a cgroup of its own. Children share the template's network
// namespace (one address, a port each) and PID namespace (they see each
// other's pids, and being non-dumpable, nothing of each other's memory
// or environment); they die with their template, which the set therefore
// keeps while they live.

// tplShell is a template's shell, the runtime's part of a
// forkserver.Template.
type tplShell struct {
	sh   *shell
	env  []string // the sandbox environment the template was bound with
	mu   sync.Mutex
	next int
	used map[int]bool
	// claimed is set once a standby's shell became a sandbox's
	// (createFromStandby): its end is then the sandbox's.
	claimed bool
}

// Child ports: above what functions usually bind at start.
const (
	childPortFirst = 10000
	childPortLast  = 60999
)

func (ts *tplShell) takePort() (int, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for range childPortLast - childPortFirst + 1 {
		p := childPortFirst + ts.next
		ts.next = (ts.next + 1) % (childPortLast - childPortFirst + 1)
		if !ts.used[p] {
			ts.used[p] = true
			return p, nil
		}
	}
	return 0, errors.New("no free port on the template's address")
}

func (ts *tplShell) freePort(p int) {
	ts.mu.Lock()
	delete(ts.used, p)
	ts.mu.Unlock()
}

// releaseChild gives back what a template's child held of its template.
func releaseChild(sh *shell) {
	if ts, ok := sh.tpl.State().(*tplShell); ok {
		ts.freePort(sh.port)
	}
	sh.tpl.DoneChild()
}

func (r *Runtime) initTemplates() {
	if r.cfg.NoTemplates {
		return
	}
	r.tpls = &forkserver.Set{Max: cmp.Or(r.cfg.MaxTemplates, 16), Idle: 15 * time.Minute, Retry: 30 * time.Second,
		Load: 2 * time.Minute, KeepWhileChildren: true, Standbys: true, Of: tplWhere, Start: r.startTemplate, Stop: r.stopTemplate, Log: r.log.Warn}
}

// Prewarm starts s's template unless it has one (runtime.Prewarmer).
func (r *Runtime) Prewarm(s runtime.Spec) { r.tpls.Prewarm(s) }

// StopTemplates ends every template, and so their children: at the
// worker's exit.
func (r *Runtime) StopTemplates() { r.tpls.StopAll(5 * time.Second) }

// TemplateCount is how many templates run (tests, status).
func (r *Runtime) TemplateCount() int { return r.tpls.Count() }

// HeldTemplates implements runtime.TemplateHolder.
func (r *Runtime) HeldTemplates() []runtime.HeldTemplate { return r.tpls.Held() }

// TemplateMemoryMB implements runtime.TemplateHolder: each template's
// shell's cgroup's usage, or its process's RSS without cgroups. Children
// are moved into cgroups of their own, charged to their requests.
func (r *Runtime) TemplateMemoryMB() int64 {
	return r.tpls.MemoryMB()
}

// tplWhere is a template's cgroup and process (forkserver.Set.Of).
func tplWhere(t *forkserver.Template) (*cgroups.Cgroup, int) {
	if ts, ok := t.State().(*tplShell); ok && ts.sh != nil {
		return ts.sh.cg, ts.sh.pid
	}
	return nil, 0
}

// startTemplate binds a shell to the function's runner in template mode
// (forkserver.Set.Start).
func (r *Runtime) startTemplate(t *forkserver.Template, s runtime.Spec, sock *os.File) error {
	ctx, cancel := context.WithTimeout(r.bg, time.Minute)
	defer cancel()
	b, exe, err := r.bindFor(s)
	if err != nil {
		return err
	}
	if exe != nil {
		defer exe.Close()
	}
	standby := forkserver.IsStandby(s)
	if standby { // a sandbox's shell in all but its name (createFromStandby)
		b.Standby = true
	} else {
		b.Template, b.Seccomp = true, r.tplSeccomp
	}
	env := slices.Clone(b.Env)
	b.Env = append(b.Env, forkserver.EnvFD+"="+strconv.Itoa(nsinit.TemplateFD))
	var secrets *os.File
	if len(s.Function.Secrets) > 0 {
		if b.Secrets, secrets, err = secretsFile(s.Function); err != nil {
			return fmt.Errorf("secrets: %w", err)
		}
		defer secrets.Close()
	}
	sh, err := r.takeShell(ctx)
	if err != nil {
		return err
	}
	r.unbound.Delete(sh.name)
	fail := func(err error) error {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		_ = r.destroy(dctx, sh)
		return err
	}
	logPath := r.logPath(s.Function.Name, "tpl-"+sh.name)
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	if err := r.fitShell(sh, s.Function, b, s.Function.Name); err != nil {
		return fail(err)
	}
	if err := r.bind(ctx, sh, b, append(bindFiles(logf, exe, secrets), sock)); err != nil {
		return fail(err)
	}
	ts := &tplShell{sh: sh, env: env, used: map[int]bool{}}
	t.SetState(ts)
	go func() {
		<-sh.exited
		ts.mu.Lock()
		claimed := ts.claimed
		ts.mu.Unlock()
		if claimed { // a sandbox now: its Kill tears the shell down
			t.End(forkserver.ErrBecameSandbox)
			return
		}
		if t.IsReady() {
			t.End(fmt.Errorf("template ended: %v", describeExit(sh.exitErr)))
		} else {
			t.End(fmt.Errorf("template ended before it loaded the handler: %v", describeExit(sh.exitErr)))
		}
		r.tpls.Ended(t)
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := r.destroy(dctx, sh); err != nil {
			r.log.Warn("tearing down a template's shell", "err", err)
		}
		dcancel()
		if b, err := os.ReadFile(logPath); err == nil && len(b) > 0 && !t.Stopping() {
			r.log.Warn("the ended template's last output", "function", s.Function.Name, "output", string(b[max(0, len(b)-2000):]))
		}
		_ = os.Remove(logPath)
	}()
	return nil
}

// stopTemplate kills a template: the first process of its PID namespace,
// and with it every child.
func (r *Runtime) stopTemplate(t *forkserver.Template) {
	if ts, ok := t.State().(*tplShell); ok && ts.sh.proc != nil {
		_ = ts.sh.proc.Kill()
	}
}

func describeExit(err error) string {
	if status, _, ok := runtime.WaitStatus(err); ok {
		return status
	}
	return err.Error()
}

// createFromTemplate starts sandbox s as a child of t (see above).
func (r *Runtime) createFromTemplate(ctx context.Context, s runtime.Spec, t *forkserver.Template) (*runtime.Instance, error) {
	ts, ok := t.State().(*tplShell)
	if !ok {
		return nil, forkserver.ErrNotReady
	}
	port, err := ts.takePort()
	if err != nil {
		return nil, err
	}
	t.AddChild()
	sh := &shell{name: r.prefix + "c" + strconv.FormatUint(r.seq.Add(1), 10), ep: ts.sh.ep, tpl: t, tplSh: ts.sh, port: port,
		exited: make(chan struct{})}
	logPath := r.logPath(s.Function.Name, s.ID)
	fail := func(err error) (*runtime.Instance, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if sh.pid == 0 {
			close(sh.exited)
		}
		_ = r.destroy(dctx, sh)
		_ = os.Remove(logPath)
		return nil, err
	}
	if r.cg != nil {
		if sh.cg, err = r.cg.Create(sh.name, s.Function.SandboxLimits()); err != nil {
			return fail(err)
		}
	}
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	env := sandboxEnvFor(ts.env, s, port)
	req := forkserver.Request{ID: s.ID, Port: port, Env: env,
		Isolate: &forkserver.Isolation{Hostname: truncate(s.ID, 64), TmpfsMB: r.cfg.TmpfsMB, Seccomp: r.seccomp}}
	nsPid, err := t.Fork(ctx, req, logf)
	if err != nil {
		if ctx.Err() != nil {
			r.tpls.Evict(t) // out of step with its replies now
		}
		return fail(err)
	}
	sh.nsPid = nsPid
	pid, err := hostPID(ts.sh.pid, nsPid)
	if err != nil {
		return fail(err)
	}
	sh.pid = pid
	if _, sh.start, err = procs.Stat(pid); err != nil {
		return fail(err)
	}
	go func() {
		procs.WaitExit(sh.pid, sh.start, 5*time.Millisecond)
		close(sh.exited)
	}()
	if sh.cg != nil {
		if err := sh.cg.AddProc(pid); err != nil {
			return fail(fmt.Errorf("moving the template's child into the sandbox's cgroup: %w", err))
		}
	}
	sb := &sandbox{sh: sh, memMB: s.Function.SandboxLimits().MemoryMB, lock: make(chan struct{}, 1),
		rec: record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision,
			Addr: net.JoinHostPort(ts.sh.ep.IP.String(), strconv.Itoa(port)), PID: pid, StartTime: sh.start, NetNS: ts.sh.ep.Name}}
	r.mu.Lock()
	r.sandboxes[s.ID] = sb
	r.mu.Unlock()
	r.log.Debug("sandbox forked from its template", "sandbox", s.ID, "function", s.Function.Name, "addr", sb.rec.Addr)
	return &runtime.Instance{ID: s.ID, Addr: sb.rec.Addr, Exited: sh.exited, ExitErr: func() error { return r.exitErr(sb) }}, nil
}

// sandboxEnvFor is the template's environment with the sandbox's own
// values: its port, id and function name (runtime.FunctionEnv's last
// entries).
func sandboxEnvFor(base []string, s runtime.Spec, port int) []string {
	own := runtime.FunctionEnv(nil, runtime.Spec{ID: s.ID, Function: &spec.Function{Name: s.Function.Name, Secrets: s.Function.Secrets}}, port, "")
	out := make([]string, 0, len(base)+len(own))
	set := map[string]bool{}
	for _, kv := range own {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, own...)
}

// hostPID finds, among the children of the template (host pid tpl), the
// one whose pid in the template's PID namespace is nsPid.
func hostPID(tpl, nsPid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", tpl, tpl))
	if err != nil {
		return 0, fmt.Errorf("the template's children: %w", err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if n, levels, err := nsPID(pid); err == nil && levels >= 2 && n == nsPid {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("the template's child %d is not among its children (it exited at once?)", nsPid)
}

// nsPID is pid's number in its own PID namespace, and how many PID
// namespaces it is in (NSpid in /proc/PID/status).
func nsPID(pid int) (n, levels int, err error) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			if ids := strings.Fields(v); len(ids) > 0 {
				n, err := strconv.Atoi(ids[len(ids)-1])
				return n, len(ids), err
			}
		}
	}
	return 0, 0, fmt.Errorf("process %d: no NSpid", pid)
}

// templateChildExitErr says why a sandbox forked from a template ended.
func (r *Runtime) templateChildExitErr(sb *sandbox) error {
	status := "exited"
	if st, ok := sb.sh.tpl.ExitStatus(sb.sh.nsPid, time.Second); ok {
		status = forkserver.DescribeStatus(st)
	}
	var oom int64
	if sb.sh.cg != nil {
		oom, _ = sb.sh.cg.OOMKills()
	}
	return runtime.Ended(status, sb.stopping.Load(), oom, sb.memMB)
}

// createFromStandby makes sandbox s of standby t (forkserver.IsStandby): a
// shell bound to the function like a fresh sandbox's (its cgroup with the
// sandbox's limits, its network namespace bound to the function's egress
// policy, the runner loaded), whose runner waits for the sandbox's
// environment on its control socket and then serves as the sandbox; its
// log is renamed the sandbox's. The next standby starts meanwhile. The
// sandbox's hostname is its function's name, as the standby was bound
// before its id was known.
func (r *Runtime) createFromStandby(ctx context.Context, s runtime.Spec, t *forkserver.Template) (*runtime.Instance, error) {
	ts, ok := t.State().(*tplShell)
	if !ok || !r.tpls.Take(t) {
		return nil, forkserver.ErrNotReady
	}
	defer r.tpls.Prewarm(s)
	sh := ts.sh
	ts.mu.Lock()
	ended := sh.hasExited()
	ts.claimed = !ended
	ts.mu.Unlock()
	if ended {
		return nil, forkserver.ErrNotReady
	}
	sb := &sandbox{sh: sh, memMB: s.Function.SandboxLimits().MemoryMB, lock: make(chan struct{}, 1),
		rec: record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision,
			Addr: net.JoinHostPort(sh.ep.IP.String(), strconv.Itoa(s.Function.Port)),
			PID:  sh.pid, StartTime: sh.start, NetNS: sh.ep.Name}}
	if sh.cg != nil {
		sb.rec.Cgroup, sb.rec.OOMBase = sh.name, sh.oomBase
	}
	logPath := r.logPath(s.Function.Name, s.ID)
	fail := func(err error) (*runtime.Instance, error) {
		r.forget(sb)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = r.destroy(dctx, sh)
		_ = os.Remove(logPath)
		return nil, err
	}
	if err := logpipe.Move(r.logPath(s.Function.Name, "tpl-"+sh.name), logPath); err != nil {
		return fail(err)
	}
	r.mu.Lock()
	r.sandboxes[s.ID] = sb
	r.mu.Unlock()
	nsPid, err := t.Fork(ctx, forkserver.Request{ID: s.ID, Port: s.Function.Port, Env: sandboxEnvFor(ts.env, s, s.Function.Port)}, nil)
	if err == nil {
		// The function's code answered: only the shell's own process may
		// be the sandbox.
		if own, _, perr := nsPID(sh.pid); perr != nil || own != nsPid {
			err = fmt.Errorf("the standby answered with pid %d, which is not its own", nsPid)
		}
	}
	if err != nil {
		return fail(err)
	}
	t.End(forkserver.ErrBecameSandbox)
	r.markDirty()
	r.log.Debug("sandbox started from its standby", "sandbox", s.ID, "function", s.Function.Name, "addr", sb.rec.Addr)
	return &runtime.Instance{ID: s.ID, Addr: sb.rec.Addr, Exited: sh.exited, ExitErr: func() error { return r.exitErr(sb) }}, nil
}

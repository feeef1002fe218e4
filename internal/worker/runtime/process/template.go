package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/internal/worker/runtime/statefile"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Templates (docs/languages.md, "Templates"; package forkserver).
//
// A function deployed from Python source pays its interpreter's start and
// its module's imports (100 ms and more) at every cold start. A template
// pays them once per node and revision: it is the function's runner
// started like a sandbox (its user, no_new_privs, its mounts and secrets,
// a cgroup of its own), which loads the handler and then, instead of
// serving, waits on a control socket (descriptor 3, $BRISK_TEMPLATE_FD).
// A sandbox is then one message: the template forks a child, which
// reseeds what the fork copied (random's state), takes the sandbox's
// environment and log, listens on the sandbox's port and serves; the
// worker moves it into the sandbox's cgroup before Create returns, so the
// function's code runs there and nowhere else once calls reach it. The
// template runs the function's import-time code as the sandbox's user,
// with nothing a sandbox lacks: there is no privileged fork server.
//
// The child is the template's, not the worker's: the template reaps it
// and reports its exit status; the worker watches it through a pidfd like
// a sandbox an earlier worker started, and kills it through its process
// group and cgroup like any other. Children outlive their template.
// Templates are kept in StateDir/templates.json so that a restarted
// worker kills the ones it did not start (their children, sandboxes in
// the table, are adopted as usual).

const (
	templatePrefix = "tpl-"
	templatesFile  = "templates.json"
	// EnvTemplateFD tells a runner to be a template and which descriptor
	// is its control socket.
	EnvTemplateFD = forkserver.EnvFD
	// DefaultMaxTemplates bounds the templates one runtime keeps; the
	// least recently used goes first.
	DefaultMaxTemplates = 16
	// exitReportWait bounds the wait for a template's report of a child's
	// exit.
	exitReportWait = time.Second
)

// tplProc is a template's process, the runtime's part of a
// forkserver.Template.
type tplProc struct {
	id    string // its cgroup's and log's name
	pid   int
	start uint64
	cg    *cgroups.Cgroup

	// A standby that became a sandbox (createFromStandby): its end is the
	// sandbox's, reported through the sandbox, not a template's failure.
	claimMu sync.Mutex
	claimed *sandbox
	ended   bool
}

func procOf(t *forkserver.Template) *tplProc {
	p, _ := t.State().(*tplProc)
	return p
}

type tplRecord struct {
	ID     string `json:"id"`
	PID    int    `json:"pid"`
	Start  uint64 `json:"start_time"`
	Cgroup string `json:"cgroup,omitempty"`
}

// templates is a runtime's set, and the table of their processes.
type templates struct {
	*forkserver.Set
	r       *Runtime
	table   *statefile.File
	tableMu sync.Mutex
}

// openTemplates kills what an earlier worker's templates left and starts
// an empty set.
func openTemplates(r *Runtime, max int) (*templates, error) {
	f, b, err := statefile.Open(r.cfg.StateDir, templatesFile)
	if err != nil {
		return nil, err
	}
	ts := &templates{r: r, table: f}
	ts.Set = &forkserver.Set{Max: max, Idle: 15 * time.Minute, Retry: 30 * time.Second, Load: 2 * time.Minute,
		Start: ts.start, Stop: ts.stop, Changed: ts.persist, Log: r.log.Warn, Standbys: true, Of: tplWhere}
	var recs []tplRecord
	if len(b) > 0 {
		if err := json.Unmarshal(b, &recs); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path(), err)
		}
	}
	// Only this state directory's: other workers on the host keep their
	// templates under the same cgroup root.
	for _, rec := range recs {
		if procs.Alive(rec.PID, rec.Start) {
			_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
		}
		if r.cg != nil && rec.Cgroup != "" && strings.HasPrefix(path.Base(rec.Cgroup), templatePrefix) {
			cg := r.cg.Open(rec.Cgroup)
			cg.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := cg.Remove(ctx); err != nil {
				r.log.Warn("cannot remove an earlier worker's template cgroup", "cgroup", rec.Cgroup, "err", err)
			}
			cancel()
		}
	}
	ts.persist()
	return ts, nil
}

func (ts *templates) persist() {
	ts.tableMu.Lock()
	defer ts.tableMu.Unlock()
	var recs []tplRecord
	for _, t := range ts.All() {
		p := procOf(t)
		if p == nil || p.pid == 0 {
			continue
		}
		rec := tplRecord{ID: p.id, PID: p.pid, Start: p.start}
		if p.cg != nil {
			rec.Cgroup = p.cg.Rel()
		}
		recs = append(recs, rec)
	}
	slices.SortFunc(recs, func(a, b tplRecord) int { return a.PID - b.PID })
	b, err := json.Marshal(recs)
	if err == nil {
		err = ts.table.Write(b)
	}
	if err != nil {
		ts.r.log.Warn("writing the template table", "err", err)
	}
}

// Prewarm starts s's template unless it has one: a function's first
// sandbox then starts from it too (SnapStart's snapshot at publish).
func (r *Runtime) Prewarm(s runtime.Spec) { r.tpls.Prewarm(s) }

// StopTemplates ends every template (their children, sandboxes, live on):
// at the worker's exit, as a template is remade faster than it would be
// adopted.
func (r *Runtime) StopTemplates() { r.tpls.StopAll(5 * time.Second) }

// TemplateCount is how many templates run (tests, status).
func (r *Runtime) TemplateCount() int { return r.tpls.Count() }

// HeldTemplates implements runtime.TemplateHolder.
func (r *Runtime) HeldTemplates() []runtime.HeldTemplate { return r.tpls.Held() }

// TemplateMemoryMB implements runtime.TemplateHolder: each template's
// cgroup's usage, or its process's RSS without cgroups. Its children are
// in their sandboxes' cgroups, charged to their own requests.
func (r *Runtime) TemplateMemoryMB() int64 {
	return r.tpls.MemoryMB()
}

// tplWhere is a template's cgroup and process (forkserver.Set.Of).
func tplWhere(t *forkserver.Template) (*cgroups.Cgroup, int) {
	if p := procOf(t); p != nil {
		return p.cg, p.pid
	}
	return nil, 0
}

// start starts t's process (forkserver.Set.Start).
func (ts *templates) start(t *forkserver.Template, s runtime.Spec, sock *os.File) error {
	r := ts.r
	var b [6]byte
	_, _ = rand.Read(b[:])
	p := &tplProc{id: templatePrefix + s.Function.Name + "-" + hex.EncodeToString(b[:])}
	if len(p.id) > 128 {
		p.id = p.id[:128]
	}
	id, err := r.identityOf(s.Function)
	if err != nil {
		return err
	}
	logPath := r.logPath(s.Function.Name, p.id)
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	if r.cg != nil {
		if p.cg, err = r.cg.Create(p.id, s.Function.SandboxLimits()); err != nil {
			return err
		}
	}
	env := append(r.sandboxEnv(s, 0, ""), EnvTemplateFD+"=3")
	cmd, err := r.start(s, id, s.Function.Command, env, logf, p.cg, sock)
	if err != nil {
		if p.cg != nil {
			_ = p.cg.RemoveNow()
		}
		return err
	}
	p.pid = cmd.Process.Pid
	_, p.start, _ = procs.Stat(p.pid)
	t.SetState(p)
	go ts.wait(t, p, cmd, logPath)
	return nil
}

// wait reaps the template and cleans up after it.
func (ts *templates) wait(t *forkserver.Template, p *tplProc, cmd *exec.Cmd, logPath string) {
	err := cmd.Wait()
	p.claimMu.Lock()
	sb := p.claimed
	p.ended = true
	p.claimMu.Unlock()
	if sb != nil { // a standby that became sandbox sb
		sb.exitErr = ts.r.describeExit(sb, err)
		close(sb.exited)
		t.End(forkserver.ErrBecameSandbox)
		return
	}
	if t.IsReady() {
		t.End(fmt.Errorf("template ended: %s", describeWait(err)))
	} else {
		t.End(fmt.Errorf("template ended before it loaded the handler: %s", describeWait(err)))
	}
	ts.Ended(t)
	if p.cg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := p.cg.Remove(ctx); err != nil {
			ts.r.log.Warn("cannot remove a template's cgroup", "template", p.id, "err", err)
		}
		cancel()
	}
	_ = os.Remove(logPath)
}

// stop kills t's process (its children live on).
func (ts *templates) stop(t *forkserver.Template) {
	p := procOf(t)
	if p == nil {
		return
	}
	if p.pid > 0 && procs.Alive(p.pid, p.start) {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	if p.cg != nil {
		p.cg.Kill()
	}
}

func describeWait(err error) string {
	if status, _, ok := runtime.WaitStatus(err); ok {
		return status
	}
	return err.Error()
}

// createFromTemplate starts sandbox s as a child of t (see above).
func (r *Runtime) createFromTemplate(ctx context.Context, s runtime.Spec, t *forkserver.Template) (*runtime.Instance, error) {
	port, addr, id, err := r.reserveFor(s.Function)
	if err != nil {
		return nil, err
	}
	created := false
	defer func() {
		if !created {
			r.releasePort(port)
		}
	}()
	logPath := r.logPath(s.Function.Name, s.ID)
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	sb := &sandbox{
		rec:   record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision, Addr: addr},
		memMB: s.Function.SandboxLimits().MemoryMB,
		lock:  make(chan struct{}, 1),
		tpl:   t,
	}
	if r.cg != nil {
		if sb.cg, err = r.cg.Create(s.ID, s.Function.SandboxLimits()); err != nil {
			_ = os.Remove(logPath)
			return nil, err
		}
		sb.rec.Cgroup = sb.cg.Rel()
	}
	// The child runs as the template, its function's user.
	if err := r.guardSandbox(sb, id, port); err != nil {
		if sb.cg != nil {
			_ = sb.cg.RemoveNow()
		}
		_ = os.Remove(logPath)
		return nil, err
	}
	undo := func(pid int) {
		_ = r.guard.forget(entryOf(sb.rec))
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if sb.cg != nil {
			sb.cg.Kill()
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sigkillTimeout)
			_ = sb.cg.Remove(cctx)
			cancel()
		}
		_ = os.Remove(logPath)
	}
	pid, err := t.Fork(ctx, forkserver.Request{ID: s.ID, Port: port, Env: r.sandboxEnv(s, port, "")}, logf)
	if err != nil {
		if ctx.Err() != nil { // the template is out of step now
			r.tpls.Evict(t)
		}
		undo(0)
		return nil, err
	}
	// The template runs the function's code, which may answer with any
	// pid: only its own child may become the sandbox, or it could have
	// another tenant's process moved into its cgroup and killed with it.
	if ppid, err := procs.Parent(pid); err != nil || ppid != procOf(t).pid {
		r.tpls.Evict(t)
		undo(0)
		return nil, fmt.Errorf("the template answered with pid %d, which is not its child: template stopped", pid)
	}
	if sb.cg != nil {
		if err := sb.cg.AddProc(pid); err != nil {
			undo(pid)
			return nil, fmt.Errorf("moving the template's child into the sandbox's cgroup: %w", err)
		}
	}
	sb.rec.PID, sb.rec.PGID = pid, pid // the child made itself a session leader
	if _, sb.rec.StartTime, err = procs.Stat(pid); err != nil {
		undo(pid)
		return nil, fmt.Errorf("the template's child %d: %w", pid, err)
	}
	r.mu.Lock()
	r.sandboxes[s.ID] = sb
	r.mu.Unlock()
	if err := r.persist(); err != nil {
		r.mu.Lock()
		delete(r.sandboxes, s.ID)
		r.mu.Unlock()
		undo(pid)
		return nil, err
	}
	created = true
	exited := r.watchAdopted(sb)
	return &runtime.Instance{ID: s.ID, Addr: addr, Exited: exited, ExitErr: func() error { return r.templateChildExitErr(sb) }}, nil
}

// reserveFor reserves a port for a sandbox of f and resolves f's user;
// the caller releases the port unless the sandbox is made.
func (r *Runtime) reserveFor(f *spec.Function) (port int, addr string, id identity, err error) {
	if port, addr, err = r.reserveAddr(); err != nil {
		return 0, "", identity{}, err
	}
	if id, err = r.identityOf(f); err != nil {
		r.releasePort(port)
		return 0, "", identity{}, err
	}
	return port, addr, id, nil
}

// templateChildExitErr says why a sandbox forked from a template ended:
// the status the template reported, when it did.
func (r *Runtime) templateChildExitErr(sb *sandbox) error {
	select {
	case <-sb.gone:
	default:
		return nil
	}
	sb.tplExitOnce.Do(func() { sb.tplExitErr = r.describeTemplateChildExit(sb) })
	return sb.tplExitErr
}

func (r *Runtime) describeTemplateChildExit(sb *sandbox) error {
	status := "exited"
	if st, ok := sb.tpl.ExitStatus(sb.rec.PID, exitReportWait); ok {
		status = forkserver.DescribeStatus(st)
	}
	var oom int64
	if sb.cg != nil {
		oom, _ = sb.cg.OOMKills()
	}
	return runtime.Ended(status, sb.stopping.Load(), oom, sb.memMB)
}

// createFromStandby makes sandbox s of standby t (forkserver.IsStandby):
// t's process, the function's runner started and loaded ahead of need,
// becomes the sandbox. Its log and its cgroup (made with the sandbox's
// limits) are renamed the sandbox's, and it takes the sandbox's
// environment and port; the next standby starts once the sandbox is in
// the table.
func (r *Runtime) createFromStandby(ctx context.Context, s runtime.Spec, t *forkserver.Template) (*runtime.Instance, error) {
	p := procOf(t)
	if !r.tpls.Take(t) {
		return nil, forkserver.ErrNotReady
	}
	taken := false
	defer func() {
		if !taken { // the standby is out of the set: it must not linger
			r.tpls.Evict(t)
			r.tpls.Changed()
		}
		r.tpls.Prewarm(s)
	}()
	port, addr, id, err := r.reserveFor(s.Function)
	if err != nil {
		return nil, err
	}
	created := false
	defer func() {
		if !created {
			r.releasePort(port)
		}
	}()
	sb := &sandbox{
		rec:    record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision, Addr: addr, PID: p.pid, PGID: p.pid, StartTime: p.start},
		memMB:  s.Function.SandboxLimits().MemoryMB,
		exited: make(chan struct{}),
		lock:   make(chan struct{}, 1),
	}
	if p.cg != nil {
		// The standby's cgroup, made with the sandbox's limits, becomes
		// the sandbox's: renamed, not migrated into (cgroups.Rename).
		// Before the claim below: from it on, the standby's end is read
		// through sb.
		if sb.cg, err = p.cg.Rename(s.ID); err != nil {
			return nil, err
		}
		sb.rec.Cgroup = sb.cg.Rel()
	}
	p.claimMu.Lock()
	ended := p.ended
	if !ended {
		p.claimed = sb
	}
	p.claimMu.Unlock()
	if ended {
		if sb.cg != nil {
			_ = sb.cg.RemoveNow()
		}
		return nil, forkserver.ErrNotReady
	}
	taken = true
	logPath := r.logPath(s.Function.Name, s.ID)
	undo := func() {
		sb.stopping.Store(true)
		_ = r.guard.forget(entryOf(sb.rec))
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		if sb.cg != nil {
			sb.cg.Kill()
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sigkillTimeout)
			_ = sb.cg.Remove(cctx)
			cancel()
		}
		_ = os.Remove(logPath)
		r.tpls.Changed()
	}
	if err := logpipe.Move(r.logPath(s.Function.Name, p.id), logPath); err != nil {
		undo()
		return nil, err
	}
	if err := r.guardSandbox(sb, id, port); err != nil {
		undo()
		return nil, err
	}
	pid, err := t.Fork(ctx, forkserver.Request{ID: s.ID, Port: port, Env: r.sandboxEnv(s, port, "")}, nil)
	if err == nil && pid != p.pid {
		// The function's code answered: nothing but the standby itself
		// may become the sandbox.
		err = fmt.Errorf("the standby answered with pid %d, not its own %d", pid, p.pid)
	}
	if err != nil {
		undo()
		return nil, err
	}
	t.End(forkserver.ErrBecameSandbox)
	r.mu.Lock()
	r.sandboxes[s.ID] = sb
	r.mu.Unlock()
	if err := r.persist(); err != nil {
		r.mu.Lock()
		delete(r.sandboxes, s.ID)
		r.mu.Unlock()
		undo()
		return nil, err
	}
	r.tpls.Changed() // the template table without it, now that the sandbox table has it
	created = true
	return &runtime.Instance{ID: s.ID, Addr: addr, Exited: sb.exited, ExitErr: sb.ownExitErr}, nil
}

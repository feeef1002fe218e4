package process

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/internal/worker/runtime/statefile"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Templates (docs/languages.md, "Templates").
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
	EnvTemplateFD = "BRISK_TEMPLATE_FD"
	// DefaultMaxTemplates bounds the templates one runtime keeps; the
	// least recently used goes first.
	DefaultMaxTemplates = 16
	// templateIdle is how long an unused template is kept: a function's
	// idle sandboxes are kept 15 minutes by default (gd keep-alive).
	templateIdle = 15 * time.Minute
	// templateRetry is how long after a template failed no other is
	// started for the function (its sandboxes start fresh meanwhile).
	templateRetry = 30 * time.Second
	// templateLoad bounds a template's import.
	templateLoad = 2 * time.Minute
)

// Templatable says whether sandboxes of s start from templates: functions
// deployed from Python source, resolved into their runner's command.
func Templatable(s runtime.Spec) bool {
	c := s.Function.Code
	return c != nil && c.Language == spec.LangPython && len(s.Function.Command) > 0
}

// tplKey names a template: what its children inherit must be what a
// fresh sandbox of the function would get, the secrets' values included.
type tplKey struct {
	function string
	revision uint64
	inputs   string // hash of the argv, env, mounts and secrets
}

func keyOf(s runtime.Spec) tplKey {
	h := sha256.New()
	f := s.Function
	for _, a := range f.Command {
		h.Write([]byte(a + "\x00"))
	}
	for _, k := range slices.Sorted(maps.Keys(f.Env)) {
		h.Write([]byte(k + "=" + f.Env[k] + "\x00"))
	}
	for _, m := range s.Mounts {
		h.Write([]byte(m.Source + ">" + m.Target + "\x00"))
	}
	for _, k := range slices.Sorted(maps.Keys(f.SecretData)) {
		h.Write([]byte(k + "\x00"))
		h.Write(f.SecretData[k])
		h.Write([]byte{0})
	}
	return tplKey{function: f.Name, revision: f.Revision, inputs: hex.EncodeToString(h.Sum(nil)[:8])}
}

// templates is a runtime's set of templates.
type templates struct {
	r   *Runtime
	max int

	mu      sync.Mutex
	byKey   map[tplKey]*template
	failed  map[tplKey]time.Time // when the last template of a key failed
	table   *statefile.File
	tableMu sync.Mutex
}

// template is one running template.
type template struct {
	key   tplKey
	id    string // its cgroup's and log's name
	pid   int
	start uint64
	cg    *cgroups.Cgroup
	conn  *net.UnixConn

	ready   chan struct{} // closed once the handler is loaded
	done    chan struct{} // closed once the process has ended
	err     error         // why it ended, set before done closes
	forkMu  sync.Mutex    // one fork at a time: replies come in order
	replies chan tplMsg
	lastUse atomic.Int64 // unix nanoseconds

	stopping atomic.Bool // stop was called: its end is no failure

	exitMu   sync.Mutex
	exits    map[int]int   // child pid → exit status as the template reported it
	exitNews chan struct{} // closed (and replaced) at each report
}

// tplMsg is one control-socket message, either way.
type tplMsg struct {
	Op     string   `json:"op"` // fork; ready, forked, error, exit
	ID     string   `json:"id,omitempty"`
	Port   int      `json:"port,omitempty"`
	Env    []string `json:"env,omitempty"`
	PID    int      `json:"pid,omitempty"`
	Status *int     `json:"status,omitempty"` // exit: code, or -signal
	Error  string   `json:"error,omitempty"`
}

type tplRecord struct {
	ID     string `json:"id"`
	PID    int    `json:"pid"`
	Start  uint64 `json:"start_time"`
	Cgroup string `json:"cgroup,omitempty"`
}

// openTemplates kills what an earlier worker's templates left and starts
// an empty set.
func openTemplates(r *Runtime, max int) (*templates, error) {
	f, b, err := statefile.Open(r.cfg.StateDir, templatesFile)
	if err != nil {
		return nil, err
	}
	ts := &templates{r: r, max: max, byKey: map[tplKey]*template{}, failed: map[tplKey]time.Time{}, table: f}
	var recs []tplRecord
	if len(b) > 0 {
		if err := json.Unmarshal(b, &recs); err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path(), err)
		}
	}
	for _, rec := range recs {
		if procs.Alive(rec.PID, rec.Start) {
			_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
		}
	}
	if r.cg != nil {
		for _, name := range r.cg.List(templatePrefix) {
			cg := r.cg.Open(filepath.Join("brisk", name))
			cg.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := cg.Remove(ctx); err != nil {
				r.log.Warn("cannot remove an earlier worker's template cgroup", "cgroup", name, "err", err)
			}
			cancel()
		}
	}
	return ts, ts.persist()
}

func (ts *templates) persist() error {
	ts.tableMu.Lock()
	defer ts.tableMu.Unlock()
	ts.mu.Lock()
	recs := make([]tplRecord, 0, len(ts.byKey))
	for _, t := range ts.byKey {
		rec := tplRecord{ID: t.id, PID: t.pid, Start: t.start}
		if t.cg != nil {
			rec.Cgroup = t.cg.Rel()
		}
		recs = append(recs, rec)
	}
	ts.mu.Unlock()
	slices.SortFunc(recs, func(a, b tplRecord) int { return a.PID - b.PID })
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return ts.table.Write(b)
}

// Prewarm starts s's template unless it has one: a function's first
// sandbox then starts from it too (SnapStart's snapshot at publish).
func (r *Runtime) Prewarm(s runtime.Spec) {
	if r.tpls != nil && Templatable(s) {
		r.tpls.get(s)
	}
}

// StopTemplates ends every template (their children, sandboxes, live on):
// at the worker's exit, as a template is remade faster than it would be
// adopted.
func (r *Runtime) StopTemplates() {
	if r.tpls == nil {
		return
	}
	r.tpls.mu.Lock()
	all := slices.Collect(maps.Values(r.tpls.byKey))
	clear(r.tpls.byKey)
	r.tpls.mu.Unlock()
	for _, t := range all {
		t.stop()
	}
	for _, t := range all {
		select {
		case <-t.done:
		case <-time.After(5 * time.Second):
		}
	}
	if err := r.tpls.persist(); err != nil {
		r.log.Warn("writing the template table", "err", err)
	}
}

// TemplateCount is how many templates run (tests, status).
func (r *Runtime) TemplateCount() int {
	if r.tpls == nil {
		return 0
	}
	r.tpls.mu.Lock()
	defer r.tpls.mu.Unlock()
	return len(r.tpls.byKey)
}

// get returns s's template when it is ready, starting one (in the
// background) when there is none; nil means: start this sandbox fresh.
func (ts *templates) get(s runtime.Spec) *template {
	k := keyOf(s)
	now := time.Now()
	ts.mu.Lock()
	t := ts.byKey[k]
	var evict []*template
	if t == nil {
		if at, ok := ts.failed[k]; ok && now.Sub(at) < templateRetry {
			ts.mu.Unlock()
			return nil
		}
		evict = ts.evictLocked(now)
		t = &template{key: k, ready: make(chan struct{}), done: make(chan struct{}), replies: make(chan tplMsg, 1), exits: map[int]int{}, exitNews: make(chan struct{})}
		t.lastUse.Store(now.UnixNano())
		ts.byKey[k] = t
		ts.mu.Unlock()
		for _, e := range evict {
			e.stop()
		}
		go ts.start(t, s)
		return nil
	}
	ts.mu.Unlock()
	select {
	case <-t.ready:
		t.lastUse.Store(now.UnixNano())
		return t
	default:
		return nil // still loading
	}
}

// evictLocked picks the templates to stop to make room for one more: those
// idle past templateIdle, and the least recently used beyond max.
func (ts *templates) evictLocked(now time.Time) []*template {
	var out []*template
	live := make([]*template, 0, len(ts.byKey))
	for k, t := range ts.byKey {
		if now.Sub(time.Unix(0, t.lastUse.Load())) > templateIdle {
			delete(ts.byKey, k)
			out = append(out, t)
			continue
		}
		live = append(live, t)
	}
	slices.SortFunc(live, func(a, b *template) int { return int(a.lastUse.Load() - b.lastUse.Load()) })
	for len(live) >= ts.max && len(live) > 0 {
		delete(ts.byKey, live[0].key)
		out = append(out, live[0])
		live = live[1:]
	}
	return out
}

// forget drops t from the set if it is still there; failed records when a
// template of its key may be tried again.
func (ts *templates) forget(t *template, failed bool) {
	ts.mu.Lock()
	if ts.byKey[t.key] == t {
		delete(ts.byKey, t.key)
	}
	if failed {
		ts.failed[t.key] = time.Now()
	}
	ts.mu.Unlock()
	if err := ts.persist(); err != nil {
		ts.r.log.Warn("writing the template table", "err", err)
	}
}

// start starts t's process and waits for it to load the handler.
func (ts *templates) start(t *template, s runtime.Spec) {
	r := ts.r
	fail := func(err error) {
		t.err = err
		close(t.done)
		ts.forget(t, true)
		r.log.Warn("function template failed; its sandboxes start fresh", "function", s.Function.Name, "err", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	t.id = templatePrefix + s.Function.Name + "-" + hex.EncodeToString(b[:])
	if len(t.id) > 128 {
		t.id = t.id[:128]
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fail(err)
		return
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "template-control"), os.NewFile(uintptr(fds[1]), "template-control")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		fail(err)
		return
	}
	t.conn = fc.(*net.UnixConn)
	logPath := filepath.Join(r.cfg.StateDir, "logs", s.Function.Name, t.id+".log")
	logf, err := openLog(logPath)
	if err != nil {
		t.conn.Close()
		fail(err)
		return
	}
	defer logf.Close()
	if r.cg != nil {
		if t.cg, err = r.cg.Create(t.id, s.Function.SandboxLimits()); err != nil {
			t.conn.Close()
			fail(err)
			return
		}
	}
	env := append(sandboxEnv(s, 0, ""), EnvTemplateFD+"=3")
	cmd, err := r.start(s, s.Function.Command, env, logf, t.cg, theirs)
	if err == nil {
		t.pid = cmd.Process.Pid
		_, t.start, _ = procs.Stat(t.pid)
		go ts.wait(t, cmd)
	}
	if err != nil {
		t.conn.Close()
		if t.cg != nil {
			_ = t.cg.RemoveNow()
		}
		fail(err)
		return
	}
	if err := ts.persist(); err != nil {
		r.log.Warn("writing the template table", "err", err)
	}
	go t.read()
	select {
	case <-t.ready:
		r.log.Debug("function template ready", "function", s.Function.Name, "template", t.id, "pid", t.pid)
	case <-t.done:
	case <-time.After(templateLoad):
		t.stop()
	}
}

// wait reaps the template and cleans up after it.
func (ts *templates) wait(t *template, cmd *exec.Cmd) {
	err := cmd.Wait()
	select {
	case <-t.ready:
		if t.err == nil {
			t.err = fmt.Errorf("template ended: %v", describeWait(err))
		}
	default:
		t.err = fmt.Errorf("template ended before it loaded the handler: %v", describeWait(err))
	}
	t.conn.Close()
	close(t.done)
	ts.forget(t, !t.stopping.Load())
	if !t.stopping.Load() {
		ts.r.log.Warn("function template ended; its sandboxes start fresh for a while", "template", t.id, "err", t.err)
	}
	if t.cg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := t.cg.Remove(ctx); err != nil {
			ts.r.log.Warn("cannot remove a template's cgroup", "template", t.id, "err", err)
		}
		cancel()
	}
	_ = os.Remove(filepath.Join(ts.r.cfg.StateDir, "logs", t.key.function, t.id+".log"))
}

func describeWait(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ws, _ := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			return fmt.Sprintf("killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
		}
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	}
	if err == nil {
		return "exited with status 0"
	}
	return err.Error()
}

// read dispatches the template's messages until its socket closes.
func (t *template) read() {
	buf := make([]byte, 4096)
	for {
		n, err := t.conn.Read(buf)
		if err != nil || n == 0 {
			return
		}
		var m tplMsg
		if json.Unmarshal(buf[:n], &m) != nil {
			continue
		}
		switch m.Op {
		case "ready":
			close(t.ready)
		case "forked", "error":
			select {
			case t.replies <- m:
			default: // nobody asked: a confused template; ignored
			}
		case "exit":
			if m.Status != nil {
				t.exitMu.Lock()
				if len(t.exits) >= 4096 { // reports nobody collected
					clear(t.exits)
				}
				t.exits[m.PID] = *m.Status
				close(t.exitNews)
				t.exitNews = make(chan struct{})
				t.exitMu.Unlock()
			}
		}
	}
}

// stop ends the template (its children live on).
func (t *template) stop() {
	t.stopping.Store(true)
	if t.pid > 0 && procs.Alive(t.pid, t.start) {
		_ = syscall.Kill(-t.pid, syscall.SIGKILL)
	}
	if t.cg != nil {
		t.cg.Kill()
	}
}

// exitStatus is what the template reported of child pid, ok false if
// nothing.
func (t *template) exitStatus(pid int) (int, bool) {
	// The child's end reaches the worker (its pidfd) before the
	// template's report of it, which follows within a millisecond unless
	// the template is gone or wedged.
	deadline := time.NewTimer(exitReportWait)
	defer deadline.Stop()
	for {
		t.exitMu.Lock()
		st, ok := t.exits[pid]
		news := t.exitNews
		if ok {
			delete(t.exits, pid)
		}
		t.exitMu.Unlock()
		if ok {
			return st, true
		}
		select {
		case <-news:
		case <-t.done:
			return 0, false
		case <-deadline.C:
			return 0, false
		}
	}
}

// exitReportWait bounds the wait for a template's report of a child's exit.
const exitReportWait = time.Second

// fork asks the template for a child serving port with env, its output to
// logf, and returns its pid.
func (t *template) fork(ctx context.Context, id string, port int, env []string, logf *os.File) (int, error) {
	t.forkMu.Lock()
	defer t.forkMu.Unlock()
	b, err := json.Marshal(tplMsg{Op: "fork", ID: id, Port: port, Env: env})
	if err != nil {
		return 0, err
	}
	if _, _, err := t.conn.WriteMsgUnix(b, unix.UnixRights(int(logf.Fd())), nil); err != nil {
		return 0, fmt.Errorf("template: %w", err)
	}
	select {
	case m := <-t.replies:
		switch {
		case m.Op == "error":
			return 0, fmt.Errorf("template: %s", m.Error)
		case m.ID != id || m.PID <= 0:
			return 0, fmt.Errorf("template answered for %q, pid %d", m.ID, m.PID)
		}
		return m.PID, nil
	case <-t.done:
		return 0, t.err
	case <-ctx.Done():
		// The reply may still come: the template is out of step.
		t.stop()
		return 0, ctx.Err()
	}
}

// createFromTemplate starts sandbox s as a child of t (see above).
func (r *Runtime) createFromTemplate(ctx context.Context, s runtime.Spec, t *template) (*runtime.Instance, error) {
	port, err := r.reservePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(port))
	created := false
	defer func() {
		if !created {
			r.mu.Lock()
			delete(r.ports, port)
			r.mu.Unlock()
		}
	}()
	logPath := filepath.Join(r.cfg.StateDir, "logs", s.Function.Name, s.ID+".log")
	logf, err := openLog(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	sb := &sandbox{
		rec:   record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision, Addr: addr},
		memMB: s.Function.Resources.MemoryMB,
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
	undo := func(pid int) {
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
	pid, err := t.fork(ctx, s.ID, port, sandboxEnv(s, port, ""), logf)
	if err != nil {
		undo(0)
		return nil, err
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
	if st, ok := sb.tpl.exitStatus(sb.rec.PID); ok {
		if st < 0 {
			sig := syscall.Signal(-st)
			status = fmt.Sprintf("killed by signal %d (%v)", -st, sig)
		} else {
			status = fmt.Sprintf("exited with status %d", st)
		}
	}
	if sb.stopping.Load() {
		return fmt.Errorf("%w (%s)", ErrKilled, status)
	}
	if sb.cg != nil {
		if n, _ := sb.cg.OOMKills(); n > 0 {
			return fmt.Errorf("%s after a process in the sandbox was %w (memory limit %d MiB)", status, ErrOOMKilled, sb.memMB)
		}
	}
	return errors.New(status)
}

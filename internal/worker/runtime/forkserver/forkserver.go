// Package forkserver is the worker's side of function templates
// (docs/languages.md, "Templates"): a template is a function's runner that
// has loaded the function and waits on a control socket; asked, it forks a
// child that serves one sandbox. This package holds what the runtimes
// that use templates (process, native) share: the control protocol
// (Client), and the set of a runtime's templates with its eviction and
// failure rules (Set). Starting a template's process, and placing a child
// in its sandbox, are each runtime's own.
package forkserver

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/policy/keepalive"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// EnvFD tells a runner to be a template and which descriptor is its
// control socket.
const EnvFD = "BRISK_TEMPLATE_FD"

// Templatable says whether sandboxes of s start from templates that fork:
// functions deployed from Python source, resolved into their runner's
// command.
func Templatable(s runtime.Spec) bool {
	c := s.Function.Code
	return c != nil && c.Language == spec.LangPython && len(s.Function.Command) > 0
}

// IsStandby says whether s's template is a standby: a function deployed
// from Node source. Node cannot fork safely (V8's and libuv's threads), so
// its "template" is the runner started and loaded ahead of need, which one
// sandbox then takes whole (Set.Take): its fork request makes the process
// itself the sandbox, and the set starts the next standby.
func IsStandby(s runtime.Spec) bool {
	c := s.Function.Code
	return c != nil && c.Language == spec.LangNode && len(s.Function.Command) > 0
}

// Key names a template: what its children inherit must be what a fresh
// sandbox of the function would get, the secrets' values included.
type Key struct {
	Function string
	Revision uint64
	Inputs   string // hash of the argv, env, mounts and secrets
}

// KeyOf is s's template's key.
func KeyOf(s runtime.Spec) Key {
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
	return Key{Function: f.Name, Revision: f.Revision, Inputs: hex.EncodeToString(h.Sum(nil)[:8])}
}

// Isolation is what a child makes of itself before it serves, where the
// template is root of a user namespace of its own (native runtime): a
// private mount namespace with the root read-only and a fresh /tmp, its
// own UTS and IPC namespaces and hostname, then no capability at all and
// the sandbox's seccomp program on top of the template's.
type Isolation struct {
	Hostname string `json:"hostname"`
	TmpfsMB  int    `json:"tmpfs_mb"`
	Seccomp  []byte `json:"seccomp,omitempty"` // struct sock_filter array
}

// Request is one fork request.
type Request struct {
	ID      string     // the sandbox's id
	Port    int        // the port it serves
	Env     []string   // its whole environment
	Isolate *Isolation // nil: the child keeps the template's namespaces
}

// msg is one control-socket message, either way.
type msg struct {
	Op      string     `json:"op"` // fork; ready, forked, error, exit
	ID      string     `json:"id,omitempty"`
	Port    int        `json:"port,omitempty"`
	Env     []string   `json:"env,omitempty"`
	Isolate *Isolation `json:"isolate,omitempty"`
	PID     int        `json:"pid,omitempty"`
	Status  *int       `json:"status,omitempty"` // exit: code, or -signal
	Error   string     `json:"error,omitempty"`
}

// Client talks to one template over its control socket.
type Client struct {
	conn    *net.UnixConn
	ready   chan struct{} // closed once the handler is loaded
	done    chan struct{} // closed by End
	endOnce sync.Once
	err     error      // why it ended, set before done closes
	forkMu  sync.Mutex // one fork at a time: replies come in order
	replies chan msg

	exitMu   sync.Mutex
	exits    map[int]int   // child pid (as the template sees it) → exit status
	exitNews chan struct{} // closed (and replaced) at each report
}

// NewClient serves conn, the worker's end of a template's control socket.
func NewClient(conn *net.UnixConn) *Client {
	c := &Client{conn: conn, ready: make(chan struct{}), done: make(chan struct{}), replies: make(chan msg, 1),
		exits: map[int]int{}, exitNews: make(chan struct{})}
	go c.read()
	return c
}

// Socketpair makes a template's control socket: the worker's end as a
// Client's connection, the template's as a file to hand to its process.
func Socketpair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "template-control"), os.NewFile(uintptr(fds[1]), "template-control")
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		theirs.Close()
		return nil, nil, err
	}
	return fc.(*net.UnixConn), theirs, nil
}

// Ready is closed once the template has loaded the function.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Done is closed once End was called.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the template ended (after Done).
func (c *Client) Err() error { return c.err }

// IsReady reports whether Ready is closed.
func (c *Client) IsReady() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// End records that the template's process ended and why, and closes the
// socket. Only the first call counts.
func (c *Client) End(err error) {
	c.endOnce.Do(func() {
		c.err = err
		c.conn.Close()
		close(c.done)
	})
}

// read dispatches the template's messages until its socket closes.
func (c *Client) read() {
	buf := make([]byte, 4096)
	for {
		n, err := c.conn.Read(buf)
		if err != nil || n == 0 {
			return
		}
		var m msg
		if json.Unmarshal(buf[:n], &m) != nil {
			continue
		}
		switch m.Op {
		case "ready":
			select {
			case <-c.ready:
			default:
				close(c.ready)
			}
		case "forked", "error":
			select {
			case c.replies <- m:
			default: // nobody asked: a confused template; ignored
			}
		case "exit":
			if m.Status != nil {
				c.exitMu.Lock()
				if len(c.exits) >= 4096 { // reports nobody collected
					clear(c.exits)
				}
				c.exits[m.PID] = *m.Status
				close(c.exitNews)
				c.exitNews = make(chan struct{})
				c.exitMu.Unlock()
			}
		}
	}
}

// Fork asks the template for a child serving req, its output to logf, and
// returns its pid as the template sees it. A standby is asked with a nil
// logf and answers with its own pid: it becomes the sandbox. A ctx that ends first leaves
// the template out of step: the caller must end it.
func (c *Client) Fork(ctx context.Context, req Request, logf *os.File) (int, error) {
	c.forkMu.Lock()
	defer c.forkMu.Unlock()
	b, err := json.Marshal(msg{Op: "fork", ID: req.ID, Port: req.Port, Env: req.Env, Isolate: req.Isolate})
	if err != nil {
		return 0, err
	}
	var oob []byte
	if logf != nil { // a standby keeps its output (logpipe.Move)
		oob = unix.UnixRights(int(logf.Fd()))
	}
	if _, _, err := c.conn.WriteMsgUnix(b, oob, nil); err != nil {
		return 0, fmt.Errorf("template: %w", err)
	}
	select {
	case m := <-c.replies:
		switch {
		case m.Op == "error":
			return 0, fmt.Errorf("template: %s", m.Error)
		case m.ID != req.ID || m.PID <= 0:
			return 0, fmt.Errorf("template answered for %q, pid %d", m.ID, m.PID)
		}
		return m.PID, nil
	case <-c.done:
		return 0, c.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// ExitStatus is the exit status the template reported of child pid (as it
// sees it), waiting up to wait for the report: a child's end reaches the
// worker (its pidfd) before the template's report of it. ok is false when
// none came.
func (c *Client) ExitStatus(pid int, wait time.Duration) (status int, ok bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		c.exitMu.Lock()
		st, ok := c.exits[pid]
		news := c.exitNews
		if ok {
			delete(c.exits, pid)
		}
		c.exitMu.Unlock()
		if ok {
			return st, true
		}
		select {
		case <-news:
		case <-c.done:
			return 0, false
		case <-deadline.C:
			return 0, false
		}
	}
}

// DescribeStatus words an exit status as a template reports it.
func DescribeStatus(st int) string {
	if st < 0 {
		return fmt.Sprintf("killed by signal %d (%v)", -st, unix.Signal(-st))
	}
	return fmt.Sprintf("exited with status %d", st)
}

// Template is one template in a Set.
type Template struct {
	*Client
	Key Key
	// state is the runtime's own state of the template (its process,
	// cgroup, shell), set by Set.Start (SetState) while the template may
	// already be talking.
	state atomic.Value

	lastUse  atomic.Int64 // unix nanoseconds
	stopping atomic.Bool
	children atomic.Int64 // live sandboxes forked from it

	idle time.Duration // kept unused this long: its function's keep-alive
	load atomic.Int64  // nanoseconds from its start to ready: what a fork saves
}

// SetState records the runtime's state of the template.
func (t *Template) SetState(v any) { t.state.Store(v) }

// State is what SetState recorded, nil before.
func (t *Template) State() any { return t.state.Load() }

// Stopping reports whether the Set stopped it (its end is no failure).
func (t *Template) Stopping() bool { return t.stopping.Load() }

// AddChild and DoneChild count the template's live sandboxes.
func (t *Template) AddChild()  { t.children.Add(1) }
func (t *Template) DoneChild() { t.children.Add(-1) }

// Set is a runtime's templates.
type Set struct {
	// Max bounds the templates kept; beyond it, the one of lowest
	// Greedy-Dual priority goes first (the gd keep-alive's order, with a
	// template's load time as its cost and its memory as its size:
	// keepalive.GD).
	Max int
	// Idle is how long an unused template is kept when its function sets
	// no keep-alive (spec.Scaling.KeepAlive).
	Idle time.Duration
	// Of returns the runtime's cgroup and process of a template (nil and 0
	// when it has none yet): for its memory (MemoryMB, and the eviction
	// order).
	Of func(*Template) (*cgroups.Cgroup, int)
	// Retry is how long after a template of a key failed no other is
	// started (sandboxes start fresh meanwhile).
	Retry time.Duration
	// Load bounds a template's start and import.
	Load time.Duration
	// KeepWhileChildren keeps a template that has live sandboxes past
	// Idle and Max: on the native runtime its children die with it.
	KeepWhileChildren bool
	// Standbys makes Node functions' templates standbys too (IsStandby):
	// the runtime takes each whole for one sandbox.
	Standbys bool
	// Start starts t's process for s with sock, the template's end of its
	// control socket, records its state (t.SetState), and arranges for t.End and Ended to
	// be called when the process ends. It returns once the process runs
	// (not once it is ready); sock is closed after it returns.
	Start func(t *Template, s runtime.Spec, sock *os.File) error
	// Stop kills t's process.
	Stop func(t *Template)
	// Changed is called when the set's membership changed (to persist it).
	Changed func()
	// Log reports failures.
	Log func(msg string, args ...any)

	mu     sync.Mutex
	byKey  map[Key]*Template
	failed map[Key]time.Time
	gd     *keepalive.GD
	stop   chan struct{} // ends the sweeper (StopAll)
	// stopped: StopAll ran (the worker is exiting); no template starts
	// after it, not even a standby's successor.
	stopped bool
}

// sweepEvery is how often unused templates are looked for.
const sweepEvery = 30 * time.Second

// Prewarm starts s's template unless it has one. A nil Set (templates
// off) does nothing.
func (ts *Set) Prewarm(s runtime.Spec) { ts.Get(s) }

// Get returns s's template when it is ready, starting one in the
// background when there is none; nil means: start this sandbox fresh, as
// it does for a spec that is not Templatable and from a nil Set.
func (ts *Set) Get(s runtime.Spec) *Template {
	if ts == nil || !Templatable(s) && !(ts.Standbys && IsStandby(s)) {
		return nil
	}
	k := KeyOf(s)
	now := time.Now()
	ts.mu.Lock()
	if ts.stopped {
		ts.mu.Unlock()
		return nil
	}
	if ts.byKey == nil {
		ts.byKey, ts.failed, ts.gd, ts.stop = map[Key]*Template{}, map[Key]time.Time{}, keepalive.NewGD(0), make(chan struct{})
		go ts.sweep(ts.stop)
	}
	t := ts.byKey[k]
	if t == nil {
		if at, ok := ts.failed[k]; ok && now.Sub(at) < ts.Retry {
			ts.mu.Unlock()
			return nil
		}
		conn, sock, err := Socketpair()
		if err != nil {
			ts.mu.Unlock()
			ts.Log("function template: control socket", "err", err)
			return nil
		}
		evict := ts.evictLocked(now, 1)
		t = &Template{Client: NewClient(conn), Key: k, idle: cmp.Or(time.Duration(s.Function.Scaling.KeepAlive), ts.Idle)}
		t.lastUse.Store(now.UnixNano())
		ts.byKey[k] = t
		ts.mu.Unlock()
		for _, e := range evict {
			ts.Evict(e)
		}
		go ts.start(t, s, sock)
		return nil
	}
	defer ts.mu.Unlock()
	if !t.usable() {
		return nil // still loading, or ended
	}
	t.lastUse.Store(now.UnixNano())
	ts.gd.Touch(now, t.Key.String(), 1)
	return t
}

// usable says whether t has loaded its function and still runs.
func (t *Template) usable() bool {
	if !t.IsReady() || t.State() == nil {
		return false
	}
	select {
	case <-t.Done():
		return false
	default:
		return true
	}
}

// String is k as one word (the eviction policy's key).
func (k Key) String() string {
	return k.Function + "/" + strconv.FormatUint(k.Revision, 10) + "/" + k.Inputs
}

func (ts *Set) start(t *Template, s runtime.Spec, sock *os.File) {
	began := time.Now()
	err := ts.Start(t, s, sock)
	sock.Close()
	if err != nil {
		t.End(err)
		ts.Forget(t, true)
		ts.Log("function template failed; its sandboxes start fresh", "function", s.Function.Name, "err", err)
		return
	}
	if ts.Changed != nil {
		ts.Changed()
	}
	load := time.NewTimer(ts.Load)
	defer load.Stop()
	select {
	case <-t.Ready():
		t.load.Store(int64(time.Since(began)))
	case <-t.Done():
	case <-load.C:
		ts.Log("function template did not load in time", "function", s.Function.Name, "after", ts.Load)
		ts.Evict(t)
	}
}

// Ended is what a runtime calls once t's process has ended: t leaves the
// set, and unless the set stopped it, its key waits Retry.
func (ts *Set) Ended(t *Template) {
	failed := !t.stopping.Load()
	ts.Forget(t, failed)
	if failed {
		ts.Log("function template ended; its sandboxes start fresh for a while", "function", t.Key.Function, "err", t.Err())
	}
}

// Forget drops t from the set if it is still there; failed makes its key
// wait Retry.
func (ts *Set) Forget(t *Template, failed bool) {
	ts.mu.Lock()
	if ts.byKey[t.Key] == t {
		ts.dropLocked(t)
	}
	if failed && ts.failed != nil {
		ts.failed[t.Key] = time.Now()
	}
	ts.mu.Unlock()
	if ts.Changed != nil {
		ts.Changed()
	}
}

// Take removes standby t from the set for one sandbox to become. It
// reports false when t is no longer in the set (evicted, or taken by
// another Create). The caller persists the set's membership (Changed) and
// starts the next standby (Prewarm) once the sandbox is in its own table,
// so that a worker dying in between still finds the process in one of the
// two tables.
func (ts *Set) Take(t *Template) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ok := ts.byKey[t.Key] == t && !t.stopping.Load()
	if ok {
		delete(ts.byKey, t.Key)
	}
	return ok
}

// Evict stops t: its end is no failure.
func (ts *Set) Evict(t *Template) {
	t.stopping.Store(true)
	ts.Stop(t)
}

// evictLocked picks the templates to stop to make room for more new ones:
// the expired (expireLocked), then those of lowest Greedy-Dual priority
// beyond Max.
func (ts *Set) evictLocked(now time.Time, more int) []*Template {
	out, live := ts.expireLocked(now)
	n := len(ts.byKey) + more - ts.Max
	if n <= 0 || len(live) == 0 {
		return out
	}
	cands := make([]keepalive.Candidate, len(live))
	for i, t := range live {
		cands[i] = keepalive.Candidate{Key: t.Key.String(), MemoryMB: max(runtime.CeilMB(ts.bytes(t)), 1), LastUsed: time.Unix(0, t.lastUse.Load()),
			ColdStart: time.Duration(t.load.Load())}
	}
	for _, i := range ts.gd.EvictN(cands, n) {
		ts.dropLocked(live[i])
		out = append(out, live[i])
	}
	return out
}

// expireLocked drops the templates unused for longer than their
// keep-alive and returns them, and the others that may be evicted (a
// template with live children is neither when KeepWhileChildren).
func (ts *Set) expireLocked(now time.Time) (expired, live []*Template) {
	for _, t := range ts.byKey {
		switch {
		case ts.KeepWhileChildren && t.children.Load() > 0:
		case now.Sub(time.Unix(0, t.lastUse.Load())) > t.idle:
			ts.dropLocked(t)
			expired = append(expired, t)
		default:
			live = append(live, t)
		}
	}
	return expired, live
}

// dropLocked takes t out of the set and the eviction policy's memory.
func (ts *Set) dropLocked(t *Template) {
	delete(ts.byKey, t.Key)
	ts.gd.Forget(t.Key.String())
}

// sweep stops templates unused for longer than their keep-alive, every
// sweepEvery, until stop closes.
func (ts *Set) sweep(stop chan struct{}) {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		ts.mu.Lock()
		expired, _ := ts.expireLocked(time.Now())
		ts.mu.Unlock()
		for _, t := range expired {
			ts.Evict(t)
		}
		if len(expired) > 0 && ts.Changed != nil {
			ts.Changed()
		}
	}
}

// bytes is what t holds: its cgroup's usage where Of gives one, else its
// process's RSS (0 without Of).
func (ts *Set) bytes(t *Template) int64 {
	if ts.Of == nil {
		return 0
	}
	cg, pid := ts.Of(t)
	if cg != nil {
		if n, ok := cg.MemoryUsage(); ok {
			return n
		}
	}
	if pid > 0 {
		if n, err := procs.RSS(pid); err == nil {
			return n
		}
	}
	return 0
}

// All returns the set's templates.
func (ts *Set) All() []*Template {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Collect(maps.Values(ts.byKey))
}

// Held lists the functions (name, revision) whose template is loaded and
// ready: a sandbox of one forks in milliseconds here (the node reports
// them, for placement to prefer it).
func (ts *Set) Held() []runtime.HeldTemplate {
	if ts == nil {
		return nil
	}
	var out []runtime.HeldTemplate
	for _, t := range ts.All() {
		if !t.usable() || t.Stopping() {
			continue
		}
		h := runtime.HeldTemplate{Function: t.Key.Function, Revision: t.Key.Revision}
		if !slices.Contains(out, h) { // a secret's new value: two of one revision
			out = append(out, h)
		}
	}
	slices.SortFunc(out, func(a, b runtime.HeldTemplate) int {
		return cmp.Or(strings.Compare(a.Function, b.Function), cmp.Compare(a.Revision, b.Revision))
	})
	return out
}

// MemoryMB is what the set's templates hold, in MiB rounded up: each
// one's cgroup usage where Of gives a cgroup, else its process's RSS.
func (ts *Set) MemoryMB() int64 {
	if ts == nil || ts.Of == nil {
		return 0
	}
	var b int64
	for _, t := range ts.All() {
		b += ts.bytes(t)
	}
	return runtime.CeilMB(b)
}

// Count is how many templates the set holds.
func (ts *Set) Count() int {
	if ts == nil {
		return 0
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.byKey)
}

// StopAll stops every template and waits (up to wait each) for their end;
// the set starts none after it.
func (ts *Set) StopAll(wait time.Duration) {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	ts.stopped = true
	all := slices.Collect(maps.Values(ts.byKey))
	clear(ts.byKey)
	if ts.stop != nil {
		close(ts.stop)
		ts.stop = nil
	}
	ts.mu.Unlock()
	for _, t := range all {
		ts.Evict(t)
	}
	for _, t := range all {
		select {
		case <-t.Done():
		case <-time.After(wait):
		}
	}
	if ts.Changed != nil {
		ts.Changed()
	}
}

// ErrNotReady is returned by runtimes asked to fork from a template that
// is gone.
var ErrNotReady = errors.New("template not ready")

// ErrBecameSandbox ends a standby's Client once its process serves as a
// sandbox.
var ErrBecameSandbox = errors.New("the standby became a sandbox")

package process

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/internal/worker/runtime/statefile"
)

// Config configures the process runtime. Only StateDir is required.
type Config struct {
	// StateDir holds the sandbox table (sandboxes.json) and the sandboxes'
	// output in logs/<function>/<sandbox-id>.log. A worker restarted on
	// the same StateDir finds the sandboxes its predecessor left running.
	// Two live Runtimes must not share one.
	StateDir string
	// BriskBinary is run as "<BriskBinary> __trace" for the builtin trace
	// function. Default: brisk-trace beside this executable when it is
	// there (it starts faster), otherwise this executable.
	BriskBinary string
	// KillGrace is how long Kill waits after SIGTERM before SIGKILL.
	// Default: DefaultKillGrace.
	KillGrace time.Duration
	// CgroupRoot is where the cgroup file systems are mounted. Empty means
	// DefaultCgroupRoot when running as root and no cgroups otherwise. When
	// set explicitly it must hold a usable hierarchy (v2, or v1 with a cpu
	// or memory controller); New fails otherwise.
	CgroupRoot string
	// DisableCgroups runs sandboxes without cgroups even as root.
	DisableCgroups bool
	// User is who sandboxes run as: a user name, a uid, or uid:gid (each
	// part a name or a number). Empty means DefaultUser (nobody) when the
	// worker runs as root and the worker's own user otherwise; only root
	// can name another user. Sandboxes never keep supplementary groups and
	// always run with no_new_privs.
	User string
	// Logger receives debug records of sandbox starts and exits and
	// warnings about missing cgroup controllers. Default: discard.
	Logger *slog.Logger
	// NoTemplates starts every sandbox fresh; by default those of
	// functions deployed from Python source are forked from a template
	// (template.go). MaxTemplates bounds them (DefaultMaxTemplates when 0).
	NoTemplates  bool
	MaxTemplates int
	// ListenHost is the address sandboxes listen on and data planes dial:
	// a host address of this machine. Default 127.0.0.1: sandboxes share
	// the host's network and take no tokens, so only a data plane on this
	// machine reaches them. A cluster whose data planes run elsewhere
	// gives an address of a network only they reach (docs/runtimes.md).
	ListenHost string
	// NoLoopbackGuard leaves out the loopback guard (guard.go) that keeps
	// one function's sandboxes from connecting to another's on this host
	// when sandboxes run as per-function users.
	NoLoopbackGuard bool
	// TmpfsMB bounds each sandbox's private /tmp, /var/tmp and /dev/shm
	// (as root: privateTmp). Default 64, as the native runtime's.
	TmpfsMB int
}

// DefaultListenHost is where sandboxes listen when Config.ListenHost is
// empty.
const DefaultListenHost = "127.0.0.1"

// DefaultKillGrace is the SIGTERM-to-SIGKILL grace when Config.KillGrace is 0.
const DefaultKillGrace = time.Second

// DefaultCgroupRoot is where cgroup file systems are mounted on every
// mainstream distribution: cgroups.DefaultRoot.
const DefaultCgroupRoot = cgroups.DefaultRoot

// TraceSubcommand is the hidden brisk subcommand that serves the builtin
// trace function (see tracefn.FromEnv for its environment).
const TraceSubcommand = tracefn.Subcommand

// Errors wrapped by Instance.ExitErr: the runtime package's, shared by
// every runtime.
var (
	ErrOOMKilled = runtime.ErrOOMKilled
	ErrKilled    = runtime.ErrKilled
)

const (
	// sigkillTimeout bounds the wait after SIGKILL, so that a process stuck
	// in the kernel (uninterruptible I/O) cannot block Kill forever when
	// its ctx has no deadline. Kill then fails and can be retried.
	sigkillTimeout = 5 * time.Second
	// pollInterval paces waits on processes this Runtime cannot wait(2)
	// for: those a previous worker started.
	pollInterval = 5 * time.Millisecond
)

// Runtime runs sandboxes as host processes. It is safe for concurrent use.
type Runtime struct {
	cfg       Config
	traceArgv []string // how the builtin trace function is run
	log       *slog.Logger
	cg        *cgroups.Hierarchy // nil: no cgroups
	id        identity           // who sandboxes run as without users
	users     *users             // per-function users (users.go); nil: every sandbox is id
	guard     *guard             // the loopback guard (guard.go); nil without users
	// noClone3 is set once clone3 turned out to be unavailable (seccomp
	// filters in older container runtimes), after which v2 sandboxes join
	// their cgroup just after they start.
	noClone3 atomic.Bool
	// secretsNS says secrets are mounted in a mount namespace of the
	// sandbox's (root); otherwise they are files under StateDir
	// (secrets.go).
	secretsNS   bool
	secretsWarn sync.Once

	// persistMu serialises table writes and is taken before mu, so each
	// write snapshots a table at least as new as the previous write's.
	persistMu sync.Mutex
	table     *statefile.File // the sandbox table
	mu        sync.Mutex
	sandboxes map[string]*sandbox
	creating  map[string]struct{} // ids reserved by a Create in progress
	// ports are the loopback ports of the sandboxes in the table and of
	// Creates in progress: a port the kernel hands out again before its
	// sandbox has bound it is not given to a second sandbox.
	ports map[int]struct{}
	tpls  *forkserver.Set // nil with Config.NoTemplates (template.go)
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Watcher = (*Runtime)(nil)
)

type sandbox struct {
	rec   record
	cg    *cgroups.Cgroup // nil without a cgroup
	memMB int64           // the memory limit, for the OOM message

	// exited is closed once this Runtime has reaped the process; exitErr
	// is written before. Both are nil for a sandbox found in the table at
	// startup, which is not this process's child and cannot be waited for.
	exited   chan struct{}
	exitErr  error
	stopping atomic.Bool // Kill has begun; the exit is not a crash

	// gone is closed once the process of a sandbox found in the table has
	// ended (watchAdopted); nil until Watch is first called for it.
	watchOnce sync.Once
	gone      chan struct{}

	// tpl is the template the sandbox was forked from, nil for one started
	// fresh (template.go).
	tpl         *forkserver.Template
	tplExitOnce sync.Once // tplExitErr, once the child has ended
	tplExitErr  error
	// lock serialises Kill and List's cleanup of this sandbox. It is a
	// channel so that waiting for it honours ctx.
	lock chan struct{}
}

func (sb *sandbox) owned() bool { return sb.exited != nil }

// running reports whether the sandbox's main process still runs.
func (sb *sandbox) running() bool {
	if sb.owned() {
		select {
		case <-sb.exited:
			return false
		default:
			return true
		}
	}
	return procs.Alive(sb.rec.PID, sb.rec.StartTime)
}

// New returns a process runtime and loads the sandbox table left in
// StateDir by an earlier worker. It starts no processes or goroutines.
func New(cfg Config) (*Runtime, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("process runtime: StateDir is required")
	}
	if cfg.KillGrace < 0 {
		return nil, fmt.Errorf("process runtime: KillGrace %v must not be negative", cfg.KillGrace)
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	cfg.ListenHost = cmp.Or(cfg.ListenHost, DefaultListenHost)
	cfg.TmpfsMB = cmp.Or(cfg.TmpfsMB, defaultTmpfsMB)
	if ip := net.ParseIP(cfg.ListenHost); ip == nil || ip.IsUnspecified() || ip.IsMulticast() {
		return nil, fmt.Errorf("process runtime: ListenHost %q: want one IP address of this host (data planes dial it)", cfg.ListenHost)
	}
	traceArgv := []string{cfg.BriskBinary, TraceSubcommand}
	if cfg.BriskBinary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("process runtime: BriskBinary: %w", err)
		}
		traceArgv = tracefn.Command(exe)
	}
	id, err := resolveUser(cfg.User, os.Geteuid())
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	r := &Runtime{
		id:        id,
		cfg:       cfg,
		traceArgv: traceArgv,
		log:       cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		sandboxes: map[string]*sandbox{},
		creating:  map[string]struct{}{},
		ports:     map[int]struct{}{},
		secretsNS: os.Geteuid() == 0,
	}
	// Logs are the worker's: sandboxes write theirs through the file the
	// worker opened, and read none.
	logs := filepath.Join(cfg.StateDir, "logs")
	if err := os.MkdirAll(logs, 0o700); err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	if err := os.Chmod(logs, 0o700); err != nil { // made 0755 before sandboxes ran as another user
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	if id.cred != nil && id.uid == 0 {
		r.log.Warn("sandboxes run as root (--sandbox-user)", "user", cfg.User)
	}
	if !cfg.DisableCgroups {
		root := cfg.CgroupRoot
		if root == "" && os.Geteuid() == 0 {
			root = DefaultCgroupRoot
		}
		if root != "" {
			cg, err := cgroups.Detect(root, r.log.Warn)
			switch {
			case err != nil && cfg.CgroupRoot != "":
				return nil, fmt.Errorf("process runtime: CgroupRoot %q: %w", root, err)
			case err != nil:
				r.log.Warn("no usable cgroups; sandboxes run without limits", "err", err)
			default:
				r.cg = cg
			}
		}
	}
	if cfg.User == "" && os.Geteuid() == 0 {
		if r.users, err = openUsers(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("process runtime: %w", err)
		}
	}
	table, recs, err := readTable(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	r.table = table
	if !cfg.NoTemplates {
		ts, err := openTemplates(r, cmp.Or(cfg.MaxTemplates, DefaultMaxTemplates))
		if err != nil {
			return nil, fmt.Errorf("process runtime: templates: %w", err)
		}
		r.tpls = ts.Set
	}
	if err := reapSecrets(cfg.StateDir, recs); err != nil {
		return nil, fmt.Errorf("process runtime: %w", err)
	}
	if r.users != nil && !cfg.NoLoopbackGuard {
		var entries []guardEntry
		for _, rec := range recs {
			if rec.UID != 0 {
				entries = append(entries, entryOf(rec))
			}
		}
		r.guard = newGuard(cfg.StateDir)
		if err := r.guard.reset(entries); err != nil {
			r.guard = nil
			r.log.Warn("no loopback guard: a sandbox can connect to another function's sandbox on this host past the data plane", "err", err)
		}
	}
	// Entries whose process has gone stay until List has reported them,
	// so that a restarted worker learns which sandboxes died meanwhile.
	for _, rec := range recs {
		sb := &sandbox{rec: rec, lock: make(chan struct{}, 1)}
		if rec.Cgroup != "" && r.cg != nil {
			sb.cg = r.cg.Open(rec.Cgroup)
		}
		r.sandboxes[rec.ID] = sb
		r.ports[portOf(rec.Addr)] = struct{}{}
		// Its output waits in its pipe: drain it again (a gone
		// sandbox's pipe is removed).
		if err := logpipe.Adopt(r.logPath(rec.Function, rec.ID), logpipe.Default, r.log); err != nil {
			r.log.Warn("cannot drain an adopted sandbox's output", "sandbox", rec.ID, "err", err)
		}
	}
	return r, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "process" }

// CanMount implements runtime.Mounter: as root, a sandbox gets a mount
// namespace of its own, with Spec.Mounts bound in it (secrets.go).
func (r *Runtime) CanMount() bool { return r.secretsNS }

// Create starts the sandbox's process and returns once it runs; the caller
// probes readiness (runtime.WaitReady with Instance.Exited). A command that
// exits at once still yields an Instance, whose Exited then closes; only a
// failure to start the process is an error, and it leaves nothing behind.
func (r *Runtime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	argv, err := r.argv(s)
	if err != nil {
		return nil, err
	}
	if err := runtime.CheckSecrets(s.Function); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	r.mu.Lock()
	_, exists := r.sandboxes[s.ID]
	_, starting := r.creating[s.ID]
	if !exists && !starting {
		r.creating[s.ID] = struct{}{}
	}
	r.mu.Unlock()
	if exists || starting {
		return nil, fmt.Errorf("sandbox %s: already exists", s.ID)
	}
	defer func() {
		r.mu.Lock()
		delete(r.creating, s.ID)
		r.mu.Unlock()
	}()

	if t := r.tpls.Get(s); t != nil {
		from := r.createFromTemplate
		if forkserver.IsStandby(s) {
			from = r.createFromStandby
		}
		inst, err := from(ctx, s, t)
		if err == nil {
			r.log.Debug("sandbox forked from its template", "sandbox", s.ID, "template", procOf(t).id)
			return inst, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
		}
		r.log.Warn("a sandbox could not start from its template; starting it fresh", "sandbox", s.ID, "template", procOf(t).id, "err", err)
	}
	port, addr, err := r.reserveAddr()
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	created := false
	defer func() {
		if !created {
			r.releasePort(port)
		}
	}()
	id, err := r.identityOf(s.Function)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	logPath := r.logPath(s.Function.Name, s.ID)
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	defer logf.Close() // the child has its own copy once started
	sb := &sandbox{
		rec:    record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision, Addr: addr},
		memMB:  s.Function.SandboxLimits().MemoryMB,
		exited: make(chan struct{}),
		lock:   make(chan struct{}, 1),
	}
	if r.cg != nil {
		if sb.cg, err = r.cg.Create(s.ID, s.Function.SandboxLimits()); err != nil {
			_ = os.Remove(logPath)
			return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
		}
		sb.rec.Cgroup = sb.cg.Rel()
	}
	secretsDir := ""
	if len(s.Function.Secrets) > 0 && !r.secretsNS {
		if secretsDir, err = r.writeSecretsDir(s.ID, s.Function); err != nil {
			if sb.cg != nil {
				_ = sb.cg.RemoveNow()
			}
			_ = os.Remove(logPath)
			return nil, fmt.Errorf("sandbox %s: secrets: %w", s.ID, err)
		}
		sb.rec.Secrets = true
		defer func() {
			if !created {
				if err := runtime.RemoveSecretsDir(secretsDir); err != nil {
					r.log.Warn("cleaning up a failed create", "sandbox", s.ID, "err", err)
				}
			}
		}()
	}
	env := r.sandboxEnv(s, port, secretsDir)
	if len(s.Function.Command) > 0 {
		argv = runtime.ExpandArgs(argv, env) // $PORT without a shell
	}
	if err := r.guardSandbox(sb, id, port); err != nil {
		if sb.cg != nil {
			_ = sb.cg.RemoveNow()
		}
		_ = os.Remove(logPath)
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	defer func() {
		if !created {
			_ = r.guard.forget(entryOf(sb.rec))
		}
	}()
	cmd, err := r.start(s, id, argv, env, logf, sb.cg)
	if err != nil {
		if sb.cg != nil {
			_ = sb.cg.RemoveNow() // empty: nothing ever ran in it
		}
		_ = os.Remove(logPath)
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	sb.rec.PID, sb.rec.PGID = cmd.Process.Pid, cmd.Process.Pid // Setpgid: the leader's pid names the group
	// The process cannot have been reaped yet (only the goroutine below
	// waits for it), so its /proc entry exists even if it already exited.
	_, sb.rec.StartTime, err = procs.Stat(sb.rec.PID)
	go r.wait(sb, cmd)
	if err == nil {
		r.mu.Lock()
		r.sandboxes[s.ID] = sb
		r.mu.Unlock()
		err = r.persist()
	}
	if err != nil {
		// Without a table entry a restarted worker could not find this
		// process again, so the sandbox must not outlive the failure.
		sb.stopping.Store(true)
		r.signal(sb, syscall.SIGKILL)
		// Clean up even if the caller's ctx has ended meanwhile.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sigkillTimeout)
		r.waitExit(cctx, sb, sigkillTimeout)
		if sb.cg != nil {
			_ = sb.cg.Remove(cctx)
		}
		cancel()
		r.mu.Lock()
		delete(r.sandboxes, s.ID)
		r.mu.Unlock()
		_ = r.persist()
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	created = true
	r.log.Debug("sandbox started", "sandbox", s.ID, "function", s.Function.Name, "pid", sb.rec.PID, "addr", addr)
	return &runtime.Instance{ID: s.ID, Addr: addr, Exited: sb.exited, ExitErr: sb.ownExitErr}, nil
}

// ownExitErr is why a sandbox this Runtime started ended, nil while it runs.
func (sb *sandbox) ownExitErr() error {
	select {
	case <-sb.exited:
		return sb.exitErr
	default:
		return nil
	}
}

// argv resolves what to execute for s.
func (r *Runtime) argv(s runtime.Spec) ([]string, error) {
	f := s.Function
	switch {
	case !runtime.ValidName(s.ID):
		return nil, fmt.Errorf("sandbox %q: id must be 1-128 letters, digits, '.', '_' or '-', not starting with '.'", s.ID)
	case f == nil:
		return nil, fmt.Errorf("sandbox %s: no function spec", s.ID)
	case !runtime.ValidName(f.Name):
		return nil, fmt.Errorf("sandbox %s: function name %q is not a valid file name", s.ID, f.Name)
	case len(f.Command) > 0:
		return f.Command, nil
	case f.Builtin == "trace", f.Builtin == tracefn.Watchdog:
		return r.traceArgv, nil // the same binary; BRISK_BUILTIN picks the watchdog
	case f.Builtin != "":
		return nil, fmt.Errorf("sandbox %s: builtin %q: %w", s.ID, f.Builtin, errors.ErrUnsupported)
	case f.Image != "":
		return nil, fmt.Errorf("sandbox %s: the process runtime cannot run image %q: %w", s.ID, f.Image, errors.ErrUnsupported)
	}
	return nil, fmt.Errorf("sandbox %s: function %s has neither command nor builtin", s.ID, f.Name)
}

// start starts argv as id (its function's user: identityOf), with
// no_new_privs, in its own process group, in / with env and, when cg is
// set, in its cgroup from its first
// instruction on: on v2 the child is cloned straight into the cgroup
// (clone3 CLONE_INTO_CGROUP); on v1 it is forked by a thread that has
// joined the cgroup first. Only on v2 without clone3 (seccomp filters of
// older container runtimes) is it moved there right after it started: in
// that window of well under a millisecond it runs in the worker's cgroup,
// and a child it forks then stays there.
func (r *Runtime) start(s runtime.Spec, id identity, argv, env []string, logf *os.File, cg *cgroups.Cgroup, extra ...*os.File) (cmd *exec.Cmd, err error) {
	var exe *os.File
	if s.Function.Builtin != "" && len(s.Function.Command) == 0 {
		// brisk's own binary may sit where the sandbox's user cannot reach
		// it (a 0700 home or temporary directory): it is opened here and
		// executed through the descriptor, which needs only that the file
		// itself be executable.
		if exe, err = os.Open(argv[0]); err != nil {
			return nil, err
		}
		defer exe.Close()
	} else if argv, err = resolveCommand(argv, env); err != nil {
		return nil, err
	}
	privTmp := r.secretsNS && !namesHostTmp(argv)
	procs.SpawnThread(func() {
		if r.secretsNS && (privTmp || len(s.Function.Secrets) > 0 || len(s.Mounts) > 0) {
			// The thread's own mount namespace, which the child inherits
			// (secrets.go): the function's secrets, its code and its own
			// temporary directories.
			if len(s.Function.Secrets) > 0 {
				err = mountSecrets(s.Function)
			} else if err = ownMountNS(); err != nil {
				err = &secretsError{err}
			}
			if err == nil && len(s.Mounts) > 0 {
				err = bindMounts(s.Mounts) // their sources may be in the host's /tmp
			}
			if err == nil && privTmp {
				err = privateTmp(r.cfg.TmpfsMB)
			}
			if err != nil {
				return
			}
		} else if len(s.Mounts) > 0 {
			err = &secretsError{errors.New("mounts need root")}
			return
		}
		cmd, err = r.startOnThread(id, argv, env, logf, exe, cg, extra)
	})
	if _, ok := err.(*secretsError); ok {
		return nil, err // not the command's fault: no explainStart
	}
	if err != nil {
		return nil, explainStart(id, argv[0], err)
	}
	return cmd, nil
}

// startOnThread is start on a thread of its own (procs.SpawnThread).
func (r *Runtime) startOnThread(id identity, argv, env []string, logf, exe *os.File, cg *cgroups.Cgroup, extra []*os.File) (*exec.Cmd, error) {
	if err := procs.SetNoNewPrivs(); err != nil {
		return nil, err
	}
	newCmd := func(attr *syscall.SysProcAttr) *exec.Cmd {
		cmd := exec.Command(argv[0], argv[1:]...)
		if exe != nil {
			cmd.Path, cmd.ExtraFiles = "/proc/self/fd/3", []*os.File{exe}
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, extra...)
		cmd.Env, cmd.Dir = env, sandboxHome
		cmd.Stdout, cmd.Stderr = logf, logf
		attr.Setpgid, attr.Credential = true, id.cred
		cmd.SysProcAttr = attr
		return cmd
	}
	switch {
	case cg == nil:
		cmd := newCmd(&syscall.SysProcAttr{})
		return cmd, cmd.Start()
	case !r.cg.V2():
		leave, err := cg.JoinThread()
		if err != nil {
			return nil, err
		}
		cmd := newCmd(&syscall.SysProcAttr{})
		err = cmd.Start()
		if lerr := leave(); lerr != nil {
			// This thread ends with the caller's goroutine anyway.
			r.log.Warn("cannot move the forking thread out of the sandbox's cgroup", "cgroup", cg.Rel(), "err", lerr)
		}
		return cmd, err
	case !r.noClone3.Load():
		fd, err := cg.OpenDir()
		if err != nil {
			return nil, err
		}
		defer syscall.Close(fd)
		cmd := newCmd(&syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd})
		err = cmd.Start()
		if !errors.Is(err, syscall.ENOSYS) {
			return cmd, err
		}
		r.noClone3.Store(true)
		r.log.Warn("clone3 unavailable; sandboxes join their cgroup just after start", "err", err)
	}
	cmd := newCmd(&syscall.SysProcAttr{})
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := cg.AddProc(cmd.Process.Pid); err != nil {
		// A process that already exited cannot be moved (ESRCH); it is a
		// crash the caller sees through Exited, not a failed start.
		if state, _, serr := procs.Stat(cmd.Process.Pid); serr == nil && state == 'Z' {
			return cmd, nil
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, err
	}
	return cmd, nil
}

// wait reaps the process, so that no sandbox ever lingers as a zombie, and
// records why it ended.
func (r *Runtime) wait(sb *sandbox, cmd *exec.Cmd) {
	err := cmd.Wait()
	sb.exitErr = r.describeExit(sb, err)
	close(sb.exited)
	if !sb.stopping.Load() {
		r.log.Debug("sandbox exited", "sandbox", sb.rec.ID, "function", sb.rec.Function, "err", sb.exitErr)
	}
}

func (r *Runtime) describeExit(sb *sandbox, waitErr error) error {
	status, sig, ok := runtime.WaitStatus(waitErr)
	if !ok {
		status = waitErr.Error()
	}
	sigkill := sig == syscall.SIGKILL
	var oom int64
	if sb.cg != nil && !sb.stopping.Load() {
		if n, exact := sb.cg.OOMKills(); n > 0 && (exact || sigkill) {
			if sigkill {
				return fmt.Errorf("%w (memory limit %d MiB)", ErrOOMKilled, sb.memMB)
			}
			oom = n
		}
	}
	return runtime.Ended(status, sb.stopping.Load(), oom, sb.memMB)
}

// Kill stops the sandbox: SIGTERM to its process group, SIGKILL to the group
// (and to its cgroup) once KillGrace has passed or the process has exited,
// then removes its cgroup and its table entry. It works on sandboxes an
// earlier worker started too. If ctx ends first, the group is SIGKILLed and
// Kill returns ctx's error with the entry kept, so a later Kill can finish.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	sb, unlock, err := runtime.LockEntry(ctx, &r.mu, r.sandboxes, id, func(sb *sandbox) chan struct{} { return sb.lock })
	if err != nil {
		return err
	}
	defer unlock()
	if err := r.stop(ctx, sb); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	if sb.cg != nil {
		if err := sb.cg.Remove(ctx); err != nil {
			return fmt.Errorf("kill sandbox %s: %w", id, err)
		}
	}
	if sb.rec.Secrets {
		if err := runtime.RemoveSecretsDir(r.secretsDir(id)); err != nil {
			return fmt.Errorf("kill sandbox %s: %w", id, err)
		}
	}
	r.mu.Lock()
	delete(r.sandboxes, id)
	delete(r.ports, portOf(sb.rec.Addr))
	r.mu.Unlock()
	if err := r.guard.forget(entryOf(sb.rec)); err != nil {
		r.log.Warn("loopback guard: forgetting a killed sandbox's port", "sandbox", id, "err", err)
	}
	r.log.Debug("sandbox killed", "sandbox", id)
	return r.persist()
}

// stop ends the sandbox's processes.
func (r *Runtime) stop(ctx context.Context, sb *sandbox) error {
	sb.stopping.Store(true)
	if !sb.owned() && !sb.running() {
		// The pid (and so the group id) may name an unrelated process by
		// now; only the cgroup still reliably holds what is left.
		if sb.cg != nil {
			sb.cg.Kill()
		}
		return nil
	}
	r.signal(sb, syscall.SIGTERM)
	if !r.waitExit(ctx, sb, r.cfg.KillGrace) && ctx.Err() != nil {
		r.signal(sb, syscall.SIGKILL)
		return ctx.Err()
	}
	// Even after a clean exit: children the leader left behind.
	r.signal(sb, syscall.SIGKILL)
	if !r.waitExit(ctx, sb, sigkillTimeout) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("process %d still runs %v after SIGKILL", sb.rec.PID, sigkillTimeout)
	}
	return nil
}

// signal sends sig to the sandbox's process group and, for SIGKILL, to
// everything in its cgroup, which catches processes that left the group.
func (r *Runtime) signal(sb *sandbox, sig syscall.Signal) {
	_ = syscall.Kill(-sb.rec.PGID, sig) // ESRCH: the group is already empty
	if sig == syscall.SIGKILL && sb.cg != nil {
		sb.cg.Kill()
	}
}

// waitExit waits up to d for the sandbox's main process to end and reports
// whether it did.
func (r *Runtime) waitExit(ctx context.Context, sb *sandbox, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	if sb.owned() {
		select {
		case <-sb.exited:
			return true
		case <-timer.C:
		case <-ctx.Done():
		}
		return false
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for sb.running() {
		select {
		case <-tick.C:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// List returns every sandbox in the table, sorted by id, including those an
// earlier worker started (Watch watches those too). A sandbox whose process has ended is reported
// once with Running false and then dropped, after its cgroup is removed;
// Kill on it later returns ErrNotFound.
func (r *Runtime) List(ctx context.Context) ([]runtime.Listed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	sbs := slices.Collect(maps.Values(r.sandboxes))
	r.mu.Unlock()
	slices.SortFunc(sbs, func(a, b *sandbox) int { return cmp.Compare(a.rec.ID, b.rec.ID) })

	out := make([]runtime.Listed, 0, len(sbs))
	dropped := false
	for _, sb := range sbs {
		running := sb.running()
		out = append(out, runtime.Listed{
			ID: sb.rec.ID, Function: sb.rec.Function, Revision: sb.rec.Revision, Addr: sb.rec.Addr, Running: running,
		})
		if !running && r.maybeDrop(ctx, sb) {
			dropped = true
		}
	}
	if dropped {
		if err := r.persist(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// maybeDrop removes an ended sandbox from the table unless a Kill is busy
// with it, and reports whether it did. A cgroup that cannot be removed yet
// keeps the entry, so a later List or Kill retries.
func (r *Runtime) maybeDrop(ctx context.Context, sb *sandbox) bool {
	select {
	case sb.lock <- struct{}{}:
	default:
		return false
	}
	defer func() { <-sb.lock }()
	if sb.owned() {
		// Only our own, just-reaped leader's group id is safe to signal.
		_ = syscall.Kill(-sb.rec.PGID, syscall.SIGKILL)
	}
	if sb.cg != nil {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		err := sb.cg.Remove(ctx)
		cancel()
		if err != nil {
			r.log.Warn("cannot remove cgroup of ended sandbox yet", "sandbox", sb.rec.ID, "err", err)
			return false
		}
	}
	if sb.rec.Secrets {
		if err := runtime.RemoveSecretsDir(r.secretsDir(sb.rec.ID)); err != nil {
			r.log.Warn("cannot remove the secrets of an ended sandbox yet", "sandbox", sb.rec.ID, "err", err)
			return false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sandboxes[sb.rec.ID] != sb {
		return false
	}
	delete(r.sandboxes, sb.rec.ID)
	delete(r.ports, portOf(sb.rec.Addr))
	if err := r.guard.forget(entryOf(sb.rec)); err != nil {
		r.log.Warn("loopback guard: forgetting an ended sandbox's port", "sandbox", sb.rec.ID, "err", err)
	}
	return true
}

// persist writes the whole table; see persistMu.
func (r *Runtime) persist() error {
	r.persistMu.Lock()
	defer r.persistMu.Unlock()
	r.mu.Lock()
	recs := make([]record, 0, len(r.sandboxes))
	for _, sb := range r.sandboxes {
		recs = append(recs, sb.rec)
	}
	r.mu.Unlock()
	slices.SortFunc(recs, func(a, b record) int { return cmp.Compare(a.ID, b.ID) })
	return writeTable(r.table, recs)
}

// reservePort returns a free port on the listen host no sandbox of this
// runtime holds.
func (r *Runtime) reservePort() (int, error) {
	for range 64 {
		port, err := freePort(r.cfg.ListenHost)
		if err != nil {
			return 0, err
		}
		r.mu.Lock()
		_, taken := r.ports[port]
		if !taken {
			r.ports[port] = struct{}{}
		}
		r.mu.Unlock()
		if !taken {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port on %s after 64 tries", r.cfg.ListenHost)
}

// reserveAddr reserves a port for a sandbox (reservePort) and returns its
// address too; releasePort gives it back.
func (r *Runtime) reserveAddr() (int, string, error) {
	port, err := r.reservePort()
	return port, net.JoinHostPort(r.cfg.ListenHost, strconv.Itoa(port)), err
}

func (r *Runtime) releasePort(port int) {
	r.mu.Lock()
	delete(r.ports, port)
	r.mu.Unlock()
}

// portOf is the port of a host:port address, 0 if it has none.
func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// freePort asks the kernel for a free port on host. The port is free only
// until the sandbox binds it; another process could take it first, which
// WaitReady cannot tell from the sandbox itself.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

// logPath is where sandbox (or template) id of function fn writes.
func (r *Runtime) logPath(fn, id string) string {
	return filepath.Join(r.cfg.StateDir, "logs", fn, id+".log")
}

// LogDir is where the sandboxes' output is kept: LogDir/FUNCTION/ID.log
// (worker.LogKeeper).
func (r *Runtime) LogDir() string { return filepath.Join(r.cfg.StateDir, "logs") }

package native

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/internal/worker/runtime/statefile"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config configures the native runtime. StateDir and Pool are required.
type Config struct {
	// StateDir holds the sandbox table (sandboxes.json), the unpacked
	// images (images/), the sandboxes' output (logs/<function>/<id>.log)
	// and the staging directory the sandboxes mount their root on. A
	// worker restarted on the same StateDir adopts the sandboxes its
	// predecessor left running. Two live Runtimes must not share one.
	StateDir string
	// Pool hands out network namespaces. The caller starts it (after New,
	// which adopts namespaces) and closes it.
	Pool *netpool.Pool
	// Shells is how many parked shells the runtime keeps ready. Default
	// DefaultShells; a Create finding none makes one on the spot.
	Shells int
	// InitArgv runs the sandboxes' init. Default: brisk-sandbox-init next
	// to this executable, else this executable (built with cgo, as it
	// then links the init), either with nsinit.Subcommand.
	InitArgv []string
	// BriskBinary serves the builtin trace function (tracefn.Command).
	// Default: this executable.
	BriskBinary string
	// CgroupRoot is where the cgroup file systems are mounted. Default
	// cgroups.DefaultRoot.
	CgroupRoot string
	// User runs sandboxes that do not run an image or whose image names
	// no user: uid or uid:gid. Default 65534:65534 (nobody).
	User string
	// TmpfsMB bounds each sandbox's writable layer. Default 64.
	TmpfsMB int
	// KillGrace is how long Kill waits after SIGTERM (when the function
	// handles it) before SIGKILL. Default DefaultKillGrace.
	KillGrace time.Duration
	// Logger receives sandbox starts, exits and adoption. Default: discard.
	Logger *slog.Logger
	// NoTemplates starts every sandbox fresh; by default those of
	// functions deployed from Python source are forked from a template
	// (template.go). MaxTemplates bounds them (16 when 0).
	NoTemplates  bool
	MaxTemplates int
}

// Defaults.
const (
	DefaultShells    = 16
	DefaultKillGrace = time.Second
	defaultTmpfsMB   = 64
	nobody           = 65534
)

// Runtime runs each sandbox as a process tree in its own mount, PID, UTS,
// IPC and network namespaces and cgroup, started by binding a parked shell.
// It is safe for concurrent use.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	cg       *cgroups.Hierarchy
	images   *imageStore
	initArgv []string
	trace    []string // argv of the builtin trace function
	seccomp  []byte   // the compiled profile, as nsinit.Bind carries it
	// tplSeccomp is the templates' (template.go); tpls their set, nil
	// with Config.NoTemplates.
	tplSeccomp []byte
	tpls       *forkserver.Set
	caps       []int
	uid, gid   uint32
	staging    string
	prefix     string // cgroup names of this StateDir's shells: native-<hash>-
	seq        atomic.Uint64

	ready chan *shell // parked shells
	// spareCgroups are emptied shell cgroups kept for new shells
	// (recycleCgroup).
	spareCgroups chan spareCgroup
	unbound      sync.Map // names of shells being made or parked and of spare cgroups (tests' leak checks)
	refill       chan struct{}
	dirty        chan struct{} // the table has changed
	bg           context.Context
	stop         context.CancelFunc
	wg           sync.WaitGroup
	started      atomic.Bool
	closed       atomic.Bool
	persistM     sync.Mutex
	table        *statefile.File // the sandbox table, read and set by adopt

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	creating  map[string]struct{}
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Watcher = (*Runtime)(nil)
)

// sandbox is a bound shell.
type sandbox struct {
	rec      record
	sh       *shell
	memMB    int64
	stopping atomic.Bool
	lock     chan struct{} // serialises teardown; a channel so waiting honours ctx
	// gone is closed when an adopted sandbox (no exited channel) ends.
	watchOnce sync.Once
	gone      chan struct{}
	// exitVal is a template child's exit error, worked out once.
	exitOnce sync.Once
	exitVal  error
}

func (sb *sandbox) running() bool {
	if sb.sh.exited != nil {
		return !sb.sh.hasExited()
	}
	return procs.Alive(sb.sh.pid, sb.sh.start)
}

// record is what the sandbox table keeps of one sandbox.
type record struct {
	ID        string `json:"id"`
	Function  string `json:"function"`
	Revision  uint64 `json:"revision"`
	Addr      string `json:"addr"`
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Cgroup    string `json:"cgroup,omitempty"`   // name under brisk/
	OOMBase   int64  `json:"oom_base,omitempty"` // shell.oomBase
	NetNS     string `json:"netns"`
}

// New returns a native runtime, adopting the sandboxes an earlier worker on
// StateDir left running and reaping its parked shells. Call Start once the
// network pool has started.
func New(cfg Config) (*Runtime, error) {
	switch {
	case cfg.StateDir == "":
		return nil, errors.New("native runtime: StateDir is required")
	case cfg.Pool == nil:
		return nil, errors.New("native runtime: Pool is required")
	case cfg.KillGrace < 0 || cfg.Shells < 0 || cfg.TmpfsMB < 0:
		return nil, errors.New("native runtime: KillGrace, Shells and TmpfsMB must not be negative")
	case os.Geteuid() != 0:
		return nil, errors.New("native runtime: needs root (namespaces, cgroups, mounts)")
	}
	cfg.KillGrace = cmp.Or(cfg.KillGrace, DefaultKillGrace)
	cfg.Shells = cmp.Or(cfg.Shells, DefaultShells)
	cfg.TmpfsMB = cmp.Or(cfg.TmpfsMB, defaultTmpfsMB)
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	cfg.StateDir = dir
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	r := &Runtime{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		initArgv: cfg.InitArgv, caps: defaultCapNumbers(), uid: nobody, gid: nobody,
		staging: filepath.Join(dir, "staging"), ready: make(chan *shell, cfg.Shells), spareCgroups: make(chan spareCgroup, cfg.Shells), refill: make(chan struct{}, 1), dirty: make(chan struct{}, 1),
		sandboxes: map[string]*sandbox{}, creating: map[string]struct{}{}}
	if len(r.initArgv) == 0 {
		r.initArgv = []string{exe, nsinit.Subcommand}
		if lean := filepath.Join(filepath.Dir(exe), nsinit.BinaryName); isExecutable(lean) {
			r.initArgv = []string{lean, nsinit.Subcommand}
		}
	}
	r.trace = tracefn.Command(cmp.Or(cfg.BriskBinary, exe))
	if cfg.User != "" {
		if r.uid, r.gid, err = parseUser(cfg.User, "/"); err != nil {
			return nil, fmt.Errorf("native runtime: user: %w", err)
		}
	}
	sum := sha256.Sum256([]byte(dir))
	r.prefix = "native-" + hex.EncodeToString(sum[:4]) + "-"
	for _, d := range []string{filepath.Join(dir, "logs"), r.staging} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("native runtime: %w", err)
		}
	}
	if r.images, err = newImageStore(filepath.Join(dir, "images")); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	prog, err := defaultSeccomp()
	if err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	r.seccomp = nsinit.EncodeFilter(prog)
	// A template's children make their mount, UTS and IPC namespaces and
	// mount their /tmp under it, then load r.seccomp on top (template.go).
	if prog, err = defaultSeccomp("CAP_SYS_ADMIN"); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	r.tplSeccomp = nsinit.EncodeFilter(prog)
	r.initTemplates()
	if r.cg, err = cgroups.Detect(cmp.Or(cfg.CgroupRoot, cgroups.DefaultRoot), r.log.Warn); err != nil {
		return nil, fmt.Errorf("native runtime: cgroups: %w", err)
	}
	r.bg, r.stop = context.WithCancel(context.Background())
	if err := r.adopt(); err != nil {
		return nil, fmt.Errorf("native runtime: %w", err)
	}
	r.wg.Add(1)
	go r.tableWriter()
	return r, nil
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "native" }

// CanMount implements runtime.Mounter: the init binds Spec.Mounts into the
// new root (nsinit.Bind.Mounts).
func (r *Runtime) CanMount() bool { return true }

// Start fills the shell pool and keeps it full until Close. The network
// pool must have started.
func (r *Runtime) Start() {
	if r.started.Swap(true) {
		return
	}
	r.wg.Add(1)
	go r.refiller()
	r.kick()
}

func (r *Runtime) kick() {
	select {
	case r.refill <- struct{}{}:
	default:
	}
}

// refiller keeps Shells parked shells; a spawn that fails is retried after a
// pause, so a missing init binary does not spin.
func (r *Runtime) refiller() {
	defer r.wg.Done()
	for {
		select {
		case <-r.bg.Done():
			return
		case <-r.refill:
		}
		for len(r.ready) < cap(r.ready) && r.bg.Err() == nil {
			sh, err := r.spawn(r.bg)
			if err != nil {
				r.log.Warn("cannot pre-create a sandbox shell", "err", err)
				select {
				case <-r.bg.Done():
				case <-time.After(time.Second):
				}
				break
			}
			select {
			case r.ready <- sh:
			default:
				_ = r.destroy(r.bg, sh)
			}
		}
	}
}

// Close stops refilling and destroys the parked shells. Bound sandboxes
// keep running.
func (r *Runtime) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.stop()
	r.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for {
		select {
		case sh := <-r.ready:
			errs = append(errs, r.destroy(ctx, sh))
		case sp := <-r.spareCgroups:
			errs = append(errs, sp.cg.Remove(ctx))
			r.unbound.Delete(path.Base(sp.cg.Rel()))
		default:
			return errors.Join(errs...)
		}
	}
}

// takeShell returns a live parked shell, making one when none is ready.
func (r *Runtime) takeShell(ctx context.Context) (*shell, error) {
	for {
		select {
		case sh := <-r.ready:
			r.kick()
			if sh.hasExited() { // died parked (OOM of the host, a stray kill)
				_ = r.destroy(ctx, sh)
				continue
			}
			return sh, nil
		default:
			r.kick()
			return r.spawn(ctx)
		}
	}
}

// ImportImage implements the worker's ImageImporter: `brisk image push
// --to-workers` unpacks images here.
func (r *Runtime) ImportImage(ctx context.Context, rd io.Reader) ([]string, error) {
	return r.images.Import(ctx, rd)
}

// SetEgress is runtime.EgressEnforcer's: the network pool enforces them.
func (r *Runtime) SetEgress(policies map[string]spec.EgressPolicy) error {
	return r.cfg.Pool.SetEgress(policies)
}

// Create binds a parked shell to the function and returns once its
// entrypoint runs; the caller probes readiness on Instance.Addr.

func (r *Runtime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validate(s); err != nil {
		return nil, err
	}
	b, exe, err := r.bindFor(s)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	if exe != nil {
		defer exe.Close()
	}
	var secrets *os.File
	if len(s.Function.Secrets) > 0 {
		if b.Secrets, secrets, err = secretsFile(s.Function); err != nil {
			return nil, fmt.Errorf("sandbox %s: secrets: %w", s.ID, err)
		}
		defer secrets.Close()
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
			return inst, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
		}
		r.log.Warn("a sandbox could not start from its template; starting it fresh", "sandbox", s.ID, "err", err)
	}
	logPath := r.logPath(s.Function.Name, s.ID)
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	defer logf.Close()

	sh, err := r.takeShell(ctx)
	if err == nil {
		r.unbound.Delete(sh.name)
	}
	if err != nil {
		_ = os.Remove(logPath)
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	sb := &sandbox{sh: sh, memMB: s.Function.SandboxLimits().MemoryMB, lock: make(chan struct{}, 1),
		rec: record{ID: s.ID, Function: s.Function.Name, Revision: s.Function.Revision,
			Addr: net.JoinHostPort(sh.ep.IP.String(), strconv.Itoa(s.Function.Port)),
			PID:  sh.pid, StartTime: sh.start, NetNS: sh.ep.Name}}
	if sh.cg != nil {
		sb.rec.Cgroup, sb.rec.OOMBase = sh.name, sh.oomBase
	}
	fail := func(err error) (*runtime.Instance, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if derr := r.destroy(cctx, sh); derr != nil {
			r.log.Warn("cleaning up a failed create", "sandbox", s.ID, "err", derr)
		}
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	if err := r.fitShell(sh, s.Function, b, s.ID); err != nil {
		return fail(err)
	}
	files := bindFiles(logf, exe, secrets)
	r.mu.Lock()
	r.sandboxes[s.ID] = sb
	r.mu.Unlock()
	if err := r.bind(ctx, sh, b, files); err != nil {
		r.forget(sb)
		return fail(err)
	}
	// The table is written off the start's path: a worker killed before
	// the write reaps this sandbox on restart (its cgroup is unrecorded)
	// instead of adopting it, and nothing leaks.
	r.markDirty()
	r.log.Debug("sandbox started", "sandbox", s.ID, "function", s.Function.Name, "addr", sb.rec.Addr, "netns", sh.ep.Name)
	return &runtime.Instance{ID: s.ID, Addr: sb.rec.Addr, Exited: sh.exited, ExitErr: func() error { return r.exitErr(sb) }}, nil
}

// logPath is where sandbox (or template) id of function fn writes.
func (r *Runtime) logPath(fn, id string) string {
	return filepath.Join(r.cfg.StateDir, "logs", fn, id+".log")
}

// fitShell makes a taken shell f's before it is bound: f's limits on its
// cgroup, its address bound to f's namespace's egress policy (before the
// function runs, its first packet meets it), and in b its hostname and
// the network's /etc files.
func (r *Runtime) fitShell(sh *shell, f *spec.Function, b *nsinit.Bind, hostname string) error {
	if sh.cg != nil {
		if err := sh.cg.Limit(f.SandboxLimits()); err != nil {
			return err
		}
	}
	if err := r.cfg.Pool.Bind(sh.ep, spec.NamespaceOf(f)); err != nil {
		return err
	}
	b.Hostname = truncate(hostname, 64)
	if rc := r.cfg.Pool.ResolvConf(); rc != "" {
		b.Etc = append(b.Etc, nsinit.File{Name: "resolv.conf", Data: rc})
	}
	b.Etc = append(b.Etc, nsinit.File{Name: "hosts", Data: netpool.HostsFile(sh.ep.IP, b.Hostname)})
	return nil
}

// bindFiles are the descriptors a bind message carries, in nsinit.Bind's
// order: the log, then the executable and the secrets when there are.
func bindFiles(logf, exe, secrets *os.File) []*os.File {
	files := []*os.File{logf}
	if exe != nil {
		files = append(files, exe)
	}
	if secrets != nil {
		files = append(files, secrets)
	}
	return files
}

func (r *Runtime) forget(sb *sandbox) {
	r.mu.Lock()
	if r.sandboxes[sb.rec.ID] == sb {
		delete(r.sandboxes, sb.rec.ID)
	}
	r.mu.Unlock()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// exitErr says why a sandbox ended, nil while it runs.
func (r *Runtime) exitErr(sb *sandbox) error {
	if sb.running() {
		return nil
	}
	if sb.sh.tpl != nil {
		sb.exitOnce.Do(func() { sb.exitVal = r.templateChildExitErr(sb) })
		return sb.exitVal
	}
	status := "exited" // an adopted init: its status went to whoever reaped it
	if st, _, ok := runtime.WaitStatus(sb.sh.exitErr); ok && sb.sh.exited != nil {
		status = st
	}
	var oom int64
	if sb.sh.cg != nil {
		oom = sb.sh.oomKills()
	}
	return runtime.Ended(status, sb.stopping.Load(), oom, sb.memMB)
}

// bindFor resolves what the sandbox runs: an image's root file system and
// entrypoint, or, for a command or the builtin, the host's root file
// system under a private writable layer. exe is the binary to execute by
// descriptor (the builtin), to be closed by the caller.
func (r *Runtime) bindFor(s runtime.Spec) (b *nsinit.Bind, exe *os.File, err error) {
	f := s.Function
	b = &nsinit.Bind{Lower: "/", UID: r.uid, GID: r.gid,
		Caps: r.caps, Seccomp: r.seccomp}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"}
	switch {
	case f.Image != "":
		img, err := r.images.lookup(f.Image)
		if err != nil {
			return nil, nil, err
		}
		b.Lower, b.Dir = img.Rootfs, img.Config.WorkingDir
		env = append(env, img.Config.Env...)
		b.Argv = append(slices.Clone(img.Config.Entrypoint), img.Config.Cmd...)
		if img.Config.User != "" {
			if b.UID, b.GID, err = parseUser(img.Config.User, img.Rootfs); err != nil {
				return nil, nil, fmt.Errorf("image %s: user: %w", f.Image, err)
			}
		}
		if len(f.Command) > 0 {
			b.Argv = slices.Clone(f.Command)
		}
	case len(f.Command) > 0:
		b.Argv = slices.Clone(f.Command)
		if f.Code != nil { // brisk's runner: on the sandbox's own address, as the builtin
			env = append(env, tracefn.EnvListenHost+"=0.0.0.0")
		}
	case f.Builtin == image.TraceName:
		b.Argv, b.ExecFD = slices.Clone(r.trace), true
		env = append(env, tracefn.EnvListenHost+"=0.0.0.0")
		if exe, err = os.Open(b.Argv[0]); err != nil {
			return nil, nil, err
		}
	case f.Builtin != "":
		return nil, nil, fmt.Errorf("builtin %q: %w", f.Builtin, errors.ErrUnsupported)
	default:
		return nil, nil, fmt.Errorf("function %s has neither image, command nor builtin", f.Name)
	}
	if len(b.Argv) == 0 {
		return nil, nil, fmt.Errorf("image %s has no entrypoint and the function no command", f.Image)
	}
	for _, m := range s.Mounts {
		b.Mounts = append(b.Mounts, nsinit.Mount{Source: m.Source, Target: m.Target})
	}
	b.Env = runtime.FunctionEnv(env, s, f.Port, "")
	if len(f.Command) > 0 {
		b.Argv = runtime.ExpandArgs(b.Argv, b.Env) // $PORT without a shell
	}
	return b, exe, nil
}

// parseUser resolves "uid[:gid]" or a user name from rootfs's /etc/passwd
// ("" rootfs: numbers only).
func parseUser(u, rootfs string) (uid, gid uint32, err error) {
	name, group, hasGroup := strings.Cut(u, ":")
	if name == "root" {
		name = "0"
	}
	n, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		if rootfs == "" {
			return 0, 0, fmt.Errorf("%q: want uid or uid:gid", u)
		}
		var ok bool
		if n, gid, ok = lookupPasswd(rootfs, name); !ok {
			return 0, 0, fmt.Errorf("user %q is not in the image's /etc/passwd", name)
		}
		if !hasGroup {
			return uint32(n), gid, nil
		}
	} else if !hasGroup {
		gid = uint32(n)
	}
	if hasGroup {
		g, err := strconv.ParseUint(group, 10, 32)
		if err != nil {
			return 0, 0, fmt.Errorf("group %q: want a number", group)
		}
		gid = uint32(g)
	}
	return uint32(n), gid, nil
}

func lookupPasswd(rootfs, name string) (uint64, uint32, bool) {
	b, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 4 || f[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		return uid, uint32(gid), err1 == nil && err2 == nil
	}
	return 0, 0, false
}

// validate accepts ids and function names safe as a path element and a
// cgroup name.
func validate(s runtime.Spec) error {
	switch {
	case !runtime.ValidName(s.ID):
		return fmt.Errorf("sandbox %q: id must be 1-128 letters, digits, '.', '_' or '-', not starting with '.'", s.ID)
	case s.Function == nil:
		return fmt.Errorf("sandbox %s: no function spec", s.ID)
	case !runtime.ValidName(s.Function.Name):
		return fmt.Errorf("sandbox %s: function name %q is not a valid file name", s.ID, s.Function.Name)
	}
	if err := runtime.CheckSecrets(s.Function); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	return nil
}

// Kill stops the sandbox — SIGTERM when its first process handles it,
// SIGKILL to its cgroup once KillGrace has passed or at once otherwise —
// then removes its cgroup and returns its network namespace to the pool.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	sb, unlock, err := runtime.LockEntry(ctx, &r.mu, r.sandboxes, id, func(sb *sandbox) chan struct{} { return sb.lock })
	if err != nil {
		return err
	}
	defer unlock()
	sb.stopping.Store(true)
	if sb.running() && catchesSIGTERM(sb.sh.pid) {
		_ = syscall.Kill(sb.sh.pid, syscall.SIGTERM)
		r.waitExit(ctx, sb, r.cfg.KillGrace)
	}
	if err := r.destroy(ctx, sb.sh); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	r.forget(sb)
	r.log.Debug("sandbox killed", "sandbox", id)
	r.markDirty()
	return nil
}

func (r *Runtime) waitExit(ctx context.Context, sb *sandbox, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if sb.sh.exited != nil {
		select {
		case <-sb.sh.exited:
		case <-ctx.Done():
		}
		return
	}
	_ = waitGone(ctx, sb.sh.pid, sb.sh.start)
}

// List returns the sandboxes in the table, sorted by id. One that has ended
// is reported once with Running false and then torn down and dropped.
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
		out = append(out, runtime.Listed{ID: sb.rec.ID, Function: sb.rec.Function, Revision: sb.rec.Revision, Addr: sb.rec.Addr, Running: running})
		if running {
			continue
		}
		select {
		case sb.lock <- struct{}{}:
		default:
			continue // a Kill is at it
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := r.destroy(cctx, sb.sh); err == nil {
			r.forget(sb)
			dropped = true
		}
		cancel()
		<-sb.lock
	}
	if dropped {
		r.markDirty()
	}
	return out, nil
}

// Watch implements runtime.Watcher, for adopted sandboxes too.
func (r *Runtime) Watch(id string) (<-chan struct{}, func() error, bool) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return nil, nil, false
	}
	errf := func() error { return r.exitErr(sb) }
	if sb.sh.exited != nil {
		return sb.sh.exited, errf, true
	}
	sb.watchOnce.Do(func() {
		sb.gone = make(chan struct{})
		go func() {
			procs.WaitExit(sb.sh.pid, sb.sh.start, 5*time.Millisecond)
			close(sb.gone)
		}()
	})
	return sb.gone, errf, true
}

const tableFile = "sandboxes.json"

// markDirty asks the table writer to write the table soon; writes coalesce.
func (r *Runtime) markDirty() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// tableWriter writes the table whenever it is marked dirty, and once more
// at Close.
func (r *Runtime) tableWriter() {
	defer r.wg.Done()
	for {
		select {
		case <-r.dirty:
			if err := r.persist(); err != nil {
				r.log.Warn("cannot write the sandbox table", "err", err)
			}
		case <-r.bg.Done():
			if err := r.persist(); err != nil {
				r.log.Warn("cannot write the sandbox table", "err", err)
			}
			return
		}
	}
}

// persist writes the sandbox table.
func (r *Runtime) persist() error {
	r.persistM.Lock()
	defer r.persistM.Unlock()
	r.mu.Lock()
	recs := make([]record, 0, len(r.sandboxes))
	for _, sb := range r.sandboxes {
		if sb.sh.tpl != nil {
			// A template's child dies with its template, which a
			// restarted worker reaps: nothing to adopt.
			continue
		}
		recs = append(recs, sb.rec)
	}
	r.mu.Unlock()
	slices.SortFunc(recs, func(a, b record) int { return cmp.Compare(a.ID, b.ID) })
	b, err := json.Marshal(recs)
	if err != nil {
		return err
	}
	return r.table.Write(b)
}

// adopt takes over the sandboxes in the table whose init still runs, and
// tears down the rest: ended sandboxes' cgroups, and every shell cgroup of
// this StateDir nobody adopted (an earlier worker's parked shells). Their
// network namespaces are the pool's to reap when it starts.
func (r *Runtime) adopt() error {
	table, b, err := statefile.Open(r.cfg.StateDir, tableFile)
	if err != nil {
		return err
	}
	r.table = table
	var recs []record
	if len(b) > 0 {
		if err := json.Unmarshal(b, &recs); err != nil {
			return fmt.Errorf("%s: %w", table.Path(), err)
		}
	}
	keep := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, rec := range recs {
		sh := &shell{name: rec.Cgroup, pid: rec.PID, start: rec.StartTime, oomBase: rec.OOMBase}
		if rec.Cgroup != "" {
			sh.cg = r.cg.Open("brisk/" + rec.Cgroup)
		}
		sh.bound.Store(true)
		if procs.Alive(rec.PID, rec.StartTime) {
			ep, err := r.cfg.Pool.Adopt(rec.NetNS)
			if err == nil {
				sh.ep = ep
				r.sandboxes[rec.ID] = &sandbox{rec: rec, sh: sh, lock: make(chan struct{}, 1)}
				keep[rec.Cgroup] = true
				r.log.Info("adopted sandbox", "sandbox", rec.ID, "function", rec.Function, "pid", rec.PID)
				// Its output waits in its pipe: drain it again.
				if err := logpipe.Adopt(r.logPath(rec.Function, rec.ID), logpipe.Default, r.log); err != nil {
					r.log.Warn("cannot drain an adopted sandbox's output", "sandbox", rec.ID, "err", err)
				}
				continue
			}
			r.log.Warn("cannot adopt a sandbox's network; stopping it", "sandbox", rec.ID, "err", err)
		}
		if err := r.destroy(ctx, sh); err != nil {
			r.log.Warn("cannot tear down an ended sandbox", "sandbox", rec.ID, "err", err)
		}
	}
	for _, name := range r.cg.List(r.prefix) {
		if keep[name] {
			continue
		}
		cg := r.cg.Open("brisk/" + name)
		cg.Kill()
		if err := cg.Remove(ctx); err != nil {
			r.log.Warn("cannot remove a leftover shell cgroup", "cgroup", name, "err", err)
		}
	}
	// Names continue past the adopted ones'.
	for name := range keep {
		if n, err := strconv.ParseUint(strings.TrimPrefix(name, r.prefix), 10, 64); err == nil && n > r.seq.Load() {
			r.seq.Store(n)
		}
	}
	return r.persist()
}

// LogDir is where the sandboxes' output is kept: LogDir/FUNCTION/ID.log
// (worker.LogKeeper).
func (r *Runtime) LogDir() string { return filepath.Join(r.cfg.StateDir, "logs") }

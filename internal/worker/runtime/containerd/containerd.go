package containerd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/singleflight"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config configures the containerd runtime. StateDir and Pool are required.
type Config struct {
	// Address is containerd's socket. Default image.DefaultContainerdAddress.
	Address string
	// Namespace is the containerd namespace holding images, containers and
	// snapshots. Default image.DefaultNamespace ("brisk").
	Namespace string
	// StateDir holds the sandboxes' output in logs/<function>/<id>.log and
	// names this runtime's containers (label brisk.state): a restarted
	// worker on the same StateDir finds them; two live Runtimes must not
	// share one.
	StateDir string
	// Pool hands out each sandbox's network namespace. The caller starts and
	// closes it.
	Pool *netpool.Pool
	// Snapshotter unpacks images and makes root file systems. Default
	// image.DefaultSnapshotter ("overlayfs").
	Snapshotter string
	// KillGrace is how long Kill waits after SIGTERM before SIGKILL.
	// Default DefaultKillGrace.
	KillGrace time.Duration
	// Logger receives sandbox starts, exits and adoption. Default: discard.
	Logger *slog.Logger
}

// DefaultKillGrace is the SIGTERM-to-SIGKILL grace when Config.KillGrace is 0.
const DefaultKillGrace = time.Second

// Errors wrapped by Instance.ExitErr: the runtime package's, shared by
// every runtime.
var (
	ErrOOMKilled = runtime.ErrOOMKilled
	ErrKilled    = runtime.ErrKilled
)

const (
	// sigkillTimeout bounds the wait after SIGKILL when ctx has no deadline.
	sigkillTimeout = 10 * time.Second
	// dialTimeout bounds connecting to containerd in New.
	dialTimeout = 10 * time.Second
	// containerCreateTimeout bounds creating a container record and its
	// snapshot, which runs to the end even when the caller gives up.
	containerCreateTimeout = 30 * time.Second
)

// Runtime runs sandboxes as containerd containers. It is safe for concurrent
// use.
type Runtime struct {
	cfg    Config
	log    *slog.Logger
	client *containerd.Client
	v2     bool // cgroup v2 unified hierarchy
	// bg carries the namespace and lives until Close: task waits and the
	// event subscription run under it, not under a caller's ctx.
	bg     context.Context
	stop   context.CancelFunc
	closed atomic.Bool

	pulls    singleflight.Group
	unpacked sync.Map // manifest digest.Digest → struct{}: unpacked into cfg.Snapshotter

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	creating  map[string]chan struct{} // ids of Creates in progress; closed when each returns
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Watcher = (*Runtime)(nil)
	_ runtime.Mounter = (*Runtime)(nil)
)

// New connects to containerd and takes over the containers an earlier
// Runtime on the same StateDir left (see adoptOrKill). It starts the OOM
// event watch, which runs until Close.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg.Address = cmp.Or(cfg.Address, image.DefaultContainerdAddress)
	cfg.Namespace = cmp.Or(cfg.Namespace, image.DefaultNamespace)
	cfg.Snapshotter = cmp.Or(cfg.Snapshotter, image.DefaultSnapshotter)
	switch {
	case cfg.StateDir == "":
		return nil, errors.New("containerd runtime: StateDir is required")
	case cfg.Pool == nil:
		return nil, errors.New("containerd runtime: Pool is required")
	case cfg.KillGrace < 0:
		return nil, fmt.Errorf("containerd runtime: KillGrace %v must not be negative", cfg.KillGrace)
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: StateDir: %w", err)
	}
	cfg.StateDir = dir
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	if err := writeNetFiles(dir, cfg.Pool); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	client, err := containerd.New(cfg.Address, containerd.WithTimeout(dialTimeout),
		containerd.WithDefaultNamespace(cfg.Namespace))
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: connect to containerd at %s: %w", cfg.Address, err)
	}
	bg, stop := context.WithCancel(namespaces.WithNamespace(context.Background(), cfg.Namespace))
	r := &Runtime{
		cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)), client: client, v2: cgroupV2(),
		bg: bg, stop: stop, sandboxes: map[string]*sandbox{}, creating: map[string]chan struct{}{},
	}
	if _, err := client.Version(r.ns(ctx)); err != nil {
		r.Close()
		return nil, fmt.Errorf("containerd runtime: containerd at %s does not answer: %w", cfg.Address, err)
	}
	go r.watchOOM(bg)
	if err := r.adoptOrKill(ctx); err != nil {
		r.Close()
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	if err := r.reapSecrets(); err != nil {
		r.Close()
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	return r, nil
}

// Close stops the runtime's background work and closes its containerd
// connection. Sandboxes keep running.
func (r *Runtime) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	r.stop()
	return r.client.Close()
}

// Client is the runtime's containerd client (image import, tests).
func (r *Runtime) Client() *containerd.Client { return r.client }

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "containerd" }

// CanMount implements runtime.Mounter: runc binds Spec.Mounts.
func (r *Runtime) CanMount() bool { return true }

func (r *Runtime) ns(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

// sandbox is one container this Runtime manages. The done flags record how
// far teardown got, so a Kill that failed halfway resumes where it stopped.
type sandbox struct {
	id, function string
	revision     uint64
	addr         string
	ep           *netpool.Endpoint
	container    containerd.Container
	task         containerd.Task // nil until created
	memMB        int64
	cgroup       string // OCI cgroupsPath

	exited   chan struct{} // closed when the task has exited (nil: no task)
	exitErr  error         // set before exited closes
	stopping atomic.Bool   // Kill has begun: the exit is not a crash
	oom      atomic.Bool   // containerd reported an OOM event

	// lock serialises teardown; a channel so that waiting honours ctx.
	lock                                          chan struct{}
	taskDeleted, containerDeleted, released, gone bool
	// secrets says a secrets directory may exist for the sandbox
	// (secrets.go), for teardown to remove.
	secrets bool
}

func (sb *sandbox) hasExited() bool {
	if sb.exited == nil {
		return true
	}
	select {
	case <-sb.exited:
		return true
	default:
		return false
	}
}

// exitError is why the task ended, nil while it runs.
func (sb *sandbox) exitError() error {
	if sb.exited != nil && sb.hasExited() {
		return sb.exitErr
	}
	return nil
}

// idRE is containerd's identifier grammar (and max length 76).
var idRE = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

// imageRef says which image runs s: the spec's, or the trace function's
// image for the builtin.
func imageRef(s runtime.Spec) (string, error) {
	f := s.Function
	switch {
	case len(s.ID) > 76 || !idRE.MatchString(s.ID):
		return "", fmt.Errorf("sandbox %q: id must be letters and digits joined by single '.', '_' or '-', at most 76 characters", s.ID)
	case f == nil:
		return "", fmt.Errorf("sandbox %s: no function spec", s.ID)
	case !idRE.MatchString(f.Name):
		return "", fmt.Errorf("sandbox %s: function name %q is not a valid file name", s.ID, f.Name)
	}
	return runtime.FunctionImage(s, "containerd")
}

// SetEgress is runtime.EgressEnforcer's: the network pool enforces them.
func (r *Runtime) SetEgress(policies map[string]spec.EgressPolicy) error {
	return r.cfg.Pool.SetEgress(policies)
}

// Create makes the sandbox's container in a pooled network namespace and
// starts its task; the caller probes readiness (runtime.WaitReady on
// Instance.Addr). A task that exits at once still yields an Instance whose
// Exited then closes. A failed Create leaves nothing behind.
func (r *Runtime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ref, err := imageRef(s)
	if err != nil {
		return nil, err
	}
	if err := runtime.CheckSecrets(s.Function); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	r.mu.Lock()
	_, exists := r.sandboxes[s.ID]
	_, starting := r.creating[s.ID]
	done := make(chan struct{})
	if !exists && !starting {
		r.creating[s.ID] = done
	}
	r.mu.Unlock()
	if exists || starting {
		return nil, fmt.Errorf("sandbox %s: already exists", s.ID)
	}
	defer func() {
		r.mu.Lock()
		delete(r.creating, s.ID)
		r.mu.Unlock()
		close(done)
	}()
	ctx = r.ns(ctx)

	img, err := r.image(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	f := s.Function
	sb := &sandbox{id: s.ID, function: f.Name, revision: f.Revision, memMB: f.SandboxLimits().MemoryMB,
		cgroup: "/" + r.cfg.Namespace + "/" + s.ID, lock: make(chan struct{}, 1)}
	if sb.ep, err = r.take(ctx); err != nil {
		return nil, fmt.Errorf("sandbox %s: network: %w", s.ID, err)
	}
	// Before the function runs: its first packet meets its namespace's
	// egress policy.
	if err := r.cfg.Pool.Bind(sb.ep, spec.NamespaceOf(f)); err != nil {
		r.release(sb.ep)
		return nil, fmt.Errorf("sandbox %s: network: %w", s.ID, err)
	}
	sb.addr = net.JoinHostPort(sb.ep.IP.String(), strconv.Itoa(f.Port))
	if err := r.start(ctx, sb, img, s); err != nil {
		// Clean up even if the caller's ctx has ended meanwhile. No Kill
		// can hold sb.lock: Kill waits for Creates in progress.
		cctx, cancel := context.WithTimeout(r.bg, sigkillTimeout)
		if terr := r.teardown(cctx, sb); terr != nil {
			r.log.Warn("cleaning up a failed create", "sandbox", s.ID, "err", terr)
			r.mu.Lock() // keep it so that List reports it and Kill can finish
			r.sandboxes[s.ID] = sb
			r.mu.Unlock()
		}
		cancel()
		return nil, fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	r.log.Debug("sandbox started", "sandbox", s.ID, "function", f.Name, "image", ref, "addr", sb.addr, "netns", sb.ep.Name)
	return &runtime.Instance{ID: s.ID, Addr: sb.addr, Exited: sb.exited, ExitErr: sb.exitError}, nil
}

// start creates the container and its task and starts it, recording each
// step in sb so that teardown can undo exactly what was done.
func (r *Runtime) start(ctx context.Context, sb *sandbox, img containerd.Image, s runtime.Spec) error {
	logPath := filepath.Join(r.cfg.StateDir, "logs", sb.function, sb.id+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	labels := map[string]string{
		LabelSandbox: sb.id, LabelFunction: sb.function, LabelRevision: strconv.FormatUint(sb.revision, 10),
		LabelState: r.cfg.StateDir, labelPort: strconv.Itoa(s.Function.Port),
	}
	endpointLabels(sb.ep, labels)
	if len(s.Function.Secrets) > 0 {
		sb.secrets = true // from here on teardown removes what was written
		if _, err := runtime.WriteSecretsDir(r.cfg.StateDir, sb.id, s.Function); err != nil {
			return fmt.Errorf("secrets: %w", err)
		}
	}
	// Not cut short by the caller's deadline: containerd may finish
	// preparing the snapshot after a cancelled request, after teardown
	// looked for it, and leak it. The caller's ctx is checked right after.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), containerCreateTimeout)
	defer cancel()
	t0 := time.Now()
	c, err := r.client.NewContainer(cctx, sb.id,
		containerd.WithImage(img),
		containerd.WithSnapshotter(r.cfg.Snapshotter),
		containerd.WithNewSnapshot(sb.id, img, snapshots.WithLabels(map[string]string{LabelState: r.cfg.StateDir})),
		containerd.WithNewSpec(r.specOpts(img, s, sb)...),
		containerd.WithContainerLabels(labels),
	)
	if err != nil {
		// A container or snapshot that exists under this id was not made
		// by this call: leave it to whoever owns it. Otherwise the snapshot
		// may have been made before the container failed.
		sb.containerDeleted = errdefs.IsAlreadyExists(err)
		if errdefs.IsNotFound(err) {
			// The image's layers may have been removed behind our back:
			// check the unpack again next time.
			r.unpacked.Delete(img.Target().Digest)
		}
		return fmt.Errorf("container from %s: %w", img.Name(), err)
	}
	sb.container = c
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("container from %s: %w", img.Name(), err)
	}
	t1 := time.Now()
	// The output goes through the worker's rate-limited drain (package
	// logpipe), as the other runtimes' does: the shim writes to the log's
	// FIFO, holding it open across worker restarts (adoptOrKill drains it
	// again), so a flooding sandbox cannot fill the disk between the log
	// keeper's checks.
	logf, err := logpipe.Sandbox(logPath)
	if err != nil {
		return fmt.Errorf("log: %w", err)
	}
	task, err := c.NewTask(ctx, cio.LogURI(&url.URL{Path: logPath + logpipe.Suffix}))
	logf.Close() // the shim holds the FIFO now; or no task, and the drain ends
	if err != nil {
		return fmt.Errorf("task: %w", err)
	}
	sb.task = task
	t2 := time.Now()
	// Wait before Start, so that an immediate exit is not missed, and under
	// bg: the wait outlives this call.
	statusC, err := task.Wait(r.bg)
	if err != nil {
		return fmt.Errorf("task wait: %w", err)
	}
	sb.exited = make(chan struct{})
	go r.waitExit(sb, statusC)
	r.mu.Lock()
	r.sandboxes[sb.id] = sb // from here on an OOM event finds it
	r.mu.Unlock()
	if err := task.Start(ctx); err != nil {
		r.mu.Lock()
		delete(r.sandboxes, sb.id)
		r.mu.Unlock()
		return fmt.Errorf("task start: %w", err)
	}
	r.log.Debug("sandbox phases", "sandbox", sb.id, "container", t1.Sub(t0), "task_create", t2.Sub(t1), "task_start", time.Since(t2))
	return nil
}

// waitExit records how the task ended and closes sb.exited.
func (r *Runtime) waitExit(sb *sandbox, statusC <-chan containerd.ExitStatus) {
	st := <-statusC
	code, _, err := st.Result()
	if err != nil && r.closed.Load() {
		return // the wait was cut off by Close, not by an exit
	}
	sb.exitErr = r.describeExit(sb, code, err)
	close(sb.exited)
	if !sb.stopping.Load() {
		r.log.Debug("sandbox exited", "sandbox", sb.id, "function", sb.function, "err", sb.exitErr)
	}
}

func (r *Runtime) describeExit(sb *sandbox, code uint32, waitErr error) error {
	status := fmt.Sprintf("exited with status %d", code)
	switch {
	case waitErr != nil:
		status = "wait: " + waitErr.Error()
	case code > 128:
		status = fmt.Sprintf("killed by signal %d (%v)", code-128, syscall.Signal(code-128))
	}
	if sb.stopping.Load() {
		return fmt.Errorf("%w (%s)", ErrKilled, status)
	}
	// The task's cgroup lives until the task is deleted, so its counter is
	// still there: the OOM event may arrive after the exit.
	sigkill := code == 128+uint32(syscall.SIGKILL)
	if sb.oom.Load() || (sigkill && oomKills(r.v2, sb.cgroup) > 0) {
		if sigkill {
			return fmt.Errorf("%w (memory limit %d MiB)", ErrOOMKilled, sb.memMB)
		}
		return fmt.Errorf("%s after a process in the sandbox was %w (memory limit %d MiB)", status, ErrOOMKilled, sb.memMB)
	}
	return errors.New(status)
}

// image returns the image ref from containerd, pulling it when it is
// missing, unpacked into the snapshotter. Concurrent calls for one ref
// share one pull and one unpack.
func (r *Runtime) image(ctx context.Context, ref string) (containerd.Image, error) {
	img, err := r.client.GetImage(ctx, ref)
	if errdefs.IsNotFound(err) {
		v, perr, _ := r.pulls.Do("pull\x00"+ref, func() (any, error) {
			// Detached from one caller's cancellation: others share it.
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
			defer cancel()
			return r.client.Pull(pctx, ref, containerd.WithPullUnpack, containerd.WithPullSnapshotter(r.cfg.Snapshotter))
		})
		if perr != nil {
			return nil, fmt.Errorf("image %q is not in containerd namespace %s and pulling it failed (build and import it with `brisk image build` or `brisk image import`): %w",
				ref, r.cfg.Namespace, perr)
		}
		img = v.(containerd.Image)
		r.unpacked.Store(img.Target().Digest, struct{}{})
		return img, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", ref, err)
	}
	dgst := img.Target().Digest
	if _, ok := r.unpacked.Load(dgst); ok {
		return img, nil
	}
	_, err, _ = r.pulls.Do("unpack\x00"+dgst.String(), func() (any, error) {
		return nil, r.ensureUnpacked(context.WithoutCancel(ctx), img, dgst)
	})
	if err != nil {
		return nil, fmt.Errorf("image %q: unpack into %s: %w", ref, r.cfg.Snapshotter, err)
	}
	return img, nil
}

func (r *Runtime) ensureUnpacked(ctx context.Context, img containerd.Image, dgst digest.Digest) error {
	ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter)
	if err == nil && !ok {
		err = img.Unpack(ctx, r.cfg.Snapshotter)
	}
	if err == nil {
		r.unpacked.Store(dgst, struct{}{})
	}
	return err
}

// Kill stops the sandbox (SIGTERM, SIGKILL to all its processes once
// KillGrace has passed), deletes its task, its container and its rootfs
// snapshot, and returns its network namespace to the pool. A Kill that
// fails (ctx ended, containerd unreachable) keeps the sandbox and what is
// left to do; the next Kill resumes there.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	// A Kill racing the Create of the same id (a Tombstone overtaking
	// it) waits for the Create, so that what it made cannot escape.
	r.mu.Lock()
	creating := r.creating[id]
	r.mu.Unlock()
	if creating != nil {
		select {
		case <-creating:
		case <-ctx.Done():
			return fmt.Errorf("kill sandbox %s: %w", id, ctx.Err())
		}
	}
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil {
		return fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	select {
	case sb.lock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("kill sandbox %s: %w", id, ctx.Err())
	}
	defer func() { <-sb.lock }()
	if sb.gone { // a concurrent Kill finished it
		return fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	if err := r.teardown(r.ns(ctx), sb); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	r.log.Debug("sandbox killed", "sandbox", id)
	return nil
}

// teardown undoes whatever of sb exists, skipping steps already done, and
// drops sb from the table once everything is released. Callers hold sb.lock
// or own sb exclusively.
func (r *Runtime) teardown(ctx context.Context, sb *sandbox) error {
	sb.stopping.Store(true)
	if !sb.taskDeleted {
		// A create cut short (ctx ended, reply lost) may have made a task
		// or container that sb does not hold yet: look them up by id.
		if sb.container == nil && !sb.containerDeleted {
			c, err := r.client.LoadContainer(ctx, sb.id)
			if err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("load container: %w", err)
			}
			sb.container = c
		}
		if sb.task == nil && sb.container != nil {
			t, err := sb.container.Task(ctx, nil)
			if err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("load task: %w", err)
			}
			sb.task = t
		}
		if sb.task != nil {
			var opts []containerd.ProcessDeleteOpts
			if sb.exited != nil {
				if err := r.stopTask(ctx, sb); err != nil {
					return err
				}
			} else {
				// Not watched (its create was cut short): containerd
				// kills it and waits before deleting.
				opts = append(opts, containerd.WithProcessKill)
			}
			if _, err := sb.task.Delete(ctx, opts...); err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("delete task: %w", err)
			}
		}
	}
	sb.taskDeleted = true
	if !sb.containerDeleted {
		var err error
		if sb.container != nil {
			err = sb.container.Delete(ctx, containerd.WithSnapshotCleanup)
			if err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("delete container: %w", err)
			}
		}
		if sb.container == nil || err != nil {
			// No container (any more), but its snapshot may be left by a
			// create that failed between the two.
			err = r.client.SnapshotService(r.cfg.Snapshotter).Remove(ctx, sb.id)
			if err != nil && !errdefs.IsNotFound(err) {
				return fmt.Errorf("remove snapshot: %w", err)
			}
		}
	}
	sb.containerDeleted = true
	if sb.secrets {
		// Only now: runc bound the directory into the container.
		if err := runtime.RemoveSecretsDir(r.secretsDir(sb.id)); err != nil {
			return err
		}
		sb.secrets = false
	}
	if !sb.released && sb.ep != nil {
		r.release(sb.ep)
	}
	sb.released = true
	r.mu.Lock()
	if r.sandboxes[sb.id] == sb {
		delete(r.sandboxes, sb.id)
	}
	sb.gone = true
	r.mu.Unlock()
	return nil
}

// stopTask ends the task's processes: SIGTERM to its init, then SIGKILL to
// every process in it once KillGrace has passed.
func (r *Runtime) stopTask(ctx context.Context, sb *sandbox) error {
	if !sb.hasExited() {
		if err := sb.task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
			r.log.Debug("SIGTERM", "sandbox", sb.id, "err", err)
		}
		if !waitClosed(ctx, sb.exited, r.cfg.KillGrace) && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	// Even after init exited: processes it left behind die with the task's
	// cgroup only on delete, which refuses while they run.
	if err := sb.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) &&
		!errors.Is(err, errdefs.ErrFailedPrecondition) {
		r.log.Debug("SIGKILL", "sandbox", sb.id, "err", err)
	}
	if !waitClosed(ctx, sb.exited, sigkillTimeout) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("task still runs %v after SIGKILL", sigkillTimeout)
	}
	return nil
}

func waitClosed(ctx context.Context, c <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// List returns this runtime's containers (label brisk.state = StateDir),
// sorted by id, Running from their task's status.
func (r *Runtime) List(ctx context.Context) ([]runtime.Listed, error) {
	ctx = r.ns(ctx)
	cs, err := r.client.Containers(ctx, ownedFilter(r.cfg.StateDir))
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: list containers: %w", err)
	}
	out := make([]runtime.Listed, 0, len(cs))
	for _, c := range cs {
		l, err := c.Labels(ctx)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("containerd runtime: container %s: %w", c.ID(), err)
		}
		rev, _ := strconv.ParseUint(l[LabelRevision], 10, 64)
		running, err := taskRunning(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("containerd runtime: container %s: %w", c.ID(), err)
		}
		out = append(out, runtime.Listed{ID: c.ID(), Function: l[LabelFunction], Revision: rev, Addr: addrFromLabels(l), Running: running})
	}
	slices.SortFunc(out, func(a, b runtime.Listed) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Watch implements runtime.Watcher: the exit of every sandbox with a task
// is awaited, those an earlier worker left (adoptOrKill) included.
func (r *Runtime) Watch(id string) (<-chan struct{}, func() error, bool) {
	r.mu.Lock()
	sb := r.sandboxes[id]
	r.mu.Unlock()
	if sb == nil || sb.exited == nil {
		return nil, nil, false
	}
	return sb.exited, sb.exitError, true
}

func taskRunning(ctx context.Context, c containerd.Container) (bool, error) {
	t, err := c.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	st, err := t.Status(ctx)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	return err == nil && st.Status == containerd.Running, err
}

func ownedFilter(stateDir string) string {
	return `labels."` + LabelState + `"==` + strconv.Quote(stateDir)
}

// ImportImage imports an OCI archive into the runtime's namespace and
// unpacks it (worker.ImageImporter: `brisk image push --to-workers`).
func (r *Runtime) ImportImage(ctx context.Context, rd io.Reader) ([]string, error) {
	return image.Import(ctx, r.client, r.cfg.Namespace, r.cfg.Snapshotter, rd)
}

// LogDir is where the sandboxes' output is kept: LogDir/FUNCTION/ID.log
// (worker.LogKeeper).
func (r *Runtime) LogDir() string { return filepath.Join(r.cfg.StateDir, "logs") }

package kube

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// Config configures one node's Runtime.
type Config struct {
	// Node is the worker node: with PlaceBrisk the Kubernetes node its
	// Pods are bound to, with PlaceScheduler the name its Pods carry
	// (AnnotationWorkerNode; best not a Kubernetes node's). Required.
	Node string
	// Placement chooses who picks each Pod's Kubernetes node; default
	// PlaceBrisk.
	Placement Placement
	// Nodes, with PlaceScheduler, are the Kubernetes nodes the scheduler
	// may use (node affinity); empty: any.
	Nodes []string
	// KeyPrefixes are the label and annotation key prefixes (DNS names,
	// e.g. "example.com") a function's own keys may carry onto its Pods,
	// besides unprefixed keys; default none (see tenantKey).
	KeyPrefixes []string
	// UnschedulableGrace, with PlaceScheduler, is how long a Pod may stay
	// unschedulable before its Create fails: long enough for a cluster
	// autoscaler to add a node or a preemption to make room (a Pod with a
	// nominated node is not counted as unschedulable). Default
	// DefaultUnschedulableGrace.
	UnschedulableGrace time.Duration
	// KillGrace is the Pods' termination grace (whole seconds, rounded
	// up): how long the kubelet waits after SIGTERM before SIGKILL.
	// Default DefaultKillGrace.
	KillGrace time.Duration
	// Logger receives sandbox starts, ends and adoptions. Default: discard.
	Logger *slog.Logger
}

// DefaultUnschedulableGrace is Config.UnschedulableGrace's default.
const DefaultUnschedulableGrace = 10 * time.Second

// DefaultKillGrace is the Pods' termination grace when Config.KillGrace is
// 0, the other runtimes' SIGTERM-to-SIGKILL grace.
const DefaultKillGrace = time.Second

// cleanupTimeout bounds deleting what a failed Create made, which runs
// after the caller's ctx may have ended.
const cleanupTimeout = 30 * time.Second

// Runtime runs one node's sandboxes as Pods bound to it. It is safe for
// concurrent use.
type Runtime struct {
	s    *Shared
	node string
	cfg  Config
	log  *slog.Logger

	mu sync.Mutex
	// sandboxes are the Pods this Runtime has created or looked at (Kill,
	// Watch) by Pod name, until Kill has seen them gone. Pods found only
	// in the informer's cache are not in it: List reads the cache.
	sandboxes map[string]*sandbox
	closed    bool
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Watcher = (*Runtime)(nil)
)

// sandbox follows one Pod through the informer's events. Fields are
// guarded by Runtime.mu.
type sandbox struct {
	id, name string
	// uid is the Pod's, "" while its Create waits for the apiserver's
	// answer; events for the name meanwhile wait in pending, since they
	// may be an older Pod's of the same name.
	uid     types.UID
	pending []podEvent

	addr  string
	host  string        // the Kubernetes node it runs on, with addr
	ready chan struct{} // closed once the Pod runs with an address

	exited  chan struct{} // closed when the sandbox ends; exitErr says why
	exitErr error
	killing bool // Kill has begun: an end from now on is Kill's

	gone chan struct{} // closed when the informer has seen the Pod deleted

	// unsched is why the scheduler cannot place the Pod, since
	// unschedSince; nil once it can. The Create fails when it has lasted
	// UnschedulableGrace (unschedTimer).
	unsched      error
	unschedSince time.Time
	unschedTimer *time.Timer

	creating chan struct{} // closed when its Create returns; nil if none ran
	lock     chan struct{} // serialises Kills; a channel so waits honour ctx
	dropped  bool          // no longer in the table
}

type podEvent struct {
	pod     *corev1.Pod
	deleted bool
}

func newSandbox(id, name string) *sandbox {
	return &sandbox{id: id, name: name, ready: make(chan struct{}), exited: make(chan struct{}),
		gone: make(chan struct{}), lock: make(chan struct{}, 1)}
}

// setUID tells sb which Pod is its own and applies the events held for
// that Pod while its Create waited; the rest were another Pod's.
func (r *Runtime) setUID(sb *sandbox, uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb.uid = uid
	for _, ev := range sb.pending {
		if ev.pod.UID == uid {
			r.applyLocked(sb, ev.pod, ev.deleted)
		}
	}
	sb.pending = nil
}

// exitError is why the sandbox ended, nil while it runs.
func (r *Runtime) exitError(sb *sandbox) func() error {
	return func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		return sb.exitErr
	}
}

// Runtime returns the runtime of node cfg.Node on s. One node has at most
// one Runtime on a Shared; Close it to make another.
func (s *Shared) Runtime(cfg Config) (*Runtime, error) {
	switch {
	case cfg.Node == "":
		return nil, errors.New("kube runtime: Node is required")
	case cfg.KillGrace < 0:
		return nil, fmt.Errorf("kube runtime: KillGrace %v must not be negative", cfg.KillGrace)
	case cfg.Placement == "":
		cfg.Placement = PlaceBrisk
	case cfg.Placement != PlaceBrisk && cfg.Placement != PlaceScheduler:
		return nil, fmt.Errorf("kube runtime: placement %q: want %s or %s", cfg.Placement, PlaceBrisk, PlaceScheduler)
	}
	if cfg.Placement == PlaceBrisk && len(cfg.Nodes) > 0 {
		return nil, fmt.Errorf("kube runtime: Nodes is for placement %s; placement %s binds Pods to node %s", PlaceScheduler, PlaceBrisk, cfg.Node)
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	cfg.Nodes = slices.Clone(cfg.Nodes)
	r := &Runtime{s: s, node: cfg.Node, cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		sandboxes: map[string]*sandbox{}}
	if err := s.register(r); err != nil {
		return nil, err
	}
	return r, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "kube" }

// Node is the worker node: the Kubernetes node the Runtime's Pods are
// bound to, or with PlaceScheduler the name they carry.
func (r *Runtime) Node() string { return r.node }

// Close detaches the Runtime from its Shared: its Pods keep running, and a
// new Runtime for the node (a restarted worker) adopts them.
func (r *Runtime) Close() error {
	r.s.unregister(r)
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return nil
}

// observe applies one informer event for a Pod on the Runtime's node.
func (r *Runtime) observe(p *corev1.Pod, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[p.Name]
	switch {
	case sb == nil:
		return // not followed: List reads the cache, Kill and Watch look there
	case sb.uid == "":
		sb.pending = append(sb.pending, podEvent{p, deleted})
		return
	case p.UID != sb.uid:
		return // another Pod of the same name, before or after ours
	}
	r.applyLocked(sb, p, deleted)
}

// applyLocked moves sb on with the Pod's state. Everything in it only moves
// forward (ready, exited, gone), so an event replayed or seen late
// changes nothing.
func (r *Runtime) applyLocked(sb *sandbox, p *corev1.Pod, deleted bool) {
	if deleted {
		r.endLocked(sb, fmt.Errorf("pod %s/%s was deleted, not by this worker", p.Namespace, p.Name))
		if !isClosed(sb.gone) {
			close(sb.gone)
		}
		return
	}
	if sb.addr == "" && running(p) {
		sb.addr, sb.host = podAddr(p), p.Spec.NodeName
		close(sb.ready)
	}
	if err := ended(p); err != nil {
		r.endLocked(sb, err)
		return
	}
	switch err := unschedulable(p); {
	case err == nil:
		sb.unsched = nil
	case sb.unsched == nil:
		sb.unsched, sb.unschedSince = err, time.Now()
		r.armUnschedLocked(sb, r.unschedGrace())
	default:
		sb.unsched = err // the scheduler's latest reason
	}
}

func (r *Runtime) unschedGrace() time.Duration {
	if r.cfg.UnschedulableGrace > 0 {
		return r.cfg.UnschedulableGrace
	}
	return DefaultUnschedulableGrace
}

// armUnschedLocked ends sb after d if its Pod is still unschedulable then
// and has been for the whole grace; a Pod placed meanwhile and
// unschedulable again (a new unschedSince) gets the rest of its own.
func (r *Runtime) armUnschedLocked(sb *sandbox, d time.Duration) {
	if sb.unschedTimer != nil {
		sb.unschedTimer.Stop()
	}
	sb.unschedTimer = time.AfterFunc(d, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if sb.unsched == nil || isClosed(sb.exited) {
			return
		}
		if left := r.unschedGrace() - time.Since(sb.unschedSince); left > 0 {
			r.armUnschedLocked(sb, left)
			return
		}
		r.endLocked(sb, sb.unsched)
	})
}

// endLocked records the end of sb, once: the first reason stays.
func (r *Runtime) endLocked(sb *sandbox, why error) {
	if isClosed(sb.exited) {
		return
	}
	if sb.killing {
		why = fmt.Errorf("%w (pod %s)", runtime.ErrKilled, sb.name)
	} else {
		r.log.Debug("sandbox ended", "sandbox", sb.id, "node", r.node, "err", why)
	}
	sb.exitErr = why
	close(sb.exited)
}

// trackLocked starts following Pod p for sandbox id, from the state the cache
// has. The caller holds r.mu: an event the informer delivers after the
// cache read below finds the entry.
func (r *Runtime) trackLocked(id string, p *corev1.Pod) *sandbox {
	sb := newSandbox(id, p.Name)
	sb.uid = p.UID
	r.applyLocked(sb, p, false)
	r.sandboxes[p.Name] = sb
	return sb
}

// lookup finds sandbox id: in the table, or as a Pod of this node in the
// cache (one an earlier worker created), which it then follows. nil when
// neither knows it.
func (r *Runtime) lookup(id string) *sandbox {
	name := PodName(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb := r.sandboxes[name]; sb != nil {
		if sb.id != id {
			return nil
		}
		return sb
	}
	p, err := r.s.pods.Get(name)
	if err != nil || owner(p) != r.node || p.Annotations[AnnotationSandbox] != id {
		return nil
	}
	r.log.Debug("following a pod this worker did not create", "sandbox", id, "pod", name, "node", r.node)
	return r.trackLocked(id, p)
}

func (r *Runtime) dropLocked(sb *sandbox) {
	if r.sandboxes[sb.name] == sb {
		delete(r.sandboxes, sb.name)
	}
	sb.dropped = true
}

// Create creates the sandbox's Pod bound to the node and returns once the
// informer shows it running with an address; the caller then probes the
// function's port (Instance.Ready is false: the kubelet's own readiness
// probes run at most once a second, the worker's every millisecond). When
// the Pod cannot start, ends first or outlasts ctx, Create fails and
// deletes it at once, with no grace. An id whose Pod exists is refused.
func (r *Runtime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	pod, err := podFor(s, r.s.namespace, r.node, token, r.cfg.KillGrace, r.cfg.KeyPrefixes)
	if err != nil {
		return nil, err
	}
	r.place(pod)
	name := pod.Name
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: kube runtime of node %s is closed", s.ID, r.node)
	}
	if r.sandboxes[name] != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: already exists", s.ID)
	}
	if p, err := r.s.pods.Get(name); err == nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: pod %s/%s already exists (on node %s)", s.ID, r.s.namespace, name, p.Spec.NodeName)
	}
	sb := newSandbox(s.ID, name)
	sb.creating = make(chan struct{})
	r.sandboxes[name] = sb
	r.mu.Unlock()
	defer close(sb.creating)

	t0 := time.Now()
	created, err := r.s.client.Pods(r.s.namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		if !rejected(err) {
			// The apiserver may have made the Pod all the same (the
			// reply was lost, or ctx ended in flight).
			r.deleteUncertain(ctx, sb, token)
		}
		r.mu.Lock()
		r.dropLocked(sb)
		r.mu.Unlock()
		return nil, fmt.Errorf("sandbox %s: create pod %s/%s: %w", s.ID, r.s.namespace, name, err)
	}
	r.setUID(sb, created.UID)

	select {
	case <-sb.ready:
	case <-sb.exited:
	case <-ctx.Done():
	}
	r.mu.Lock()
	addr, host, ok := sb.addr, sb.host, isClosed(sb.ready)
	why := sb.exitErr
	r.mu.Unlock()
	if ok {
		// A Pod that ran and already ended still yields an Instance
		// whose Exited is closed, as a process that exits at once does.
		r.log.Debug("sandbox started", "sandbox", s.ID, "pod", name, "node", r.node, "on", host, "addr", addr, "took", time.Since(t0))
		return &runtime.Instance{ID: s.ID, Addr: addr, Exited: sb.exited, ExitErr: r.exitError(sb)}, nil
	}
	if why == nil {
		why = ctx.Err()
	}
	// No grace: the sandbox never served, and a graceful delete would
	// wait for a kubelet that may be what failed.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := r.remove(cctx, sb, 0); err != nil {
		r.log.Warn("deleting the pod of a failed create", "sandbox", s.ID, "pod", name, "err", err)
	}
	return nil, fmt.Errorf("sandbox %s: pod %s/%s did not start: %w", s.ID, r.s.namespace, name, why)
}

// rejected says the apiserver refused a request, so that it did nothing:
// its answer is a Status other than a timeout or an internal error.
func rejected(err error) bool {
	var st apierrors.APIStatus
	return errors.As(err, &st) && !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) &&
		!apierrors.IsInternalError(err) && !apierrors.IsTooManyRequests(err)
}

// deleteUncertain deletes the Pod of a Create that failed without the
// apiserver's answer, if the Pod exists and that Create made it (its
// token), and waits until it is gone.
func (r *Runtime) deleteUncertain(ctx context.Context, sb *sandbox, token string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	p, err := r.s.client.Pods(r.s.namespace).Get(cctx, sb.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		r.log.Warn("looking for the pod of a failed create", "sandbox", sb.id, "pod", sb.name, "err", err)
		return
	}
	if p.Annotations[annotationCreate] != token {
		return // not ours
	}
	r.setUID(sb, p.UID)
	if err := r.remove(cctx, sb, 0); err != nil {
		r.log.Warn("deleting the pod of a failed create", "sandbox", sb.id, "pod", sb.name, "err", err)
	}
}

// Kill deletes the sandbox's Pod with the configured grace and returns once
// the informer has seen it gone. A Kill that fails (ctx ended) leaves the
// sandbox for the next Kill to finish. Kill after the sandbox ended on its
// own deletes what is left of its Pod; an id neither this Runtime nor the
// cache knows is runtime.ErrNotFound.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	sb := r.lookup(id)
	if sb == nil {
		return fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	if sb.creating != nil {
		// A Kill overtaking its Create waits for it, so that what the
		// Create makes cannot escape.
		select {
		case <-sb.creating:
		case <-ctx.Done():
			return fmt.Errorf("kill sandbox %s: %w", id, ctx.Err())
		}
	}
	select {
	case sb.lock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("kill sandbox %s: %w", id, ctx.Err())
	}
	defer func() { <-sb.lock }()
	r.mu.Lock()
	dropped := sb.dropped
	r.mu.Unlock()
	if dropped { // a concurrent Kill, or its failed Create, finished it
		return fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	if err := r.remove(ctx, sb, int64(math.Ceil(r.cfg.KillGrace.Seconds()))); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	r.log.Debug("sandbox killed", "sandbox", id, "node", r.node)
	return nil
}

// remove deletes sb's Pod (only that Pod: the UID is a precondition) with
// grace seconds for its containers to stop, and waits until the informer
// has seen it go, then drops sb. A failed remove keeps sb for the next.
func (r *Runtime) remove(ctx context.Context, sb *sandbox, grace int64) error {
	r.mu.Lock()
	sb.killing = true
	uid, gone := sb.uid, isClosed(sb.gone)
	r.mu.Unlock()
	if !gone && uid != "" {
		err := r.s.client.Pods(r.s.namespace).Delete(ctx, sb.name, metav1.DeleteOptions{
			GracePeriodSeconds: &grace,
			Preconditions:      &metav1.Preconditions{UID: &uid},
		})
		// NotFound: already deleted. Conflict: the name is another Pod's
		// now, so ours is deleted too. Either way the informer will say.
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod %s/%s: %w", r.s.namespace, sb.name, err)
		}
		select {
		case <-sb.gone:
		case <-ctx.Done():
			return fmt.Errorf("pod %s/%s still there: %w", r.s.namespace, sb.name, ctx.Err())
		}
	}
	r.mu.Lock()
	r.dropLocked(sb)
	r.mu.Unlock()
	return nil
}

// List returns the brisk Pods of the worker node (bound to it, or with
// PlaceScheduler carrying its name), from the informer's cache
// (complete since NewShared), sorted by sandbox id: those an earlier worker
// created included, so that a restarted worker adopts them.
func (r *Runtime) List(ctx context.Context) ([]runtime.Listed, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	objs, err := r.s.informer.GetIndexer().ByIndex(nodeIndex, r.node)
	if err != nil {
		return nil, fmt.Errorf("kube runtime: %w", err)
	}
	out := make([]runtime.Listed, 0, len(objs))
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Annotations[AnnotationSandbox] == "" {
			continue
		}
		rev, _ := strconv.ParseUint(p.Labels[LabelRevision], 10, 64)
		out = append(out, runtime.Listed{ID: p.Annotations[AnnotationSandbox], Function: p.Labels[LabelFunction],
			Revision: rev, Addr: podAddr(p), Running: running(p)})
	}
	slices.SortFunc(out, func(a, b runtime.Listed) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Watch implements runtime.Watcher: the sandbox ends when its Pod fails or
// completes, is deleted by anyone but this worker, or cannot start; for a
// Pod an earlier worker created too.
func (r *Runtime) Watch(id string) (<-chan struct{}, func() error, bool) {
	sb := r.lookup(id)
	if sb == nil {
		return nil, nil, false
	}
	return sb.exited, r.exitError(sb), true
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

package fncontroller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config configures a Controller.
type Config struct {
	// REST reaches the kube-apiserver.
	REST *rest.Config
	// Brisk is the admin API client, with a token of the deploy scope
	// (admin to create missing brisk namespaces).
	Brisk *client.Client
	// Namespace is the one Kubernetes namespace to watch ("" = all).
	Namespace string
	// Workers reconcile objects in parallel (default 4).
	Workers int
	// Resync re-reads every object this often, retrying the ones brisk
	// refused, e.g. once the secret or the quota they lacked is there
	// (default 5m).
	Resync time.Duration
	// StatusInterval is how often brisk's functions are listed to bring
	// the objects' status up to date (ready sandboxes, conditions) and to
	// delete functions whose object is gone (default 5s).
	StatusInterval time.Duration
	// Domain is status.url's: http://NAME.NAMESPACE.DOMAIN (default
	// brisk.local; the data plane routes by the Host's first label).
	Domain string
	// CreateNamespaces creates a missing brisk namespace (with no quota)
	// for an object's Kubernetes namespace; it needs an admin token. Off
	// by default: a brisk namespace holds secrets, and whoever may create
	// Function objects in a Kubernetes namespace would get the brisk
	// namespace of that name, existing or new.
	CreateNamespaces bool
	// RetryBase and RetryMax bound the per-object back-off after a
	// failure brisk may get over (unreachable, not the leader); defaults
	// 200ms and 30s.
	RetryBase, RetryMax time.Duration
	Logger              *slog.Logger
}

// Controller keeps brisk's functions in step with Function objects.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	dyn   dynamic.Interface
	inf   cache.SharedIndexInformer
	queue workqueue.TypedRateLimitingInterface[string]

	// nsInf watches the Kubernetes Namespaces served: only those labelled
	// LabelNamespaceEnabled are.
	nsInf cache.SharedIndexInformer

	nsMu    sync.Mutex
	nsKnown map[string]bool // brisk namespaces seen to exist (dropped when brisk says otherwise)
}

// LabelNamespaceEnabled, with the value NamespaceEnabled on a Kubernetes
// Namespace, opts it in: the controller serves Function objects only in
// namespaces so labelled, as Kubernetes namespace NS is brisk namespace NS
// (its secrets, its quota) and the right to create objects in NS must not
// be enough to deploy into it.
const (
	LabelNamespaceEnabled = "brisk.dev/functions"
	NamespaceEnabled      = "enabled"
)

// AnnotationOrphan "true" on an object being deleted lets it go without
// deleting its brisk function: the escape when brisk refuses the deletion
// for good (the controller's token revoked) or is gone.
const AnnotationOrphan = "brisk.dev/orphan"

// namespacesGVR are the Kubernetes Namespaces.
var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// Condition reasons of the Ready condition.
const (
	ReasonDeployed     = "Deployed"
	ReasonInvalidSpec  = "InvalidSpec" // brisk's validation refused the spec (400)
	ReasonForbidden    = "Forbidden"   // a quota or the controller's token refused it (403)
	ReasonNameTaken    = "NameTaken"   // a brisk function of that name is not this object's
	ReasonUnavailable  = "Unavailable" // brisk could not be reached or failed; retried
	ReasonFailing      = "FunctionFailing"
	ReasonNoCapacity   = "NoCapacity"
	ReasonQuotaReached = "QuotaExceeded"
	// ReasonNamespaceNotEnabled: the Kubernetes namespace is not opted in
	// (LabelNamespaceEnabled); nothing is deployed.
	ReasonNamespaceNotEnabled = "NamespaceNotEnabled"
	// ReasonNamespaceMissing: the brisk namespace does not exist; retried
	// with back-off (it is created when CreateNamespaces is on).
	ReasonNamespaceMissing = "NamespaceMissing"
)

// maxMessage bounds a condition's message: brisk's errors are short, but
// the status must stay writable whatever they echo.
const maxMessage = 2048

// retryAfter is an error to retry after a fixed, long delay rather than
// the per-object back-off: brisk refused the controller itself (its
// token), which a quick retry will not change.
type retryAfter struct {
	err   error
	delay time.Duration
}

func (e *retryAfter) Error() string { return e.err.Error() }
func (e *retryAfter) Unwrap() error { return e.err }

// New checks cfg and makes a controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.REST == nil || cfg.Brisk == nil {
		return nil, errors.New("k8s functions: a Kubernetes REST config and a brisk client are required")
	}
	if cfg.Namespace != "" && !spec.ValidNamespace(cfg.Namespace) {
		return nil, fmt.Errorf("k8s functions: namespace %q is not a DNS label", cfg.Namespace)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 5 * time.Minute
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = 5 * time.Second
	}
	if cfg.Domain == "" {
		cfg.Domain = "brisk.local"
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = 200 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryBase {
		cfg.RetryMax = max(cfg.RetryBase, 30*time.Second)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dyn, err := dynamic.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("k8s functions: %w", err)
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, dyn: dyn, nsKnown: map[string]bool{}}
	// Per object, exponential back-off: a bad spec is not retried at all
	// (its condition says why), a failure brisk may get over is retried
	// ever more slowly up to RetryMax, never in a storm.
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryBase, cfg.RetryMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "brisk-functions"})
	return c, nil
}

func (c *Controller) res(ns string) dynamic.ResourceInterface {
	return c.dyn.Resource(GVR).Namespace(ns)
}

// Run watches Function objects until ctx ends. It fails at once when the
// CRD is not installed or the objects may not be listed.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if _, err := c.res(c.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("k8s functions: the %s CRD is not installed (kubectl apply -f deploy/kubernetes/function-crd.yaml): %w", GVR.GroupResource(), err)
		}
		return fmt.Errorf("k8s functions: listing %s: %w", GVR.GroupResource(), err)
	}
	var nsOpts metav1.ListOptions
	c.namespaceSelector(&nsOpts)
	if _, err := c.namespaces().List(ctx, nsOpts); err != nil {
		return fmt.Errorf("k8s functions: listing namespaces (the controller needs get, list and watch on them to see which are labelled %s=%s): %w",
			LabelNamespaceEnabled, NamespaceEnabled, err)
	}
	c.inf = dynInformer(c.dyn.Resource(GVR).Namespace(c.cfg.Namespace), c.cfg.Resync, nil)
	if _, err := c.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(o, n any) {
			if changed(o, n) {
				c.enqueue(n)
			}
		},
		// A deleted object had its brisk function deleted before its
		// finalizer went; one deleted without (finalizer removed by
		// hand) is found by the status loop.
	}); err != nil {
		return err
	}
	// Namespaces are cluster-scoped: with --namespace, watch just that one.
	c.nsInf = dynInformer(c.namespaces(), c.cfg.Resync, c.namespaceSelector)
	if _, err := c.nsInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.namespaceChanged,
		UpdateFunc: func(o, n any) {
			if enabledLabel(o) != enabledLabel(n) {
				c.namespaceChanged(n)
			}
		},
	}); err != nil {
		return err
	}
	var informers sync.WaitGroup
	defer informers.Wait()
	informers.Go(func() { c.inf.Run(ctx.Done()) })
	informers.Go(func() { c.nsInf.Run(ctx.Done()) })
	if !cache.WaitForCacheSync(ctx.Done(), c.inf.HasSynced, c.nsInf.HasSynced) {
		return ctx.Err()
	}
	c.log.Info("watching Function objects", "namespace", cmpOr(c.cfg.Namespace, "(all)"), "workers", c.cfg.Workers)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	wg.Go(func() { c.statusLoop(ctx) })
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

// dynInformer is an informer of one resource through the dynamic client,
// its list options tweaked by tweak (nil: none). dynamicinformer's factory
// would do the same but links every typed informer of client-go: about a
// third of a cold build's compile time (docs/benchmarks.md).
func dynInformer(ri dynamic.ResourceInterface, resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if tweak != nil {
				tweak(&o)
			}
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if tweak != nil {
				tweak(&o)
			}
			return ri.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

func (c *Controller) namespaceSelector(o *metav1.ListOptions) {
	if c.cfg.Namespace != "" {
		o.FieldSelector = "metadata.name=" + c.cfg.Namespace
	}
}

func (c *Controller) namespaces() dynamic.ResourceInterface {
	return c.dyn.Resource(namespacesGVR)
}

// enabledLabel is a Namespace's opt-in label value.
func enabledLabel(obj any) string {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.GetLabels()[LabelNamespaceEnabled]
	}
	return ""
}

// namespaceChanged queues the objects of a namespace that was opted in or
// out (and, at the start, of every namespace: a no-op for those already
// queued).
func (c *Controller) namespaceChanged(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || c.inf == nil {
		return
	}
	items, _ := c.inf.GetIndexer().ByIndex(cache.NamespaceIndex, u.GetName())
	for _, it := range items {
		c.enqueue(it)
	}
}

// served reports whether Kubernetes namespace ns is opted in.
func (c *Controller) served(ns string) bool {
	item, ok, err := c.nsInf.GetIndexer().GetByKey(ns)
	return err == nil && ok && enabledLabel(item) == NamespaceEnabled
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// changed reports whether an update needs a reconcile: a resync (same
// resource version), a new spec, a deletion or other annotations (kubectl
// annotate asks for a retry at once, say after the missing secret was
// created); not the controller's own writes (its finalizer, the status),
// which would make every object reconciled twice.
func changed(o, n any) bool {
	oo, ok1 := o.(*unstructured.Unstructured)
	no, ok2 := n.(*unstructured.Unstructured)
	if !ok1 || !ok2 {
		return true
	}
	return oo.GetResourceVersion() == no.GetResourceVersion() ||
		oo.GetGeneration() != no.GetGeneration() ||
		(no.GetDeletionTimestamp() != nil) != (oo.GetDeletionTimestamp() != nil) ||
		!maps.Equal(oo.GetAnnotations(), no.GetAnnotations())
}

func (c *Controller) enqueue(obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		c.queue.Add(key)
	}
}

// next reconciles one queued object; false once the queue shuts down.
func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.reconcile(ctx, key); err != nil {
		lvl := slog.LevelWarn
		if apierrors.IsConflict(err) {
			// The cache was behind the object (often our own last
			// write): read it again.
			lvl = slog.LevelDebug
		}
		c.log.Log(ctx, lvl, "function object not reconciled; retrying", "object", key, "retries", c.queue.NumRequeues(key), "err", err)
		var ra *retryAfter
		if errors.As(err, &ra) {
			c.queue.AddAfter(key, ra.delay)
			return true
		}
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// reconcile brings brisk and the object's status in step with the object.
// An error means retry later (with back-off); a spec brisk refuses is not
// an error but a condition.
func (c *Controller) reconcile(ctx context.Context, key string) error {
	item, exists, err := c.inf.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	obj := item.(*unstructured.Unstructured).DeepCopy()
	if obj.GetDeletionTimestamp() != nil {
		return c.finalize(ctx, obj)
	}
	if !c.served(obj.GetNamespace()) {
		// Nothing is deployed (a function deployed before the namespace
		// was opted out is left as it is, and deleted with its object).
		return c.writeStatus(ctx, obj, outcome{status: metav1.ConditionFalse, reason: ReasonNamespaceNotEnabled,
			message: fmt.Sprintf("Kubernetes namespace %q is not enabled for brisk functions: kubectl label namespace %s %s=%s (it is deployed into brisk namespace %q)",
				obj.GetNamespace(), obj.GetNamespace(), LabelNamespaceEnabled, NamespaceEnabled, obj.GetNamespace())})
	}
	if !slices.Contains(obj.GetFinalizers(), Finalizer) {
		obj.SetFinalizers(append(obj.GetFinalizers(), Finalizer))
		if obj, err = c.res(obj.GetNamespace()).Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("adding the finalizer: %w", err)
		}
	}
	out, retry := c.deploy(ctx, obj)
	if err := c.writeStatus(ctx, obj, out); err != nil {
		return err
	}
	return retry
}

// outcome is what a reconcile found: the Ready condition and, when the
// function is deployed, brisk's view of it.
type outcome struct {
	status          metav1.ConditionStatus
	reason, message string
	view            *api.FunctionView
}

// deploy creates or updates the object's brisk function. The error is
// one to retry; the outcome is always set.
func (c *Controller) deploy(ctx context.Context, obj *unstructured.Unstructured) (outcome, error) {
	key := objectKey(obj.GetNamespace(), obj.GetName())
	f, err := ToSpec(obj)
	if err == nil {
		err = f.Validate()
	}
	if err != nil {
		return outcome{status: metav1.ConditionFalse, reason: ReasonInvalidSpec, message: err.Error()}, nil
	}
	cur, err := c.cfg.Brisk.Get(ctx, f.Name)
	switch {
	case client.IsNotFound(err):
		if err := c.ensureNamespace(ctx, f.Namespace); err != nil {
			return refused(err)
		}
		if _, err := c.cfg.Brisk.Create(ctx, f); err != nil {
			return c.refusedIn(f.Namespace, err)
		}
		c.log.Info("function deployed", "object", key, "function", f.Name)
	case err != nil:
		return refused(err)
	case !owned(key, cur.Function):
		by := "the admin API"
		switch o := owner(cur.Function); {
		case o == key:
			// The label alone proves nothing: whoever deploys a function
			// can set it.
			by = "another client (it carries this object's label, but in another namespace)"
		case o != "":
			by = "Function " + o
		}
		return outcome{status: metav1.ConditionFalse, reason: ReasonNameTaken,
			message: fmt.Sprintf("brisk function %q exists in namespace %q, made by %s, not by this object", f.Name, cur.Namespace, by)}, nil
	case !sameSpec(f, cur.Function):
		if _, err := c.cfg.Brisk.Update(ctx, f); err != nil {
			return c.refusedIn(f.Namespace, err)
		}
		c.log.Info("function updated", "object", key, "function", f.Name)
	default:
		return outcomeOf(cur), nil
	}
	v, err := c.cfg.Brisk.Get(ctx, f.Name)
	if err != nil {
		return refused(err)
	}
	return outcomeOf(v), nil
}

// refused classifies a failed admin API call: brisk's refusals (400, 403)
// are conditions, not retried until the object (or the resync) asks again;
// anything else is retried with back-off.
func refused(err error) (outcome, error) {
	var e *client.Error
	if errors.As(err, &e) {
		switch e.Status {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return outcome{status: metav1.ConditionFalse, reason: ReasonInvalidSpec, message: e.Message}, nil
		case http.StatusForbidden, http.StatusUnauthorized:
			return outcome{status: metav1.ConditionFalse, reason: ReasonForbidden, message: e.Message}, nil
		}
	}
	return outcome{status: metav1.ConditionUnknown, reason: ReasonUnavailable, message: err.Error()}, err
}

// refusedIn is refused for a write into brisk namespace ns, which brisk
// may answer with the namespace missing: deleted since the controller saw
// it. Then it is forgotten (to be created again when the controller may)
// and the object retried with back-off, not left refused until the resync.
func (c *Controller) refusedIn(ns string, err error) (outcome, error) {
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest || !namespaceMissing(e.Message) {
		return refused(err)
	}
	c.nsMu.Lock()
	delete(c.nsKnown, ns)
	c.nsMu.Unlock()
	msg := e.Message
	if !c.cfg.CreateNamespaces {
		msg += "; retried until it exists"
	}
	return outcome{status: metav1.ConditionFalse, reason: ReasonNamespaceMissing, message: msg}, err
}

// namespaceMissing reports whether brisk's 400 says the function's
// namespace does not exist (internal/controlplane/admin/namespaces.go).
func namespaceMissing(msg string) bool {
	return strings.Contains(msg, "namespace: ") && strings.Contains(msg, "does not exist")
}

// outcomeOf is the Ready condition of a deployed function: true unless
// brisk has a condition for it (it serves from zero: no ready sandbox is
// not a failure).
func outcomeOf(v *api.FunctionView) outcome {
	o := outcome{status: metav1.ConditionTrue, reason: ReasonDeployed, view: v,
		message: fmt.Sprintf("revision %d: %d of %d sandboxes ready", v.Revision, v.Status.Ready, v.Status.Desired)}
	if v.Status.Condition != "" {
		o.status, o.message = metav1.ConditionFalse, v.Status.Message
		switch v.Status.Condition {
		case "function-failing":
			o.reason = ReasonFailing
		case "no-capacity":
			o.reason = ReasonNoCapacity
		case "quota-exceeded":
			o.reason = ReasonQuotaReached
		default:
			o.reason = camel(v.Status.Condition)
		}
	}
	return o
}

// camel turns a brisk condition ("no-capacity") into a reason
// ("NoCapacity").
func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(s, "-") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

// ensureNamespace creates brisk namespace ns when it is missing and the
// controller may. Without the right to list or create namespaces, the
// function's create says what is missing.
func (c *Controller) ensureNamespace(ctx context.Context, ns string) error {
	if ns == spec.DefaultNamespace || !c.cfg.CreateNamespaces {
		return nil
	}
	c.nsMu.Lock()
	known := c.nsKnown[ns]
	c.nsMu.Unlock()
	if known {
		return nil
	}
	nss, err := c.cfg.Brisk.Namespaces(ctx)
	if isForbidden(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(nss, func(v api.NamespaceView) bool { return v.Name == ns }) {
		if _, err := c.cfg.Brisk.PutNamespace(ctx, ns, spec.Quota{}); err != nil {
			if isForbidden(err) {
				return nil
			}
			return err
		}
		c.log.Info("brisk namespace created", "namespace", ns)
	}
	c.nsMu.Lock()
	c.nsKnown[ns] = true
	c.nsMu.Unlock()
	return nil
}

func isForbidden(err error) bool {
	var e *client.Error
	return errors.As(err, &e) && (e.Status == http.StatusForbidden || e.Status == http.StatusUnauthorized)
}

// finalize deletes the object's brisk function, if it is the object's,
// and then lets the object go. With AnnotationOrphan "true" it lets the
// object go and leaves brisk alone. While brisk refuses, the object's
// condition says why and how to let it go.
func (c *Controller) finalize(ctx context.Context, obj *unstructured.Unstructured) error {
	if !slices.Contains(obj.GetFinalizers(), Finalizer) {
		return nil
	}
	key := objectKey(obj.GetNamespace(), obj.GetName())
	if obj.GetAnnotations()[AnnotationOrphan] == "true" {
		c.log.Info("object let go, its brisk function left alone", "object", key, "annotation", AnnotationOrphan)
	} else if err := c.deleteFunction(ctx, obj); err != nil {
		o := outcome{status: metav1.ConditionUnknown, reason: ReasonUnavailable}
		var retry error = err
		if isForbidden(err) {
			// Retrying at the usual pace will not bring the token back.
			o.status, o.reason = metav1.ConditionFalse, ReasonForbidden
			retry = &retryAfter{err: err, delay: 10 * c.cfg.RetryMax}
		}
		o.message = fmt.Sprintf("%v; retried; to let the object go and leave the brisk function: kubectl annotate function %s -n %s %s=true",
			err, obj.GetName(), obj.GetNamespace(), AnnotationOrphan)
		if werr := c.writeStatus(ctx, obj, o); werr != nil {
			c.log.Debug("writing the status of an object being deleted", "object", key, "err", werr)
		}
		return retry
	}
	obj.SetFinalizers(slices.DeleteFunc(obj.GetFinalizers(), func(s string) bool { return s == Finalizer }))
	if _, err := c.res(obj.GetNamespace()).Update(ctx, obj, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the finalizer: %w", err)
	}
	return nil
}

// deleteFunction deletes the object's brisk function if it is the
// object's.
func (c *Controller) deleteFunction(ctx context.Context, obj *unstructured.Unstructured) error {
	key := objectKey(obj.GetNamespace(), obj.GetName())
	name := functionName(obj)
	cur, err := c.cfg.Brisk.Get(ctx, name)
	switch {
	case client.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("deleting the brisk function: %w", err)
	case owned(key, cur.Function):
		if err := c.cfg.Brisk.Delete(ctx, name); err != nil && !client.IsNotFound(err) {
			return fmt.Errorf("deleting the brisk function: %w", err)
		}
		c.log.Info("function deleted", "object", key, "function", name)
	}
	return nil
}

// statusFor is the object's status for outcome o.
func (c *Controller) statusFor(obj *unstructured.Unstructured, o outcome, now time.Time) map[string]any {
	gen := obj.GetGeneration()
	msg := o.message
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage], "") + "..."
	}
	cond := map[string]any{"type": "Ready", "status": string(o.status), "reason": o.reason, "message": msg,
		"observedGeneration": gen, "lastTransitionTime": now.UTC().Format(time.RFC3339)}
	// The transition time stays while the condition's status does.
	if old := readyCondition(obj); old != nil && old["status"] == cond["status"] {
		if t, ok := old["lastTransitionTime"].(string); ok {
			cond["lastTransitionTime"] = t
		}
	}
	st := map[string]any{"observedGeneration": gen, "briskNamespace": obj.GetNamespace(), "conditions": []any{cond}}
	if v := o.view; v != nil {
		st["revision"] = int64(v.Revision)
		st["readySandboxes"] = int64(v.Status.Ready)
		st["desiredSandboxes"] = int64(v.Status.Desired)
		st["url"] = "http://" + obj.GetName() + "." + obj.GetNamespace() + "." + c.cfg.Domain
	} else if old, ok := obj.Object["status"].(map[string]any); ok {
		// A failed update leaves the deployed revision serving: keep
		// showing it.
		for _, k := range []string{"revision", "readySandboxes", "desiredSandboxes", "url"} {
			if v, ok := old[k]; ok && o.reason != ReasonNameTaken {
				st[k] = v
			}
		}
	}
	return st
}

// refusedNow reports whether brisk refused the object's current spec.
func refusedNow(obj *unstructured.Unstructured) bool {
	r := readyCondition(obj)
	if r == nil {
		return false
	}
	gen, _ := r["observedGeneration"].(int64)
	switch r["reason"] {
	case ReasonInvalidSpec, ReasonForbidden, ReasonNameTaken:
		return gen == obj.GetGeneration()
	}
	return false
}

func readyCondition(obj *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" {
			return m
		}
	}
	return nil
}

// writeStatus writes the status for o unless the object has it already.
func (c *Controller) writeStatus(ctx context.Context, obj *unstructured.Unstructured, o outcome) error {
	st := c.statusFor(obj, o, time.Now())
	if equality.Semantic.DeepEqual(obj.Object["status"], st) {
		return nil
	}
	obj.Object["status"] = st
	if _, err := c.res(obj.GetNamespace()).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing the status: %w", err)
	}
	return nil
}

// statusLoop lists the controller's brisk functions every
// StatusInterval: it queues the objects whose status is behind brisk's
// (sandboxes ready, a condition, a function deleted behind the
// controller's back) and deletes functions whose object is gone.
func (c *Controller) statusLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.syncStatus(ctx); err != nil && ctx.Err() == nil {
			c.log.Debug("listing brisk's functions", "err", err)
		}
	}
}

func (c *Controller) syncStatus(ctx context.Context) error {
	views := map[string]*api.FunctionView{}
	opts := client.ListOptions{Labels: LabelObject, Limit: 1000}
	for {
		page, next, err := c.cfg.Brisk.ListPage(ctx, opts)
		if err != nil {
			return err
		}
		for i := range page {
			if k := owner(page[i].Function); k != "" && owned(k, page[i].Function) {
				views[k] = &page[i]
			}
		}
		if next == "" {
			break
		}
		opts.Continue = next
	}
	idx := c.inf.GetIndexer()
	for _, item := range idx.List() {
		obj := item.(*unstructured.Unstructured)
		key := objectKey(obj.GetNamespace(), obj.GetName())
		v, ok := views[key]
		delete(views, key)
		switch {
		case obj.GetDeletionTimestamp() != nil, !c.served(obj.GetNamespace()):
		case ok && v.Name == functionName(obj):
			if refusedNow(obj) {
				// Its last spec was refused (the function serves the
				// revision before): retried on a change or the resync,
				// not every interval.
				continue
			}
			if !equality.Semantic.DeepEqual(obj.Object["status"], c.statusFor(obj, outcomeOf(v), time.Now())) {
				c.queue.Add(key)
			}
		default:
			// No function of its own though it was deployed: deleted
			// behind the controller's back (through the admin API).
			if r := readyCondition(obj); r != nil && r["status"] == string(metav1.ConditionTrue) {
				c.queue.Add(key)
			}
		}
	}
	// What is left are functions whose object the cache does not have:
	// deleted without the finalizer's help.
	for key, v := range views {
		ns, name, _ := strings.Cut(key, "/")
		name = spec.Qualify(name, ns)
		if (c.cfg.Namespace != "" && ns != c.cfg.Namespace) || v.Name != name {
			continue // not this controller's to judge
		}
		if _, err := c.res(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			continue // there after all (the cache lags), or unknown
		}
		if err := c.cfg.Brisk.Delete(ctx, name); err != nil && !client.IsNotFound(err) {
			c.log.Warn("deleting a function whose object is gone", "object", key, "err", err)
			continue
		}
		c.log.Info("function deleted: its object is gone", "object", key, "function", name)
	}
	return nil
}

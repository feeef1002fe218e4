package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Client-side rate limits when the REST config sets none. client-go's
// defaults (5 QPS, burst 10) would make the client, not the apiserver, the
// bottleneck of a scale-up: one Create is one request, and many workers may
// share the client.
const (
	DefaultQPS   = 5000
	DefaultBurst = 5000
)

// nodeIndex indexes the cache by worker node (owner: spec.nodeName, or
// the scheduler-placed Pods' AnnotationWorkerNode): each Runtime lists its
// node's Pods without scanning every node's.
const nodeIndex = "node"

// SharedConfig configures a Shared.
type SharedConfig struct {
	// REST reaches the kube-apiserver. It is copied; a zero QPS or Burst
	// becomes DefaultQPS or DefaultBurst.
	REST *rest.Config
	// Namespace holds the Pods of every Runtime on this Shared. Required.
	Namespace string
	// Logger receives the informer's troubles. Default: discard.
	Logger *slog.Logger
}

// Shared is the API client and the Pod informer that the Runtimes of one
// process share: one watch of brisk's Pods in the namespace, whatever the
// number of nodes the process stands for, and events dispatched to the
// Runtime of each Pod's node by a map lookup rather than by every Runtime
// filtering every event.
type Shared struct {
	client    corev1client.CoreV1Interface
	namespace string
	log       *slog.Logger
	informer  cache.SharedIndexInformer
	pods      corelisters.PodNamespaceLister
	stop      chan struct{}
	running   sync.WaitGroup // the informer
	closeOnce sync.Once

	mu    sync.Mutex
	nodes map[string]*Runtime
}

// NewShared connects to the apiserver, starts the informer and waits, as
// long as ctx allows, until its cache holds every brisk Pod of the
// namespace: a Runtime's List is then complete from the start, which is
// what lets a restarted worker adopt its Pods.
func NewShared(ctx context.Context, cfg SharedConfig) (*Shared, error) {
	switch {
	case cfg.REST == nil:
		return nil, errors.New("kube runtime: REST config is required")
	case cfg.Namespace == "":
		return nil, errors.New("kube runtime: Namespace is required")
	}
	rc := rest.CopyConfig(cfg.REST)
	if rc.QPS == 0 {
		rc.QPS = DefaultQPS
	}
	if rc.Burst == 0 {
		rc.Burst = DefaultBurst
	}
	if rc.ContentType == "" {
		// Protobuf, as Kubernetes' own components speak it (smaller
		// watch events). BenchmarkKubeDirect showed no difference from
		// JSON beyond its noise on 2 cores (docs/benchmarks.md).
		rc.ContentType = "application/vnd.kubernetes.protobuf"
		rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	if rc.WarningHandler == nil {
		rc.WarningHandler = &onceWarnings{log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))}
	}
	// The core group's client alone: the full clientset (and its
	// informer factory) compiles ~60 s more of CPU, a third of a cold
	// build's (docs/benchmarks.md), for groups brisk never uses.
	client, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube runtime: %w", err)
	}
	s := &Shared{
		client:    client,
		namespace: cfg.Namespace,
		log:       cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
		stop:      make(chan struct{}),
		nodes:     map[string]*Runtime{},
	}
	pods := client.Pods(cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = Selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = Selector
			return pods.Watch(ctx, o)
		},
	}
	s.informer = cache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, cache.SharedIndexInformerOptions{
		Indexers: cache.Indexers{
			cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
			nodeIndex: func(obj any) ([]string, error) {
				if p, ok := obj.(*corev1.Pod); ok && owner(p) != "" {
					return []string{owner(p)}, nil
				}
				return nil, nil
			},
		},
	})
	if err := s.informer.SetTransform(stripPod); err != nil {
		return nil, fmt.Errorf("kube runtime: %w", err)
	}
	s.pods = corelisters.NewPodLister(s.informer.GetIndexer()).Pods(cfg.Namespace)
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.dispatch(obj, false) },
		UpdateFunc: func(_, obj any) { s.dispatch(obj, false) },
		DeleteFunc: func(obj any) { s.dispatch(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("kube runtime: %w", err)
	}
	s.running.Go(func() { s.informer.Run(s.stop) })
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		s.Close()
		return nil, fmt.Errorf("kube runtime: Pod informer of namespace %s did not sync: %w", cfg.Namespace, cmp.Or(ctx.Err(), context.Canceled))
	}
	return s, nil
}

// stripPod drops what the runtime never reads from cached Pods (managed
// fields are often the biggest part of an object), for the memory of a
// process that stands for many nodes.
func stripPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

// Client is the API client, with the raised rate limits.
func (s *Shared) Client() corev1client.CoreV1Interface { return s.client }

// Namespace is where the Pods are.
func (s *Shared) Namespace() string { return s.namespace }

// Close stops the informer. The Pods keep running; the Runtimes on s
// should not be used any more.
func (s *Shared) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.running.Wait()
	})
}

// dispatch hands an informer event to the Runtime of the Pod's worker
// node.
func (s *Shared) dispatch(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		// The informer missed the delete (a watch gap) and learned it
		// from a relist: the last state it knew.
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	s.mu.Lock()
	r := s.nodes[owner(p)]
	s.mu.Unlock()
	if r != nil {
		r.observe(p, deleted)
	}
}

func (s *Shared) register(r *Runtime) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[r.node] != nil {
		return fmt.Errorf("kube runtime: node %s already has a runtime on this Shared", r.node)
	}
	s.nodes[r.node] = r
	return nil
}

func (s *Shared) unregister(r *Runtime) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[r.node] == r {
		delete(s.nodes, r.node)
	}
}

// onceWarnings logs each distinct warning of the apiserver once (a Pod
// Security "warn" level answers every Pod's create with the same one),
// instead of client-go's default of printing each to stderr.
type onceWarnings struct {
	log  *slog.Logger
	seen sync.Map
}

func (w *onceWarnings) HandleWarningHeader(code int, _ string, text string) {
	if code != 299 || text == "" {
		return
	}
	if _, dup := w.seen.LoadOrStore(text, true); !dup {
		w.log.Warn("the kube-apiserver warns (logged once)", "warning", text)
	}
}

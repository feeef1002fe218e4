package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// PodServer stands in for the containers of the Pods KWOK runs: it
// listens on each running Pod's IP and container ports (loopback: the
// nodes' pod CIDRs are) and answers HTTP there while, and only while, the
// apiserver has the Pod running. Each request asks the apiserver, not a
// cache, so a Pod that a Kill has deleted stops answering the moment the
// Kill returns, with no race against an informer; while the apiserver does
// not answer at all, a Pod last seen running answers.
type PodServer struct {
	c         *Cluster
	namespace string
	t         testing.TB

	mu        sync.Mutex
	listeners map[string]*podListener // by "ip:port"
	closed    bool
}

type podListener struct {
	srv *http.Server
	pod types.NamespacedName
	uid types.UID
}

// ServePods serves the running Pods of namespace until the test ends.
func (c *Cluster) ServePods(t testing.TB, namespace string) *PodServer {
	t.Helper()
	s := &PodServer{c: c, namespace: namespace, t: t, listeners: map[string]*podListener{}}
	f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(namespace))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.sync(obj, false) },
		UpdateFunc: func(_, obj any) { s.sync(obj, false) },
		DeleteFunc: func(obj any) { s.sync(obj, true) },
	}); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	stop := make(chan struct{})
	f.Start(stop)
	t.Cleanup(func() {
		close(stop)
		f.Shutdown()
		s.mu.Lock()
		s.closed = true
		ls := s.listeners
		s.listeners = nil
		s.mu.Unlock()
		for _, l := range ls {
			_ = l.srv.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatalf("kubecluster: pod informer of %s did not sync", namespace)
	}
	return s
}

// sync opens the listeners of a running Pod and closes those of a Pod that
// no longer runs. A listener whose address another Pod has taken since
// (KWOK reuses IPs) answers for the new one.
func (s *PodServer) sync(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	live := !deleted && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	ip, err := netip.ParseAddr(p.Status.PodIP)
	if err != nil || !ip.IsLoopback() {
		// Never listen elsewhere than on loopback (nor would this machine
		// reach a Pod IP that is not its own).
		return
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
				continue
			}
			addr := net.JoinHostPort(ip.String(), strconv.Itoa(int(port.ContainerPort)))
			l := s.listeners[addr]
			switch {
			case live && l == nil:
				s.listen(addr, key, p.UID)
			case live:
				l.pod, l.uid = key, p.UID
			case l != nil && l.uid == p.UID:
				_ = l.srv.Close()
				delete(s.listeners, addr)
			}
		}
	}
}

// listen binds addr for Pod key. The caller holds s.mu.
func (s *PodServer) listen(addr string, key types.NamespacedName, uid types.UID) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.t.Logf("kubecluster: cannot serve pod %s at %s: %v", key, addr, err)
		return
	}
	l := &podListener{pod: key, uid: uid}
	l.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		pod, uid := l.pod, l.uid
		s.mu.Unlock()
		if err := s.running(r.Context(), pod, uid); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprintf(w, "pod %s\n", pod)
	})}
	s.listeners[addr] = l
	go func() {
		if err := l.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.t.Logf("kubecluster: serving pod %s at %s: %v", key, addr, err)
		}
	}()
}

// running asks the apiserver whether the Pod still runs.
func (s *PodServer) running(ctx context.Context, key types.NamespacedName, uid types.UID) error {
	p, err := s.c.Client.CoreV1().Pods(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("pod %s does not exist", key)
	case err != nil:
		if _, answered := err.(apierrors.APIStatus); answered || errors.As(err, new(apierrors.APIStatus)) {
			return err
		}
		// No answer (the apiserver crashed or restarts): the container
		// runs on, as a real one does without its control plane. The
		// listener exists only while the Pod was last seen running.
		return nil
	case p.UID != uid:
		return fmt.Errorf("pod %s is another pod now", key)
	case p.DeletionTimestamp != nil:
		return fmt.Errorf("pod %s is being deleted", key)
	case p.Status.Phase != corev1.PodRunning:
		return fmt.Errorf("pod %s is %s", key, p.Status.Phase)
	}
	return nil
}

// Serving is the addresses the server listens on.
func (s *PodServer) Serving() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.listeners))
	for a := range s.listeners {
		out = append(out, a)
	}
	return out
}

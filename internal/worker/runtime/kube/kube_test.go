package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// wait bounds the waits of these tests; it only bounds failing ones.
const wait = time.Minute

// TestKube runs the runtime against a real kube-apiserver and etcd, with
// KWOK nodes playing the kubelets; one cluster for all its subtests, each
// in a namespace of its own. The runtime authenticates as an ordinary user
// with only Role's rights, which proves they are enough.
func TestKube(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Nodes: 3})
	port := testutil.FreePort(t) // the functions' port on their 127.x Pod IPs
	fn := func(name string) *spec.Function {
		f := &spec.Function{Name: name, Image: "example.invalid/brisk/echo:v1", Port: port, Revision: 3}
		f.ApplyDefaults()
		return f
	}
	env := func(t *testing.T, ns string) {
		c.Namespace(t, ns)
		grantWorker(t, c, ns)
		c.ServePods(t, ns)
	}

	t.Run("Conformance", func(t *testing.T) {
		ns := "conformance"
		env(t, ns)
		node := c.Nodes[0]
		outer := t
		runtimetest.Run(t, runtimetest.Harness{
			// Each runtime is on a Shared of its own, as in a new worker
			// process; the Shareds close when the whole suite ends,
			// after its cases' cleanups have killed their sandboxes.
			New: func(t *testing.T, _ string) runtime.Runtime {
				return newRuntime(outer, c.WorkerConfig(), ns, node)
			},
			Function: func(*testing.T) *spec.Function { return fn("conformance") },
			Failing: func(*testing.T) *spec.Function {
				f := fn("conformance-crash")
				f.Labels = map[string]string{kubecluster.FailLabel: "true"}
				return f
			},
			// What the runtime holds is Pods: those of the suite's
			// sandboxes, asked of the apiserver rather than of a cache.
			Leaks: func(t *testing.T, _ string) []string {
				pods, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
				if err != nil {
					t.Fatalf("Leaks: %v", err)
				}
				var out []string
				for _, p := range pods.Items {
					if strings.HasPrefix(p.Name, runtimetest.IDPrefix) {
						out = append(out, "pod "+p.Name+" on "+p.Spec.NodeName)
					}
				}
				return out
			},
			Restartable: true,
			// No Secrets: the runtime refuses functions with secrets
			// (TestPodForRefuses) until it mounts Kubernetes Secrets.
		})
	})

	t.Run("CreateMakesBoundRunningPod", func(t *testing.T) {
		ns := "create"
		env(t, ns)
		rt := newRuntime(t, c.WorkerConfig(), ns, c.Nodes[1])
		inst := create(t, rt, "create-1", fn("visible"))
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "create-1", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the Pod of a created sandbox: %v", err)
		}
		if p.Spec.NodeName != c.Nodes[1] || p.Status.Phase != corev1.PodRunning {
			t.Errorf("Pod on node %q in phase %s, want node %s and Running", p.Spec.NodeName, p.Status.Phase, c.Nodes[1])
		}
		if want := fmt.Sprintf("%s:%d", p.Status.PodIP, port); inst.Addr != want {
			t.Errorf("Addr %s, want the Pod's IP and the function's port %s", inst.Addr, want)
		}
		if p.Labels[LabelFunction] != "visible" || p.Labels[LabelRevision] != "3" || p.Labels[LabelSandbox] != "create-1" {
			t.Errorf("labels %v", p.Labels)
		}
		if err := runtime.WaitReady(ctxT(t), inst.Addr, inst.Exited); err != nil {
			t.Errorf("the Pod's address does not answer: %v", err)
		}
		t.Run("kubectl", func(t *testing.T) {
			out := c.Kubectl(t, "get", "pods", "-n", ns, "-o", "wide", "-l", Selector)
			if !strings.Contains(out, "create-1") || !strings.Contains(out, "Running") || !strings.Contains(out, c.Nodes[1]) {
				t.Errorf("kubectl does not show the Pod running on %s:\n%s", c.Nodes[1], out)
			}
		})
	})

	t.Run("KillDeletesPod", func(t *testing.T) {
		ns := "kill"
		env(t, ns)
		rt := newRuntime(t, c.WorkerConfig(), ns, c.Nodes[1])
		inst := create(t, rt, "kill-1", fn("kill"))
		if err := rt.Kill(ctxT(t), "kill-1"); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		_, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "kill-1", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("the Pod after Kill returned: %v, want NotFound", err)
		}
		awaitExit(t, inst.Exited)
		if err := inst.ExitErr(); !errors.Is(err, runtime.ErrKilled) {
			t.Errorf("ExitErr after Kill = %v, want ErrKilled", err)
		}
	})

	t.Run("PodDeletedByHandIsReported", func(t *testing.T) {
		ns := "by-hand"
		env(t, ns)
		rt := newRuntime(t, c.WorkerConfig(), ns, c.Nodes[1])
		inst := create(t, rt, "hand-1", fn("hand"))
		exited, why, ok := rt.Watch("hand-1")
		if !ok {
			t.Fatal("Watch of a created sandbox: not ok")
		}
		if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), "hand-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		awaitExit(t, exited)
		awaitExit(t, inst.Exited)
		err := why()
		if err == nil || errors.Is(err, runtime.ErrKilled) || !strings.Contains(err.Error(), "deleted, not by this worker") {
			t.Errorf("ExitErr of a Pod deleted by hand = %v, want one saying so (and not ErrKilled)", err)
		}
		t.Logf("ExitErr: %v", err)
		// The worker then kills it: that finishes quietly, and nothing of
		// it is left or listed running.
		if err := rt.Kill(ctxT(t), "hand-1"); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Kill after the Pod was deleted by hand: %v", err)
		}
		if err2 := why(); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("Kill rewrote ExitErr from %v to %v", err, err2)
		}
		if l := list(t, rt); len(l) != 0 {
			t.Errorf("List after the Pod was deleted and killed: %+v", l)
		}
	})

	t.Run("RestartAdoptsPods", func(t *testing.T) {
		ns := "restart"
		env(t, ns)
		node := c.Nodes[2]
		// The first worker process: its own Shared, as after a restart
		// the next one has.
		sh1 := newShared(t, c.WorkerConfig(), ns)
		rt1, err := sh1.Runtime(Config{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{"restart-1", "restart-2", "restart-3"}
		addrs := map[string]string{}
		for _, id := range ids {
			addrs[id] = create(t, rt1, id, fn("restart")).Addr
		}
		// A Pod of another node, in the same namespace, is not this
		// node's to adopt.
		other := newRuntime(t, c.WorkerConfig(), ns, c.Nodes[1])
		create(t, other, "restart-elsewhere", fn("restart"))
		rt1.Close()
		sh1.Close()
		// While no worker runs, one Pod is deleted: it must not come back.
		if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), "restart-3", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, wait, func() bool {
			_, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "restart-3", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, "restart-3 deleted")

		rt2 := newRuntime(t, c.WorkerConfig(), ns, node)
		l := list(t, rt2)
		want := []runtime.Listed{
			{ID: "restart-1", Function: "restart", Revision: 3, Addr: addrs["restart-1"], Running: true},
			{ID: "restart-2", Function: "restart", Revision: 3, Addr: addrs["restart-2"], Running: true},
		}
		if fmt.Sprint(l) != fmt.Sprint(want) {
			t.Errorf("List after the restart = %+v, want %+v", l, want)
		}
		for _, id := range []string{"restart-1", "restart-2"} {
			exited, _, ok := rt2.Watch(id)
			if !ok || exited == nil {
				t.Errorf("Watch(%s) after the restart: not watchable", id)
			}
		}
		if _, _, ok := rt2.Watch("restart-3"); ok {
			t.Error("Watch of the Pod deleted while no worker ran: ok")
		}
		// Adopting created nothing: the namespace holds the same Pods.
		pods, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Name)
		}
		if got := strings.Join(names, ","); got != "restart-1,restart-2,restart-elsewhere" {
			t.Errorf("Pods after the restart: %s", got)
		}
		// A Create of an adopted id is refused: no duplicate.
		if _, err := rt2.Create(ctxT(t), runtime.Spec{ID: "restart-1", Function: fn("restart")}); err == nil {
			t.Error("Create of an adopted sandbox's id succeeded")
		}
		exited, why, _ := rt2.Watch("restart-1")
		if err := rt2.Kill(ctxT(t), "restart-1"); err != nil {
			t.Fatalf("Kill of an adopted sandbox: %v", err)
		}
		awaitExit(t, exited)
		if err := why(); !errors.Is(err, runtime.ErrKilled) {
			t.Errorf("ExitErr of the adopted sandbox after Kill = %v", err)
		}
		if l := list(t, rt2); len(l) != 1 || l[0].ID != "restart-2" {
			t.Errorf("List after killing restart-1: %+v", l)
		}
	})

	t.Run("OneSharedManyNodes", func(t *testing.T) {
		ns := "shared"
		env(t, ns)
		sh := newShared(t, c.WorkerConfig(), ns)
		rts := map[string]*Runtime{}
		for _, node := range c.Nodes {
			rt, err := sh.Runtime(Config{Node: node})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rt.Close() })
			rts[node] = rt
		}
		if _, err := sh.Runtime(Config{Node: c.Nodes[0]}); err == nil {
			t.Error("a second Runtime for one node on one Shared was accepted")
		}
		// Concurrently, as a worker process standing for many nodes does.
		var wg sync.WaitGroup
		errs := make(chan error, 3*len(c.Nodes))
		for i, node := range c.Nodes {
			for j := range 3 {
				wg.Go(func() {
					_, err := rts[node].Create(ctxT(t), runtime.Spec{ID: fmt.Sprintf("shared-%d-%d", i, j), Function: fn("shared")})
					errs <- err
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		for i, node := range c.Nodes {
			l := list(t, rts[node])
			if len(l) != 3 {
				t.Errorf("node %s lists %d sandboxes, want its 3: %+v", node, len(l), l)
			}
			for _, s := range l {
				if !strings.HasPrefix(s.ID, fmt.Sprintf("shared-%d-", i)) || !s.Running {
					t.Errorf("node %s lists %+v", node, s)
				}
			}
		}
	})

	t.Run("CreateGivesUpOnNodeWithoutKubelet", func(t *testing.T) {
		ns := "no-kubelet"
		env(t, ns)
		// A node no kubelet (nor KWOK) runs for: its Pods stay Pending.
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "no-kubelet"}}
		if _, err := c.Client.CoreV1().Nodes().Create(ctxT(t), node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rt := newRuntime(t, c.WorkerConfig(), ns, "no-kubelet")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		inst, err := rt.Create(ctx, runtime.Spec{ID: "stuck-1", Function: fn("stuck")})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Create on a node without a kubelet = %+v, %v; want an error wrapping its ctx's", inst, err)
		}
		// Nothing is left: the Pod is gone from the apiserver when Create
		// returns, and the id is free again.
		if _, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "stuck-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the Pod of the failed Create: %v, want NotFound", err)
		}
		if l := list(t, rt); len(l) != 0 {
			t.Errorf("List after the failed Create: %+v", l)
		}
		if _, _, ok := rt.Watch("stuck-1"); ok {
			t.Error("the failed sandbox is watchable")
		}
	})

	t.Run("ResourceQuotaCounts", func(t *testing.T) {
		ns := "quota"
		env(t, ns)
		quotaPods(t, c, ns, 2)
		rt := newRuntime(t, c.WorkerConfig(), ns, c.Nodes[1])
		create(t, rt, "quota-1", fn("quota"))
		create(t, rt, "quota-2", fn("quota"))
		_, err := rt.Create(ctxT(t), runtime.Spec{ID: "quota-3", Function: fn("quota")})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") {
			t.Errorf("Create beyond the quota = %v, want the apiserver's refusal", err)
		}
		if l := list(t, rt); len(l) != 2 {
			t.Errorf("List after the refused Create: %+v", l)
		}
		if _, _, ok := rt.Watch("quota-3"); ok {
			t.Error("the refused sandbox is watchable")
		}
	})
}

// grantWorker lets kubecluster.WorkerUser do in ns what Role allows.
func grantWorker(t *testing.T, c *kubecluster.Cluster, ns string) {
	t.Helper()
	ctx := ctxT(t)
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, Role(ns, "brisk-worker"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "brisk-worker", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "brisk-worker"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubecluster.WorkerUser}},
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// quotaPods limits ns to n Pods. The quota controller (in the controller
// manager, not run here) would fill in the quota's status; without a
// status the admission plugin refuses every Pod, so the test sets it.
func quotaPods(t *testing.T, c *kubecluster.Cluster, ns string, n int64) {
	t.Helper()
	ctx := ctxT(t)
	hard := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(n, resource.DecimalSI)}
	q, err := c.Client.CoreV1().ResourceQuotas(ns).Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if _, err := c.Client.CoreV1().ResourceQuotas(ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func newShared(t *testing.T, rc *rest.Config, ns string) *Shared {
	t.Helper()
	sh, err := NewShared(ctxT(t), SharedConfig{REST: rc, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sh.Close)
	return sh
}

// newRuntime is a node's runtime on a Shared of its own, closed when t
// ends.
func newRuntime(t *testing.T, rc *rest.Config, ns, node string) *Runtime {
	t.Helper()
	// The harness's KWOK fail label is allowed onto the Pods (KeyPrefixes).
	prefix, _, _ := strings.Cut(kubecluster.FailLabel, "/")
	rt, err := newShared(t, rc, ns).Runtime(Config{Node: node, KeyPrefixes: []string{prefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func create(t *testing.T, rt *Runtime, id string, f *spec.Function) *runtime.Instance {
	t.Helper()
	inst, err := rt.Create(ctxT(t), runtime.Spec{ID: id, Function: f})
	if err != nil {
		t.Fatalf("Create %s: %v", id, err)
	}
	if inst.ID != id || inst.Addr == "" || inst.Exited == nil || inst.ExitErr == nil {
		t.Fatalf("Create %s = %+v", id, inst)
	}
	return inst
}

func list(t *testing.T, rt *Runtime) []runtime.Listed {
	t.Helper()
	l, err := rt.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func awaitExit(t *testing.T, exited <-chan struct{}) {
	t.Helper()
	select {
	case <-exited:
	case <-time.After(wait):
		t.Fatalf("the sandbox has not ended %v later", wait)
	}
}

// ctxT is a context that ends with the test, bounded by wait.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	t.Cleanup(cancel)
	return ctx
}

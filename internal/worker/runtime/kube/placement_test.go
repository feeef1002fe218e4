package kube

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestKubeScheduler runs the runtime with PlaceScheduler against a real
// kube-scheduler: the Pods are created unbound and placed by it, the
// runtime learns where from the informer, and Kill, List and adoption by a
// restarted worker work as with bound Pods.
func TestKubeScheduler(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Nodes: 2})
	c.StartControllers(t, 0)
	c.Schedulable(t)
	port := testutil.FreePort(t)
	fn := func(name string) *spec.Function {
		f := &spec.Function{Name: name, Image: "example.invalid/brisk/echo:v1", Port: port, Revision: 1}
		f.ApplyDefaults()
		return f
	}
	env := func(t *testing.T, ns string) {
		c.Namespace(t, ns)
		grantWorker(t, c, ns)
		c.ServePods(t, ns)
	}
	const unschedGrace = 500 * time.Millisecond
	scheduled := func(t *testing.T, sh *Shared, node string, nodes ...string) *Runtime {
		t.Helper()
		rt, err := sh.Runtime(Config{Node: node, Placement: PlaceScheduler, Nodes: nodes, UnschedulableGrace: unschedGrace})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}

	t.Run("PlacedKilledAdopted", func(t *testing.T) {
		ns := "sched"
		env(t, ns)
		target := c.Nodes[1]
		sh1 := newShared(t, c.WorkerConfig(), ns)
		rt1 := scheduled(t, sh1, "brisk-cluster", target)
		addrs := map[string]string{}
		for _, id := range []string{"sched-1", "sched-2"} {
			inst := create(t, rt1, id, fn("sched"))
			addrs[id] = inst.Addr
			p, err := c.Client.CoreV1().Pods(ns).Get(ctxT(t), id, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The scheduler bound it (the affinity allows one node), and
			// it carries the worker node's name.
			if p.Spec.NodeName != target || p.Annotations[AnnotationWorkerNode] != "brisk-cluster" {
				t.Errorf("pod %s on node %q, worker node %q; want %s, brisk-cluster", id, p.Spec.NodeName, p.Annotations[AnnotationWorkerNode], target)
			}
			if want := fmt.Sprintf("%s:%d", p.Status.PodIP, port); inst.Addr != want {
				t.Errorf("Addr %s, want the Pod's %s", inst.Addr, want)
			}
			if err := runtime.WaitReady(ctxT(t), inst.Addr, inst.Exited); err != nil {
				t.Errorf("the Pod's address does not answer: %v", err)
			}
		}
		// A bound runtime for the Kubernetes node the Pods run on does
		// not see them: they are the worker node's.
		if l := list(t, newRuntime(t, c.WorkerConfig(), ns, target)); len(l) != 0 {
			t.Errorf("node %s's bound runtime lists the scheduler-placed Pods: %+v", target, l)
		}
		rt1.Close()
		sh1.Close()

		// A restarted worker adopts both; a Kill deletes one.
		rt2 := scheduled(t, newShared(t, c.WorkerConfig(), ns), "brisk-cluster", target)
		l := list(t, rt2)
		want := []runtime.Listed{
			{ID: "sched-1", Function: "sched", Revision: 1, Addr: addrs["sched-1"], Running: true},
			{ID: "sched-2", Function: "sched", Revision: 1, Addr: addrs["sched-2"], Running: true},
		}
		if fmt.Sprint(l) != fmt.Sprint(want) {
			t.Errorf("List after the restart = %+v, want %+v", l, want)
		}
		exited, why, ok := rt2.Watch("sched-1")
		if !ok {
			t.Fatal("Watch of an adopted sandbox: not ok")
		}
		if err := rt2.Kill(ctxT(t), "sched-1"); err != nil {
			t.Fatalf("Kill of an adopted sandbox: %v", err)
		}
		awaitExit(t, exited)
		if err := why(); !errors.Is(err, runtime.ErrKilled) {
			t.Errorf("ExitErr after Kill = %v", err)
		}
		if _, err := c.Client.CoreV1().Pods(ns).Get(ctxT(t), "sched-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the killed Pod: %v, want NotFound", err)
		}
		if l := list(t, rt2); len(l) != 1 || l[0].ID != "sched-2" {
			t.Errorf("List after the Kill: %+v", l)
		}
	})

	// A Pod the scheduler cannot place fails its Create once it has been
	// unschedulable for the grace (room may come: a cluster autoscaler's
	// node, a preemption), not at the first refusal nor at the timeout.
	t.Run("UnschedulableFailsAfterGrace", func(t *testing.T) {
		ns := "nowhere"
		env(t, ns)
		rt := scheduled(t, newShared(t, c.WorkerConfig(), ns), "brisk-nowhere", "no-such-node", "nor-this-one")
		t0 := time.Now()
		_, err := rt.Create(ctxT(t), runtime.Spec{ID: "nowhere-1", Function: fn("nowhere")})
		if err == nil || !strings.Contains(err.Error(), "cannot be scheduled") {
			t.Fatalf("Create with no node to place on = %v, want the scheduler's refusal", err)
		}
		if took := time.Since(t0); took < unschedGrace {
			t.Errorf("Create failed after %v, before the unschedulable grace %v", took, unschedGrace)
		}
		t.Logf("Create: %v", err)
		if _, err := c.Client.CoreV1().Pods(ns).Get(ctxT(t), "nowhere-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the Pod of the failed Create: %v, want NotFound", err)
		}
	})

	// A quota on requested CPU counts the Pods' requests (the function's
	// resources): two fit, the third is refused at once.
	t.Run("QuotaCountsRequests", func(t *testing.T) {
		ns := "sched-quota"
		env(t, ns)
		hard := corev1.ResourceList{corev1.ResourceRequestsCPU: resource.MustParse("250m")}
		q, err := c.Client.CoreV1().ResourceQuotas(ns).Create(ctxT(t), &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "cpu"}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The quota controller does not run (StartControllers runs the
		// Deployment and ReplicaSet ones): set the status it would.
		q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: corev1.ResourceList{corev1.ResourceRequestsCPU: resource.MustParse("0")}}
		if _, err := c.Client.CoreV1().ResourceQuotas(ns).UpdateStatus(ctxT(t), q, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		rt := scheduled(t, newShared(t, c.WorkerConfig(), ns), "brisk-quota")
		f := fn("quota")
		f.Resources.MilliCPU = 100
		create(t, rt, "cpu-1", f)
		create(t, rt, "cpu-2", f)
		_, err = rt.Create(ctxT(t), runtime.Spec{ID: "cpu-3", Function: f})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") {
			t.Errorf("Create beyond the quota = %v, want the apiserver's refusal", err)
		}
		q, err = c.Client.CoreV1().ResourceQuotas(ns).Get(ctxT(t), "cpu", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if used := q.Status.Used[corev1.ResourceRequestsCPU]; used.MilliValue() != 200 {
			t.Errorf("quota used %s of requests.cpu, want the two Pods' 200m", used.String())
		}
	})

	t.Run("NodesCapacity", func(t *testing.T) {
		env(t, "sched-nodes")
		sh := newShared(t, c.WorkerConfig(), "sched-nodes")
		// The worker's Role gives no access to nodes: least privilege
		// until NodeReaderRole is granted.
		if _, err := NodesCapacity(ctxT(t), sh.Client(), nil); !apierrors.IsForbidden(err) {
			t.Errorf("NodesCapacity without NodeReaderRole = %v, want Forbidden", err)
		}
		c.GrantClusterRole(t, NodeReaderRole("brisk-node-reader"), kubecluster.WorkerUser)
		var all Capacity
		testutil.Eventually(t, wait, func() bool { // RBAC applies within moments
			var err error
			all, err = NodesCapacity(ctxT(t), sh.Client(), nil)
			return err == nil
		}, "NodesCapacity with NodeReaderRole")
		// kubecluster's nodes: 32 CPUs, 256 GiB, 110 Pods each.
		if want := (Capacity{MilliCPU: 64000, MemoryMB: 2 * 256 << 10, Pods: 220, Nodes: 2}); all != want {
			t.Errorf("capacity of every node = %+v, want %+v", all, want)
		}
		one, err := NodesCapacity(ctxT(t), sh.Client(), c.Nodes[:1])
		if want := (Capacity{MilliCPU: 32000, MemoryMB: 256 << 10, Pods: 110, Nodes: 1}); err != nil || one != want {
			t.Errorf("capacity of %s = %+v, %v; want %+v", c.Nodes[0], one, err, want)
		}
		if _, err := NodesCapacity(ctxT(t), sh.Client(), []string{"no-such-node"}); !apierrors.IsNotFound(err) {
			t.Errorf("capacity of a node that does not exist: %v, want NotFound", err)
		}
	})

	t.Run("BadConfig", func(t *testing.T) {
		sh := newShared(t, c.AdminConfig(), "default")
		for _, cfg := range []Config{
			{Node: "a", Placement: "kubelet"},
			{Node: "a", Nodes: []string{"b"}}, // Nodes without the scheduler
		} {
			if _, err := sh.Runtime(cfg); err == nil {
				t.Errorf("Runtime(%+v) accepted", cfg)
			}
		}
	})
}

// A Pod with a nominated node is being made room for by preemption: not
// unschedulable, whatever its condition still says.
func TestNominatedIsNotUnschedulable(t *testing.T) {
	p := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "0/3 nodes are available"}}}}
	if unschedulable(p) == nil {
		t.Fatal("a Pod the scheduler refused is not unschedulable")
	}
	p.Status.NominatedNodeName = "n1"
	if err := unschedulable(p); err != nil {
		t.Errorf("a Pod with a nominated node: %v, want schedulable", err)
	}
}

package e2e

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
)

// kubePods lists function fn's live Pods (not being deleted) in ns by name.
func kubePods(t testing.TB, kc *kubecluster.Cluster, ns, fn string) map[string]corev1.Pod {
	t.Helper()
	list, err := kc.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: kube.Selector + "," + kube.LabelFunction + "=" + fn})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = p
		}
	}
	return out
}

// TestKubeSchedulerPlacement is `brisk up --runtime kube --kube-placement
// scheduler` against a real kube-apiserver and kube-scheduler with two KWOK
// nodes: one brisk worker node stands for both, sized from their
// allocatable resources; its Pods are created unbound and placed by the
// scheduler. The function scales from 0 to 4 Pods and back, a kill -9 and
// restart of brisk adopts the Pods (none created again, none revived), and
// a ResourceQuota smaller than the demand holds the Pods at its limit with
// the refusal reported, until it is lifted.
func TestKubeSchedulerPlacement(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	kc := kubecluster.Start(t, kubecluster.Options{Nodes: 2})
	kc.StartControllers(t, 0)
	kc.Schedulable(t)
	ns := kc.Namespace(t, "brisk-sched")
	kc.ServePods(t, ns)
	c := newCluster(t)
	args := []string{"--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns,
		"--kube-placement", "scheduler", "--kube-nodes", strings.Join(kc.Nodes, ",")}
	p := c.up(t, args...)

	// One worker node, as big as the two Kubernetes nodes together.
	st, err := c.cl.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 1 || st.Nodes[0].Runtime != "kube" || st.Nodes[0].Capacity.MilliCPU != 64000 || st.Nodes[0].Capacity.MemoryMB != 2*256<<10 {
		t.Fatalf("worker nodes %+v, want one kube node with the two KWOK nodes' 64 CPUs and 512 GiB", st.Nodes)
	}
	worker := st.Nodes[0].ID

	c.mustBrisk(t, "fn", "deploy", "hello", "--builtin", "trace", "--max", "6",
		"--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")
	inv := c.invoke(t, "hello", `{}`)
	if inv.status != 200 || !inv.cold || !strings.HasPrefix(string(inv.body), "pod "+ns+"/") {
		t.Fatalf("first call: %d cold=%v %q", inv.status, inv.cold, inv.body)
	}
	placed := func(pods map[string]corev1.Pod) {
		t.Helper()
		for name, p := range pods {
			if !slices.Contains(kc.Nodes, p.Spec.NodeName) || p.Annotations[kube.AnnotationWorkerNode] != worker {
				t.Errorf("pod %s on node %q of worker node %q; want one of %v, worker node %s", name, p.Spec.NodeName, p.Annotations[kube.AnnotationWorkerNode], kc.Nodes, worker)
			}
			if p.Spec.SchedulerName != corev1.DefaultSchedulerName {
				t.Errorf("pod %s has scheduler %q", name, p.Spec.SchedulerName)
			}
		}
	}
	placed(kubePods(t, kc, ns, "hello"))

	c.mustBrisk(t, "fn", "update", "hello", "--min", "4")
	eventually(t, 30*time.Second, "4 Pods, 4 ready sandboxes", func() bool {
		return len(kubePods(t, kc, ns, "hello")) == 4 && c.fn(t, "hello").Status.Ready == 4
	})
	before := kubePods(t, kc, ns, "hello")
	placed(before)

	// kill -9 and restart: the same Pods serve, none created or revived.
	p.stop(syscall.SIGKILL)
	c.up(t, args...)
	eventually(t, 30*time.Second, "the restarted cluster reports the 4 adopted Pods ready", func() bool {
		return c.fn(t, "hello").Status.Ready == 4
	})
	after := kubePods(t, kc, ns, "hello")
	if len(after) != 4 {
		t.Fatalf("after the restart: %d Pods, want the 4 adopted", len(after))
	}
	for name, p := range before {
		if a, ok := after[name]; !ok || a.UID != p.UID {
			t.Errorf("pod %s (uid %s) not kept across the restart", name, p.UID)
		}
	}
	if inv := c.invoke(t, "hello", `{}`); inv.status != 200 || inv.cold {
		t.Errorf("call after the restart: %d cold=%v %q", inv.status, inv.cold, inv.body)
	}

	c.mustBrisk(t, "fn", "update", "hello", "--min", "0")
	eventually(t, 60*time.Second, "no Pod left", func() bool { return len(kubePods(t, kc, ns, "hello")) == 0 })

	// A quota of 2 Pods against a demand of 4: two run, the others are
	// refused by the apiserver at once and brisk says why.
	hard := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")}
	q, err := kc.Client.CoreV1().ResourceQuotas(ns).Create(context.Background(), &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Spec: corev1.ResourceQuotaSpec{Hard: hard}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No quota controller runs: set the status it would (admission then
	// counts each Pod it admits).
	q.Status = corev1.ResourceQuotaStatus{Hard: hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
	if _, err := kc.Client.CoreV1().ResourceQuotas(ns).UpdateStatus(context.Background(), q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.mustBrisk(t, "fn", "update", "hello", "--min", "4")
	var last string
	eventually(t, 60*time.Second, "2 Pods and the quota's refusal reported", func() bool {
		v := c.fn(t, "hello")
		last = v.Status.LastFailure
		return v.Status.Ready == 2 && strings.Contains(v.Status.LastFailure, "exceeded quota")
	})
	t.Logf("last failure: %s", last)
	if n := len(kubePods(t, kc, ns, "hello")); n != 2 {
		t.Errorf("%d Pods under a quota of 2", n)
	}
	// Lifted, the function gets its 4.
	if err := kc.Client.CoreV1().ResourceQuotas(ns).Delete(context.Background(), "pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "4 ready once the quota is gone", func() bool {
		return c.fn(t, "hello").Status.Ready == 4 && len(kubePods(t, kc, ns, "hello")) == 4
	})
	c.mustBrisk(t, "fn", "update", "hello", "--min", "0")
	eventually(t, 60*time.Second, "no Pod left", func() bool { return len(kubePods(t, kc, ns, "hello")) == 0 })
}

// Network pool of the kube tests' native emergency runtime: names and a
// subnet of their own, apart from the containerd tests'.
var kubeEmergencyArgs = []string{"--emergency-runtime", "native", "--net-prefix", "bkq", "--net-bridge", "bkqbr0",
	"--net-subnet", "10.219.0.0/24", "--net-pool", "4"}

// podWatch records the names of every Pod created in a namespace.
type podWatch struct {
	mu    sync.Mutex
	names []string
}

func watchPods(t testing.TB, kc *kubecluster.Cluster, ns string) *podWatch {
	t.Helper()
	w, err := kc.Client.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pw := &podWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				pw.mu.Lock()
				pw.names = append(pw.names, p.Name)
				pw.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return pw
}

func (pw *podWatch) seen() []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return slices.Clone(pw.names)
}

// TestKubeWithNativeEmergency is PulseNet's pairing on Kubernetes:
// regular sandboxes are Pods, the emergency track is this host's native
// runtime (`--runtime kube --emergency-runtime native`). A dual-mode
// function's call at zero is served at once by a one-shot native sandbox,
// which never becomes a Pod, while its regular Pod comes up; the next call
// goes to the Pod.
func TestKubeWithNativeEmergency(t *testing.T) {
	testutil.RequiresRoot(t)
	kc := kubecluster.Start(t, kubecluster.Options{Nodes: 1})
	ns := kc.Namespace(t, "brisk-dual")
	kc.ServePods(t, ns)
	pods := watchPods(t, kc, ns)
	c := newCluster(t)
	p := c.up(t, append([]string{"--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns,
		"--kube-nodes", strings.Join(kc.Nodes, ","), "--emergency-slots", "4"}, kubeEmergencyArgs...)...)
	regular := emergencyThenRegular(t, c, 4)
	if !strings.HasPrefix(string(regular.body), "pod "+ns+"/") {
		t.Fatalf("call with a regular sandbox ready: body %q; want a Pod's", regular.body)
	}
	st, err := c.cl.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if em := st.Nodes[0].Emergency; em == nil || em.Started < 1 {
		t.Errorf("emergency statistics %+v, want the call's sandbox counted", em)
	}
	p.stop(syscall.SIGTERM)
	seen := pods.seen()
	if len(seen) == 0 {
		t.Error("no Pod was created for the function")
	}
	for _, name := range seen {
		if strings.HasPrefix(name, "ei-") {
			t.Errorf("emergency sandbox %s became a Pod", name)
		}
	}
	// The worker stopped with its sandboxes: the pool's namespaces are gone.
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "bkq") {
				t.Errorf("network namespace %s left after the cluster stopped", e.Name())
			}
		}
	}
}

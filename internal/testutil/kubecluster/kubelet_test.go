package kubecluster

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A real kubelet registers its node, runs a Pod of the pause image in a
// real container with an address of its bridge's subnet, and leaves the
// host as it found it once stopped (Stop checks): no KUBE- chains,
// mounts, cgroups, bridge or files at the kubelet's fixed paths.
func TestKubeletRunsPod(t *testing.T) {
	c := Start(t, Options{})
	k := StartKubelet(t, c)
	ns := c.Namespace(t, "kubelet-test")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	no, grace := false, int64(0) // pause, pid 1 of its namespace, ignores SIGTERM
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      k.Node,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "pause", Image: PauseImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
	t0 := time.Now()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	for {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "pause", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			got = p
			break
		}
		if p.Status.Phase == corev1.PodFailed || ctx.Err() != nil {
			t.Fatalf("pod not running: phase %s, status %+v", p.Status.Phase, p.Status)
		}
		time.Sleep(pollEvery)
	}
	t.Logf("pod Running in %v at %s", time.Since(t0).Round(time.Millisecond), got.Status.PodIP)
	ip, err := netip.ParseAddr(got.Status.PodIP)
	if err != nil || !netip.MustParsePrefix(KubeletSubnet).Contains(ip) {
		t.Errorf("pod IP %q, want one of %s", got.Status.PodIP, KubeletSubnet)
	}
	// The container is containerd's: a running task of the pod's.
	cl, err := containerd.New(k.ContainerdSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cs, err := cl.Containers(namespaces.WithNamespace(ctx, KubeletNamespace),
		`labels."io.kubernetes.pod.name"==pause,labels."io.kubernetes.container.name"==pause`)
	if err != nil || len(cs) != 1 {
		t.Fatalf("containers of the pod in containerd: %d, %v; want 1", len(cs), err)
	}
	task, err := cs[0].Task(namespaces.WithNamespace(ctx, KubeletNamespace), nil)
	if err != nil {
		t.Fatalf("the pod's container has no task: %v", err)
	}
	if st, err := task.Status(namespaces.WithNamespace(ctx, KubeletNamespace)); err != nil || st.Status != containerd.Running {
		t.Fatalf("the pod's task: %+v, %v; want running", st, err)
	}

	// The check Stop makes sees a running kubelet's writes.
	if hostState() == k.state {
		t.Errorf("hostState sees nothing of a running kubelet:\n%s", k.state)
	}

	// Deleted, the Pod goes once the kubelet has stopped it.
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "pause", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, "pause", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the deleted pod is still there: %v", err)
		}
		time.Sleep(pollEvery)
	}
	// Stop checks that the host is as before.
	if err := k.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// Without the kubelet binary StartKubelet says what to build.
func TestRequireKubeletNamesTheBuild(t *testing.T) {
	missing := requireKubelet(t.TempDir())
	if !slices.ContainsFunc(missing, func(m string) bool { return strings.Contains(m, "kubelet (scripts/k8s-binaries.sh)") }) {
		t.Errorf("missing %q: want the kubelet and the script that builds it", missing)
	}
}

package e2e

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
)

// TestKubeletServesCall is issue 22's one-node test on a real kubelet:
// `brisk up --runtime kube` with the kubelet's node, a function whose image
// `brisk image build` made and imported into the kubelet's containerd. The
// first call creates a Pod the kubelet runs in a real container with an
// address on its pod network, and that container serves it, through
// brisk's data plane; idle, the function scales to zero and the Pod and
// its container go. The host is left as it was.
func TestKubeletServesCall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane and a kubelet")
	}
	t0 := time.Now()
	kc := kubecluster.Start(t, kubecluster.Options{})
	k := kubecluster.StartKubelet(t, kc)
	ns := kc.Namespace(t, "brisk-fn")
	c := newCluster(t)

	out := c.mustBrisk(t, "image", "build", "trace", "--data-dir", c.dataDir,
		"--containerd-address", k.ContainerdSocket, "--containerd-namespace", kubecluster.KubeletNamespace)
	t.Log(strings.TrimSpace(out))
	p := c.up(t, "--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns, "--kube-nodes", k.Node)
	c.mustBrisk(t, "fn", "deploy", "hello", "--image", image.TraceRef,
		"--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// When the function's Pod appears and when the kubelet reports it
	// Ready, as the API's watchers see it.
	w, err := kc.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: kube.Selector + "," + kube.LabelFunction + "=hello"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	podReady := make(chan [2]time.Time, 1)
	go func() {
		var added time.Time
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Added && added.IsZero() {
				added = time.Now()
			}
			for _, cond := range pod.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					podReady <- [2]time.Time{added, time.Now()}
					return
				}
			}
		}
	}()

	start := time.Now()
	resp, err := c.hc.Post(c.scheme+"://"+c.invokeAddr+"/function/hello", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	firstCall := time.Since(start)
	sandbox, timing := resp.Header.Get("X-Brisk-Sandbox"), resp.Header.Get("X-Brisk-Timing")
	if resp.StatusCode != 200 || !strings.Contains(timing, "cold=true") || sandbox == "" || !strings.Contains(string(body), sandbox) {
		t.Fatalf("first call: %d, sandbox %q, timing %q: %s", resp.StatusCode, sandbox, timing, body)
	}
	select {
	case ts := <-podReady:
		t.Logf("first call %v (%s); Pod created %v after the call began, Ready %v after its creation",
			firstCall.Round(time.Millisecond), timing, ts[0].Sub(start).Round(time.Millisecond), ts[1].Sub(ts[0]).Round(time.Millisecond))
	case <-ctx.Done():
		t.Fatal("served, but the watch saw no Ready Pod")
	}

	// The call was served by the Pod of that sandbox, on the kubelet's node,
	// at an address of its pod network.
	list, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.Selector + "," + kube.LabelFunction + "=hello"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the function's Pods: %d, %v; want 1", len(list.Items), err)
	}
	pod := list.Items[0]
	if pod.Spec.NodeName != k.Node || pod.Annotations[kube.AnnotationSandbox] != sandbox || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s: node %q, sandbox %q, phase %s; want node %s, sandbox %s, Running",
			pod.Name, pod.Spec.NodeName, pod.Annotations[kube.AnnotationSandbox], pod.Status.Phase, k.Node, sandbox)
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err != nil || !netip.MustParsePrefix(kubecluster.KubeletSubnet).Contains(ip) {
		t.Errorf("pod IP %q, want one of the pod network %s", pod.Status.PodIP, kubecluster.KubeletSubnet)
	}
	// And its container is a running containerd task of the image built.
	ctr, err := containerd.New(k.ContainerdSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ctr.Close()
	cctx := namespaces.WithNamespace(ctx, kubecluster.KubeletNamespace)
	podTasks := func() (running int) {
		cs, err := ctr.Containers(cctx, `labels."io.kubernetes.pod.name"==`+pod.Name+`,labels."io.kubernetes.container.name"==`+kube.ContainerName)
		if err != nil {
			t.Fatalf("containerd: %v", err)
		}
		for _, cn := range cs {
			info, err := cn.Info(cctx)
			if err != nil || info.Image != image.TraceRef {
				t.Fatalf("container %s: image %q, %v; want %s", cn.ID(), info.Image, err, image.TraceRef)
			}
			if task, err := cn.Task(cctx, nil); err == nil {
				if st, err := task.Status(cctx); err == nil && st.Status == containerd.Running {
					running++
				}
			}
		}
		return running
	}
	if n := podTasks(); n != 1 {
		t.Fatalf("running containers of pod %s in containerd: %d, want 1", pod.Name, n)
	}
	for i := range 3 {
		if inv := c.invoke(t, "hello", `{"ms": 1}`); inv.status != 200 || inv.cold || inv.sandbox != sandbox {
			t.Fatalf("warm call %d: %d cold=%v sandbox %q (want %s)", i, inv.status, inv.cold, inv.sandbox, sandbox)
		}
	}

	// Idle: back to zero, the Pod deleted and its container stopped.
	eventually(t, 90*time.Second, "scale to zero deletes the Pod", func() bool {
		l, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.Selector})
		return err == nil && len(l.Items) == 0 && c.fn(t, "hello").Status.Ready == 0
	})
	if n := podTasks(); n != 0 {
		t.Errorf("the Pod is gone but %d of its containers run", n)
	}

	// Stop checks that the host is as before StartKubelet.
	p.stop(syscall.SIGTERM)
	if err := k.Stop(); err != nil {
		t.Fatalf("stopping the kubelet: %v", err)
	}
	t.Logf("node Ready %v after containerd started; whole test %v", k.Ready.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

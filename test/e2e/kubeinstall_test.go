package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/kubernetes/fncontroller"
	"github.com/brisk-faas/brisk/internal/kubernetes/install"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// kubeWorkerState is the kube worker DaemonSet's hostPath state directory
// (deploy/kubernetes/worker.yaml): the test removes it if it made it.
const kubeWorkerState = "/var/lib/brisk/worker-kube"

// TestInstallOnKubelet runs brisk's own image in real containers: `brisk
// k8s image` imported into a real kubelet's containerd, `brisk k8s
// install` with the kube worker runtime (one control-plane replica, one
// data plane, an unprivileged worker whose sandboxes are Pods on the same
// kubelet), cluster DNS from CoreDNS for the control plane's stable Pod
// names. No kube-proxy runs: the test reaches brisk by Pod IPs, and the
// Pods reach the apiserver at the address install --api-server gives
// them. A function deployed through the control-plane Pod's admin API and
// called through the data-plane Pod is served by a sandbox Pod; uninstall
// removes it all and the host is left as it was.
func TestInstallOnKubelet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane, a kubelet and brisk in Pods")
	}
	t0 := time.Now()
	restoreHostPath(t, kubeWorkerState) // after the kubelet has stopped (cleanups run last first)
	kc := kubecluster.Start(t, kubecluster.Options{})
	k := kubecluster.StartKubelet(t, kc)
	// The scheduler and the controllers brisk's workloads need on a real
	// node: the node lifecycle controller lifts the not-ready taint the
	// node registers with, DNS records of the headless Service come from
	// EndpointSlices, service-account tokens need the root CA's ConfigMap,
	// and uninstall reaches the Pods through the garbage collector and the
	// namespace controller.
	kc.StartControllers(t, 0, "node-lifecycle-controller", "endpointslice-controller", "root-ca-certificate-publisher-controller",
		"garbage-collector-controller", "namespace-controller")
	k.StartDNS(t)
	ns := install.DefaultNamespace
	sandboxNS := ns + install.SandboxSuffix
	kubeconfig := "--kubeconfig=" + kc.Kubeconfig

	// brisk's image from a static brisk and the sandbox init, and the
	// trace function's image, both in the kubelet's containerd.
	dir := t.TempDir()
	static, initBin := filepath.Join(dir, "brisk"), filepath.Join(dir, "brisk-sandbox-init")
	if err := testutil.GoBuild("../../cmd/brisk", static, true); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("../../scripts/build-sandbox-init.sh", initBin).CombinedOutput(); err != nil {
		t.Fatalf("build-sandbox-init.sh: %v\n%s", err, out)
	}
	containerdFlags := []string{"--containerd-address", k.ContainerdSocket, "--containerd-namespace", kubecluster.KubeletNamespace}
	t.Log(strings.TrimSpace(runBrisk(t, append([]string{"k8s", "image", "--out", filepath.Join(dir, "brisk-image.tar"),
		"--brisk", static, "--sandbox-init", initBin, "--import"}, containerdFlags...)...)))
	t.Log(strings.TrimSpace(runBrisk(t, append([]string{"image", "build", "trace", "--data-dir", filepath.Join(dir, "images")}, containerdFlags...)...)))

	t.Cleanup(func() {
		// On a failure before the test's own uninstall: the kubelet's
		// Stop deletes the node's Pods, which the controllers would
		// otherwise make again.
		_, _ = exec.Command(briskBin, "k8s", "uninstall", kubeconfig).CombinedOutput()
	})
	t1 := time.Now()
	t.Log(strings.TrimSpace(runBrisk(t, "k8s", "install", kubeconfig, "--worker-runtime", "kube", "--replicas", "3",
		"--dataplanes", "1", "--ephemeral-storage", "--api-server", k.APIServer())))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Every Pod of brisk's Ready (the control plane's and the data plane's
	// readiness probes ask /healthz: a leader, an endpoint snapshot), in
	// real containers of brisk's image on the kubelet's node.
	want := map[string]int{"controlplane": 3, "dataplane": 1, "worker": 1, "functions": 1}
	var pods map[string]corev1.Pod
	var last string
	eventuallyOr(t, 4*time.Minute, "brisk's Pods Ready", func() bool {
		list, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err.Error()
			return false
		}
		pods = map[string]corev1.Pod{}
		ready := map[string]int{}
		var states []string
		for _, p := range list.Items {
			comp := p.Labels["app.kubernetes.io/component"]
			states = append(states, fmt.Sprintf("%s %s ready=%v restarts=%d", p.Name, p.Status.Phase, podReady(&p), restarts(&p)))
			if podReady(&p) && p.Spec.NodeName == k.Node {
				pods[comp] = p
				ready[comp]++
			}
		}
		last = strings.Join(states, "; ")
		for comp, n := range want {
			if ready[comp] < n {
				return false
			}
		}
		return true
	}, func() string { return last + "\n" + podLogs(k.Dir, ns) })
	t.Logf("brisk's Pods Ready %v after install: %s", time.Since(t1).Round(time.Millisecond), last)
	// None crashed on the way: a control-plane replica whose own DNS name
	// is not published yet when its container starts waits for it.
	for _, p := range pods {
		if restarts(&p) > 0 {
			t.Errorf("Pod %s restarted %d times; the containers' logs:\n%s", p.Name, restarts(&p), podLogs(k.Dir, ns))
			break
		}
	}
	for comp, p := range pods {
		if p.Spec.Containers[0].Image != install.ImageRef {
			t.Errorf("%s Pod %s runs image %q, want %s", comp, p.Name, p.Spec.Containers[0].Image, install.ImageRef)
		}
	}
	// The worker has no privilege.
	if sc := pods["worker"].Spec.Containers[0].SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) || pods["worker"].Spec.HostNetwork {
		t.Errorf("the kube worker runs privileged or on the host's network: %+v", sc)
	}
	ctr, err := containerd.New(k.ContainerdSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ctr.Close()
	cctx := namespaces.WithNamespace(ctx, kubecluster.KubeletNamespace)
	total := 0
	for _, n := range want {
		total += n
	}
	if n := runningTasks(t, cctx, ctr, install.ImageRef); n != total {
		t.Errorf("running containers of %s: %d, want %d", install.ImageRef, n, total)
	}

	// The admin token and the CA from the Secret install made.
	sec, err := kc.Client.CoreV1().Secrets(ns).Get(ctx, install.SecretControlPlane, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(sec.Data[install.KeyCACert]) {
		t.Fatal("no CA certificate in the Secret")
	}
	// Pod IPs, and the name the control plane's certificate is for.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "brisk-admin." + ns + ".svc"}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	cp, dp := pods["controlplane"], pods["dataplane"]
	cl := client.New("https://"+cp.Status.PodIP+":9090", "http://"+dp.Status.PodIP+":8080")
	cl.HTTP, cl.Token = hc, strings.TrimSpace(string(sec.Data[install.KeyAdminToken]))
	if _, err := cl.Create(ctx, &spec.Function{Name: "hello", Image: image.TraceRef}); err != nil {
		t.Fatalf("deploy through the control plane's Pod %s (%s): %v", cp.Name, cp.Status.PodIP, err)
	}

	// The first call: the worker makes a sandbox Pod, the kubelet runs it,
	// the data plane's Pod forwards the call to it.
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, cl.Invoke+"/function/hello", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+cl.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("call through the data plane's Pod %s (%s): %v", dp.Name, dp.Status.PodIP, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sandbox := resp.Header.Get("X-Brisk-Sandbox")
	if resp.StatusCode != http.StatusOK || sandbox == "" || !bytes.Contains(body, []byte(sandbox)) {
		t.Fatalf("first call: %d, sandbox %q, timing %q: %s\n%s", resp.StatusCode, sandbox, resp.Header.Get("X-Brisk-Timing"), body, podLogs(k.Dir, ns))
	}
	t.Logf("first call %v (%s)", time.Since(start).Round(time.Millisecond), resp.Header.Get("X-Brisk-Timing"))
	// It came from that sandbox's Pod, on the kubelet's node, in a running
	// container of the function's image.
	fnPods, err := kc.Client.CoreV1().Pods(sandboxNS).List(ctx, metav1.ListOptions{LabelSelector: kube.Selector + "," + kube.LabelFunction + "=hello"})
	if err != nil || len(fnPods.Items) != 1 {
		t.Fatalf("the function's Pods in %s: %v, %v; want 1", sandboxNS, fnPods, err)
	}
	fp := fnPods.Items[0]
	if fp.Spec.NodeName != k.Node || fp.Annotations[kube.AnnotationSandbox] != sandbox || !podReady(&fp) {
		t.Fatalf("sandbox Pod %s: node %q, sandbox %q, ready %v; want node %s, sandbox %s, Ready",
			fp.Name, fp.Spec.NodeName, fp.Annotations[kube.AnnotationSandbox], podReady(&fp), k.Node, sandbox)
	}
	if ip, err := netip.ParseAddr(fp.Status.PodIP); err != nil || !netip.MustParsePrefix(kubecluster.KubeletSubnet).Contains(ip) {
		t.Errorf("sandbox Pod IP %q, want one of the pod network %s", fp.Status.PodIP, kubecluster.KubeletSubnet)
	}
	if n := runningTasks(t, cctx, ctr, image.TraceRef); n != 1 {
		t.Errorf("running containers of %s: %d, want 1", image.TraceRef, n)
	}

	// The Function controller's Pod deploys a Function object through the
	// admin API (found by the control plane's cluster DNS name) into the
	// brisk namespace an admin made for it.
	fnNS := kc.Namespace(t, "team-k")
	if _, err := kc.Client.CoreV1().Namespaces().Patch(ctx, fnNS, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+fncontroller.LabelNamespaceEnabled+`":"`+fncontroller.NamespaceEnabled+`"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.PutNamespace(ctx, fnNS, spec.Quota{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kc.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(fncontroller.GVR).Namespace(fnNS).Create(ctx, functionObject(t, fnNS, "kfn", "image: "+image.TraceRef+"\n"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var fnErr error
	eventuallyOr(t, 2*time.Minute, "the Function controller deploys team-k/kfn", func() bool {
		var v *api.FunctionView
		v, fnErr = cl.Get(ctx, spec.Qualify("kfn", fnNS))
		return fnErr == nil && v.Namespace == fnNS
	}, func() string { return fmt.Sprintf("last: %v\n%s", fnErr, podLogs(k.Dir, ns)) })

	// Uninstall: brisk's Pods and the sandboxes go (the namespaces with
	// them), then the kubelet stops and the host is checked.
	t.Log(strings.TrimSpace(runBrisk(t, "k8s", "uninstall", kubeconfig)))
	eventually(t, 3*time.Minute, "uninstall removes brisk's namespaces and Pods", func() bool {
		for _, n := range []string{ns, sandboxNS} {
			if _, err := kc.Client.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false
			}
		}
		l, err := kc.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + k.Node})
		return err == nil && len(l.Items) == 0
	})
	if n := runningTasks(t, cctx, ctr, ""); n != 0 {
		t.Errorf("uninstalled, but %d containers run", n)
	}
	if err := k.Stop(); err != nil {
		t.Fatalf("stopping the kubelet: %v", err)
	}
	t.Logf("node Ready %v after containerd started; whole test %v", k.Ready.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

// runBrisk runs the brisk binary and returns its output, failing t on an
// error exit.
func runBrisk(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(briskBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("brisk %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// podLogs is the end of each container's log in namespace ns, read from
// the kubelet's pod log directory under its Dir (the kubelet serves no
// API here).
func podLogs(kubeletDir, ns string) string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(kubeletDir, "pod-logs", ns+"_*", "*", "*.log"))
	for _, p := range logs {
		data, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "== %s\n%s\n", p, tail(string(data), 1500))
	}
	return b.String()
}

// eventuallyOr is eventually, failing with diag's report.
func eventuallyOr(t *testing.T, timeout time.Duration, what string, cond func() bool, diag func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s\n%s", timeout, what, diag())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runningTasks counts the running containers of ref (any image when "")
// in the kubelet's containerd, pause containers aside.
func runningTasks(t *testing.T, ctx context.Context, ctr *containerd.Client, ref string) int {
	t.Helper()
	cs, err := ctr.Containers(ctx)
	if err != nil {
		t.Fatalf("containerd: %v", err)
	}
	n := 0
	for _, c := range cs {
		info, err := c.Info(ctx)
		if err != nil || info.Image == kubecluster.PauseImage || (ref != "" && info.Image != ref) {
			continue
		}
		if task, err := c.Task(ctx, nil); err == nil {
			if st, err := task.Status(ctx); err == nil && st.Status == containerd.Running {
				n++
			}
		}
	}
	return n
}

// restoreHostPath removes path when the test ends if it did not exist
// before, and its parent too when the test made it and it is empty: a
// hostPath volume of type DirectoryOrCreate makes both on the node.
func restoreHostPath(t *testing.T, path string) {
	t.Helper()
	var made []string
	for p := path; p != "/"; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		made = append(made, p)
	}
	t.Cleanup(func() {
		for i, p := range made {
			var err error
			if i == 0 {
				err = os.RemoveAll(p)
			} else {
				err = os.Remove(p) // only when empty
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("restoring the host: %v", err)
			}
		}
	})
}

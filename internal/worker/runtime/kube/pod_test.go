package kube

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Pod names are the ids brisk makes, and valid, distinct names for any
// other id the runtime accepts.
func TestPodName(t *testing.T) {
	for _, id := range []string{"3f9a0c1b2d4e-1z", "rtconf-123-4", "a.b"} {
		if got := PodName(id); got != id {
			t.Errorf("PodName(%q) = %q, want the id itself", id, got)
		}
	}
	seen := map[string]string{}
	for _, id := range []string{"A", "a_", "a-", "Sandbox_1", "sandbox-1", "sandbox_1", "x.-y", "_", "..a", strings.Repeat("Z", 128)} {
		name := PodName(id)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("PodName(%q) = %q: not a valid Pod name: %v", id, name, errs)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("PodName(%q) = PodName(%q) = %q", id, other, name)
		}
		seen[name] = id
	}
}

func testFunction() *spec.Function {
	f := &spec.Function{
		Name: "hello", Image: "example.invalid/hello:v1", Revision: 7,
		Env:       map[string]string{"GREETING": "costs $5 $(HOME) $$"},
		Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128},
		Limits:    spec.Resources{MilliCPU: 1000},
		Labels:    map[string]string{"team": "a", "brisk.dev/function": "spoofed", "bad key!": "x", "node-role.kubernetes.io/control-plane": ""},
		Annotations: map[string]string{"note": "kept", "brisk.dev/sandbox-id": "spoofed", "container.apparmor.security.beta.kubernetes.io/function": "unconfined",
			"vault.hashicorp.com/agent-inject": "true", "example.com/allowed": "yes"},
	}
	f.ApplyDefaults()
	return f
}

// The Pod carries the function as the other runtimes run it: bound to the
// node, brisk's labels, the environment as written, the port, requests and
// limits, a read-only root with a /tmp.
func TestPodFor(t *testing.T) {
	f := testFunction()
	p, err := podFor(runtime.Spec{ID: "sb-1", Function: f}, "ns", "node-a", "tok", 1500*time.Millisecond, []string{"example.com", "kubernetes.io"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "sb-1" || p.Namespace != "ns" || p.Spec.NodeName != "node-a" {
		t.Errorf("name %s/%s on node %q", p.Namespace, p.Name, p.Spec.NodeName)
	}
	for k, want := range map[string]string{LabelManagedBy: ManagedBy, LabelFunction: "hello", LabelRevision: "7", LabelSandbox: "sb-1", "team": "a"} {
		if got := p.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if _, ok := p.Labels["bad key!"]; ok {
		t.Error("an invalid label key reached the Pod")
	}
	if _, ok := p.Labels["node-role.kubernetes.io/control-plane"]; ok {
		t.Errorf("a prefixed label was copied: %v", p.Labels)
	}
	if _, ok := p.Annotations["container.apparmor.security.beta.kubernetes.io/function"]; ok {
		t.Errorf("a prefixed annotation (AppArmor unconfined) was copied: %v", p.Annotations)
	}
	if _, ok := p.Annotations["vault.hashicorp.com/agent-inject"]; ok {
		t.Errorf("an annotation under a prefix not allowed (Vault's injector) was copied: %v", p.Annotations)
	}
	if p.Annotations[AnnotationSandbox] != "sb-1" || p.Annotations["note"] != "kept" || p.Annotations[annotationCreate] != "tok" || p.Annotations["example.com/allowed"] != "yes" {
		t.Errorf("annotations %v", p.Annotations)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyNever || *p.Spec.TerminationGracePeriodSeconds != 2 ||
		*p.Spec.AutomountServiceAccountToken || *p.Spec.EnableServiceLinks {
		t.Errorf("pod spec %+v", p.Spec)
	}
	c := p.Spec.Containers[0]
	if c.Image != f.Image || len(c.Ports) != 1 || c.Ports[0].ContainerPort != int32(spec.DefaultPort) {
		t.Errorf("container %+v", c)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if got, want := env["GREETING"], "costs $$5 $$(HOME) $$$$"; got != want {
		t.Errorf("GREETING = %q, want %q (every $ doubled: the kubelet expands $(...) and reads $$ as $)", got, want)
	}
	if env[tracefn.EnvSandboxID] != "sb-1" || env[tracefn.EnvFunction] != "hello" || env[tracefn.EnvPort] != "8080" {
		t.Errorf("brisk's variables missing: %v", env)
	}
	for name, q := range map[string]resource.Quantity{
		"requests.cpu": c.Resources.Requests[corev1.ResourceCPU], "requests.memory": c.Resources.Requests[corev1.ResourceMemory],
		"limits.cpu": c.Resources.Limits[corev1.ResourceCPU], "limits.memory": c.Resources.Limits[corev1.ResourceMemory],
	} {
		want := map[string]string{"requests.cpu": "250m", "requests.memory": "128Mi", "limits.cpu": "1", "limits.memory": "128Mi"}[name]
		if q.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("%s = %s, want %s", name, q.String(), want)
		}
	}
	if !*c.SecurityContext.ReadOnlyRootFilesystem || len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/tmp" {
		t.Errorf("read-only root with /tmp: %+v %+v", c.SecurityContext, c.VolumeMounts)
	}

	f.WritableRoot = true
	p, _ = podFor(runtime.Spec{ID: "sb-1", Function: f}, "ns", "node-a", "tok", time.Second, nil)
	if *p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem || len(p.Spec.Volumes) != 0 {
		t.Error("WritableRoot still gives a read-only root")
	}
}

func TestPodForRefuses(t *testing.T) {
	builtin := &spec.Function{Name: "tr", Builtin: image.TraceName, Port: 8080}
	p, err := podFor(runtime.Spec{ID: "sb", Function: builtin}, "ns", "n", "", time.Second, nil)
	if err != nil || p.Spec.Containers[0].Image != image.TraceRef {
		t.Errorf("builtin trace: %v, image %v", err, p)
	}
	for name, f := range map[string]*spec.Function{
		"command":  {Name: "c", Command: []string{"/bin/server"}, Port: 8080},
		"secrets":  {Name: "s", Image: "i", Port: 8080, Secrets: []string{"db"}, SecretData: map[string][]byte{"db": []byte("x")}},
		"watchdog": {Name: "w", Builtin: "watchdog", Port: 8080},
	} {
		if _, err := podFor(runtime.Spec{ID: "sb", Function: f}, "ns", "n", "", time.Second, nil); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s: %v, want errors.ErrUnsupported", name, err)
		}
	}
	if _, err := podFor(runtime.Spec{ID: "bad/id", Function: testFunction()}, "ns", "n", "", time.Second, nil); err == nil {
		t.Error("an invalid sandbox id was accepted")
	}
}

// ended reads the kubelet's verdicts: exits, OOM kills, deletions, images
// that will never be pulled; a running Pod has not ended.
func TestEnded(t *testing.T) {
	now := metav1.Now()
	pod := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		mut(p)
		return p
	}
	terminated := func(code int32, reason string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}}
		}
	}
	if err := ended(pod(func(*corev1.Pod) {})); err != nil {
		t.Errorf("running pod: %v", err)
	}
	if err := ended(pod(terminated(3, "Error"))); err == nil || !strings.Contains(err.Error(), "status 3") || errors.Is(err, runtime.ErrOOMKilled) {
		t.Errorf("exit 3: %v", err)
	}
	if err := ended(pod(terminated(137, "OOMKilled"))); !errors.Is(err, runtime.ErrOOMKilled) {
		t.Errorf("OOM kill: %v", err)
	}
	if err := ended(pod(func(p *corev1.Pod) { p.DeletionTimestamp = &now })); err == nil || !strings.Contains(err.Error(), "deleted") {
		t.Errorf("deleting: %v", err)
	}
	if err := ended(pod(func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "not found"}}}}
	})); err == nil || !strings.Contains(err.Error(), "ErrImagePull") {
		t.Errorf("image pull error: %v", err)
	}
	if err := ended(pod(func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodPending
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}
	})); err != nil {
		t.Errorf("a container being created has not ended: %v", err)
	}
}

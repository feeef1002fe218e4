package install

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/brisk-faas/brisk/internal/kubernetes/fncontroller"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
)

// asServiceAccount is a clientset acting as ServiceAccount ns/name (the
// admin impersonates it), so that the apiserver's authorizer and
// admission plugins judge the requests as they would the account's own.
func asServiceAccount(t *testing.T, c *kubecluster.Cluster, ns, name string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.AdminConfig())
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// sandboxPod is a Pod as the kube runtime makes them
// (internal/worker/runtime/kube podFor): no privilege escalation, a
// read-only root, the runtime's seccomp profile, a memory-backed /tmp, no
// token; edit changes it.
func sandboxPod(name string, edit func(*corev1.Pod)) *corev1.Pod {
	no, yes := false, true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                     "node-0",
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			Containers: []corev1.Container{{
				Name: "function", Image: "registry.invalid/fn:v1",
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
			}},
			Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{
				EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(64<<20, resource.BinarySI)}}}},
		},
	}
	if edit != nil {
		edit(p)
	}
	return p
}

// TestInstallSandboxes installs the kube worker and acts as its
// ServiceAccount: it may create sandbox Pods in the sandbox namespace
// only, and there the apiserver (Pod Security Admission, baseline)
// refuses the Pods that would take the node or brisk's credentials.
func TestInstallSandboxes(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := Options{Namespace: c.Namespace(t, "brisk-sb"), WorkerRuntime: "kube", Ephemeral: true, Replicas: 1}
	// What earlier manifests gave the kube worker: Pods in brisk's own
	// namespace. Install removes it.
	labels := map[string]string{LabelManagedBy: ManagedBy}
	old := kube.Role(o.Namespace, "brisk-worker")
	old.Labels = labels
	if _, err := c.Client.RbacV1().Roles(o.Namespace).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	oldBinding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "brisk-worker", Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "brisk-worker"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "brisk-worker", Namespace: o.Namespace}},
	}
	if _, err := c.Client.RbacV1().RoleBindings(o.Namespace).Create(ctx, oldBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if changes, err := Install(ctx, c.AdminConfig(), o); err != nil {
		t.Fatalf("install: %v\n%v", err, changes)
	}
	sb := o.Namespace + SandboxSuffix
	sa, err := c.Client.CoreV1().ServiceAccounts(sb).Get(ctx, "default", metav1.GetOptions{})
	if err != nil || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("sandbox namespace's default ServiceAccount: %v; want it without a token", err)
	}
	if l, err := c.Client.CoreV1().Secrets(sb).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("Secrets in the sandbox namespace: %v", err)
	}

	worker := asServiceAccount(t, c, o.Namespace, "brisk-worker")
	pods := worker.CoreV1().Pods(sb)
	if _, err := pods.Create(ctx, sandboxPod("sandbox", nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the worker cannot create a sandbox Pod in %s: %v", sb, err)
	}
	// Next to the control plane: RBAC refuses.
	if _, err := worker.CoreV1().Pods(o.Namespace).Create(ctx, sandboxPod("steal", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the worker created a Pod in brisk's namespace %s: %v", o.Namespace, err)
	}
	yes := true
	for name, edit := range map[string]func(*corev1.Pod){
		"privileged": func(p *corev1.Pod) {
			sc := p.Spec.Containers[0].SecurityContext
			sc.Privileged, sc.AllowPrivilegeEscalation = &yes, nil
		},
		"hostpath": func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		},
		"hostnetwork": func(p *corev1.Pod) { p.Spec.HostNetwork = true },
		"netadmin": func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}
		},
		// brisk's ServiceAccounts live in brisk's namespace, not here.
		"functions-account": func(p *corev1.Pod) { p.Spec.ServiceAccountName = "brisk-functions" },
	} {
		_, err := pods.Create(ctx, sandboxPod(name, edit), metav1.CreateOptions{})
		if err == nil {
			t.Errorf("%s Pod admitted in the sandbox namespace", name)
			continue
		}
		if name != "functions-account" && !strings.Contains(err.Error(), "PodSecurity") {
			t.Errorf("%s Pod: refused by %v, want Pod Security Admission", name, err)
		}
	}
}

// TestInstallRefuses: a second install in another namespace, an install
// over an earlier one's registry volumes without its Secret, a sandbox
// namespace someone else made, and Kubernetes' own namespaces are refused,
// before anything is changed.
func TestInstallRefuses(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := c.AdminConfig()
	cs := c.Client
	a := Options{Namespace: "brisk-a", Ephemeral: true, Replicas: 1}
	if _, err := Install(ctx, cfg, a); err != nil {
		t.Fatal(err)
	}
	b := Options{Namespace: "brisk-b", Ephemeral: true, Replicas: 1}
	_, err := Install(ctx, cfg, b)
	if !errors.Is(err, errOtherInstall) || !strings.Contains(err.Error(), "brisk-a") {
		t.Errorf("second install in another namespace: %v; want a refusal naming brisk-a", err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, b.Namespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused install made its namespace: %v", err)
	}
	// Updating the first is fine; once it is gone, another may come.
	if _, err := Install(ctx, cfg, a); err != nil {
		t.Errorf("re-install of the same namespace: %v", err)
	}
	if _, err := Uninstall(ctx, cfg, UninstallOptions{Namespace: a.Namespace}); err != nil {
		t.Fatal(err)
	}

	for _, ns := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		if _, err := Install(ctx, cfg, Options{Namespace: ns, Ephemeral: true}); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("install in %s: %v, want refused", ns, err)
		}
	}

	// A sandbox namespace that is not install's.
	foreign := c.Namespace(t, "team-sandboxes")
	_, err = Install(ctx, cfg, Options{Namespace: "brisk-b", SandboxNamespace: foreign, WorkerRuntime: "kube", Ephemeral: true, Replicas: 1})
	if err == nil || !strings.Contains(err.Error(), "--sandbox-namespace") {
		t.Errorf("install with someone else's sandbox namespace: %v, want refused", err)
	}
	if n, _ := cs.CoreV1().Namespaces().Get(ctx, foreign, metav1.GetOptions{}); n.Labels["pod-security.kubernetes.io/enforce"] != "" {
		t.Error("install relabelled a namespace it did not make")
	}

	// Registry volumes without their Secret. The namespace is not
	// install's, so uninstall keeps it and the volume.
	ns := c.Namespace(t, "brisk-data")
	o := Options{Namespace: ns, Replicas: 1}
	if _, err := Install(ctx, cfg, o); err != nil {
		t.Fatal(err)
	}
	// What the StatefulSet controller (not running here) would make.
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data-brisk-controlplane-0"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	removed, err := Uninstall(ctx, cfg, UninstallOptions{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, Change{Kind: "PersistentVolumeClaim", Namespace: ns, Name: pvc.Name, Action: Kept}) {
		t.Errorf("uninstall did not report the kept volume: %v", removed)
	}
	_, err = Install(ctx, cfg, o)
	if err == nil || !strings.Contains(err.Error(), pvc.Name) || !strings.Contains(err.Error(), "delete") {
		t.Fatalf("install over an earlier registry without its Secret: %v; want a refusal saying what to do", err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Get(ctx, SecretControlPlane, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused install made the Secret: %v", err)
	}
	// An ephemeral registry does not use the volumes.
	if _, err := Install(ctx, cfg, Options{Namespace: ns, Replicas: 1, Ephemeral: true}); err != nil {
		t.Errorf("ephemeral install: %v", err)
	}
	removed, err = Uninstall(ctx, cfg, UninstallOptions{Namespace: ns, DeleteData: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, Change{Kind: "PersistentVolumeClaim", Namespace: ns, Name: pvc.Name, Action: Deleted}) {
		t.Errorf("uninstall --delete-data: %v", removed)
	}
	if _, err := Install(ctx, cfg, o); err != nil {
		t.Errorf("install after the volumes were deleted: %v", err)
	}
}

var gvrFunctions = schema.GroupVersionResource{Group: "brisk.dev", Version: "v1", Resource: "functions"}

// TestUninstallReleasesFunctions: Function objects hold the controller's
// finalizer; uninstall takes it off (the controller that would is gone
// after), so that deleting them, their namespace or the CRD finishes.
func TestUninstallReleasesFunctions(t *testing.T) {
	if FunctionFinalizer != fncontroller.Finalizer {
		t.Fatalf("FunctionFinalizer %q, the controller's is %q", FunctionFinalizer, fncontroller.Finalizer)
	}
	c := kubecluster.Start(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := c.AdminConfig()
	o := Options{Namespace: "brisk-fn", Ephemeral: true, Replicas: 1}
	if _, err := Install(ctx, cfg, o); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// As the controller leaves them: its finalizer on, one of them
	// already being deleted.
	var fns []string
	for _, ns := range []string{c.Namespace(t, "team-a"), c.Namespace(t, "team-b")} {
		for _, name := range []string{"hello", "bye"} {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "brisk.dev/v1", "kind": "Function",
				"metadata": map[string]any{"name": name, "namespace": ns, "finalizers": []any{FunctionFinalizer}},
				"spec":     map[string]any{"image": "registry.invalid/" + name + ":v1"},
			}}
			err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				_, err := dyn.Resource(gvrFunctions).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
				return err == nil, nil // the CRD was established a moment ago
			})
			if err != nil {
				t.Fatalf("create function %s/%s: %v", ns, name, err)
			}
			fns = append(fns, ns+"/"+name)
		}
	}
	if err := dyn.Resource(gvrFunctions).Namespace("team-a").Delete(ctx, "bye", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	removed, err := Uninstall(ctx, cfg, UninstallOptions{Namespace: o.Namespace})
	if err != nil {
		t.Fatalf("uninstall: %v\n%v", err, removed)
	}
	var released []string
	for _, ch := range removed {
		if ch.Kind == "Function" && ch.Action == Released {
			released = append(released, ch.Namespace+"/"+ch.Name)
		}
	}
	slices.Sort(released)
	slices.Sort(fns)
	if !slices.Equal(released, fns) {
		t.Errorf("finalizers removed from %v, want %v", released, fns)
	}
	l, err := dyn.Resource(gvrFunctions).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range l.Items {
		if len(u.GetFinalizers()) > 0 || u.GetName() == "bye" && u.GetNamespace() == "team-a" {
			t.Errorf("function %s/%s after uninstall: finalizers %v", u.GetNamespace(), u.GetName(), u.GetFinalizers())
		}
	}

	// Again with the CRD: its deletion (the apiserver deletes every
	// Function first) finishes. The objects get the finalizer back as if
	// a controller had run since. (Another namespace: no namespace
	// controller runs here to finish deleting the first.)
	o.Namespace = "brisk-fn2"
	if _, err := Install(ctx, cfg, o); err != nil {
		t.Fatal(err)
	}
	for _, u := range l.Items {
		u.SetFinalizers([]string{FunctionFinalizer})
		if _, err := dyn.Resource(gvrFunctions).Namespace(u.GetNamespace()).Update(ctx, &u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if removed, err = Uninstall(ctx, cfg, UninstallOptions{Namespace: o.Namespace, CRDs: true}); err != nil {
		t.Fatalf("uninstall --crds: %v\n%v", err, removed)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := crds.Get(ctx, "functions.brisk.dev", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("the Function CRD is still there after uninstall --crds: %v", err)
	}
}

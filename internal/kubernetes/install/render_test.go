package install

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/brisk-faas/brisk/internal/controlplane/replica"
	"github.com/brisk-faas/brisk/internal/kubernetes/fncontroller"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
)

func render(t *testing.T, o Options) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			var v T
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &v, true); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return &v
		}
	}
	t.Fatalf("no %s %s among the rendered objects", kind, name)
	return nil
}

func has(objs []*unstructured.Unstructured, kind, name string) bool {
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return true
		}
	}
	return false
}

// TestRenderShapes checks the objects the issue asks for: a 3-replica
// StatefulSet behind a headless Service, a Deployment with its Service, a
// DaemonSet, and the RBAC, with the namespace, image and counts asked for.
func TestRenderShapes(t *testing.T) {
	objs := render(t, Options{Namespace: "faas", Image: "registry.invalid/brisk:v9", DataPlanes: 4})

	ss := find[appsv1.StatefulSet](t, objs, "StatefulSet", "brisk-controlplane")
	if *ss.Spec.Replicas != 3 || ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement || ss.Namespace != "faas" {
		t.Errorf("control plane: %d replicas, policy %q, namespace %q; want 3, Parallel, faas", *ss.Spec.Replicas, ss.Spec.PodManagementPolicy, ss.Namespace)
	}
	if len(ss.Spec.VolumeClaimTemplates) != 1 || ss.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String() != "1Gi" {
		t.Errorf("control plane volumes: %+v", ss.Spec.VolumeClaimTemplates)
	}
	hs := find[corev1.Service](t, objs, "Service", ss.Spec.ServiceName)
	if hs.Spec.ClusterIP != corev1.ClusterIPNone || !hs.Spec.PublishNotReadyAddresses {
		t.Errorf("control plane's Service: clusterIP %q, publishNotReadyAddresses %v; want headless, publishing", hs.Spec.ClusterIP, hs.Spec.PublishNotReadyAddresses)
	}
	if !selects(hs.Spec.Selector, ss.Spec.Template.Labels) {
		t.Errorf("headless Service selector %v does not select %v", hs.Spec.Selector, ss.Spec.Template.Labels)
	}

	dp := find[appsv1.Deployment](t, objs, "Deployment", "brisk-dataplane")
	if *dp.Spec.Replicas != 4 {
		t.Errorf("data planes: %d replicas, want 4", *dp.Spec.Replicas)
	}
	svc := find[corev1.Service](t, objs, "Service", "brisk-dataplane")
	if !selects(svc.Spec.Selector, dp.Spec.Template.Labels) || selects(svc.Spec.Selector, ss.Spec.Template.Labels) {
		t.Errorf("data plane Service selector %v: want the data planes only", svc.Spec.Selector)
	}
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "brisk-worker")
	if !ds.Spec.Template.Spec.HostNetwork || ds.Labels[LabelWorkerRuntime] != "containerd" {
		t.Errorf("worker DaemonSet: hostNetwork %v, runtime %q; want the containerd worker", ds.Spec.Template.Spec.HostNetwork, ds.Labels[LabelWorkerRuntime])
	}
	if has(objs, "Role", "brisk-worker") || has(objs, "RoleBinding", "brisk-worker") {
		t.Error("the containerd worker got the kube runtime's Role")
	}
	crb := find[rbacv1.ClusterRoleBinding](t, objs, "ClusterRoleBinding", "brisk:functions:faas")
	if crb.RoleRef.Name != "brisk:functions:faas" || len(crb.Subjects) != 1 || crb.Subjects[0].Namespace != "faas" || crb.Subjects[0].Name != "brisk-functions" {
		t.Errorf("ClusterRoleBinding: %+v", crb)
	}
	cr := find[rbacv1.ClusterRole](t, objs, "ClusterRole", "brisk:functions:faas")
	if want := fncontroller.Rules(); !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("Function controller's rules %+v, want fncontroller.Rules %+v", cr.Rules, want)
	}
	fc := find[appsv1.Deployment](t, objs, "Deployment", "brisk-functions")
	if *fc.Spec.Replicas != 1 || fc.Spec.Template.Spec.ServiceAccountName != "brisk-functions" {
		t.Errorf("Function controller: %d replicas, account %s; want 1, brisk-functions", *fc.Spec.Replicas, fc.Spec.Template.Spec.ServiceAccountName)
	}

	for _, pod := range []*corev1.PodTemplateSpec{&ss.Spec.Template, &dp.Spec.Template, &ds.Spec.Template, &fc.Spec.Template} {
		// The kube runtime takes Pods so labelled in its namespace for
		// sandboxes: brisk's own must never be.
		if pod.Labels[kube.LabelManagedBy] == kube.ManagedBy {
			t.Errorf("%v: Pods labelled as the kube runtime's sandboxes", pod.Labels)
		}
		for _, c := range pod.Spec.Containers {
			if c.Image != "registry.invalid/brisk:v9" {
				t.Errorf("container %s: image %q", c.Name, c.Image)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("container %s: resource requests wanted", c.Name)
			}
			// The Function controller serves nothing a probe could ask.
			if c.Name != "functions" && (c.ReadinessProbe == nil || c.LivenessProbe == nil) {
				t.Errorf("container %s: probes wanted", c.Name)
			}
		}
	}
	for _, u := range objs {
		if u.GetKind() == "Secret" {
			t.Errorf("Secret %s rendered: secrets are made by Install, never written in the manifests", u.GetName())
		}
		if strings.Contains(mustYAML(t, u), DefaultNamespace) {
			t.Errorf("%s %s still names %s", u.GetKind(), u.GetName(), DefaultNamespace)
		}
		if u.GetLabels()[LabelManagedBy] != ManagedBy {
			t.Errorf("%s %s is not labelled %s=%s (uninstall keeps what is not)", u.GetKind(), u.GetName(), LabelManagedBy, ManagedBy)
		}
	}
}

func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func mustYAML(t *testing.T, u *unstructured.Unstructured) string {
	var b strings.Builder
	if err := YAML(&b, []*unstructured.Unstructured{u}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestRenderLeastPrivilege checks who gets what: the containerd worker is
// the one privileged Pod and has no API token; the kube worker has the
// kube runtime's Role (the very rules of kube.Role) and no privilege; the
// data planes have no token; the control plane runs as non-root.
func TestRenderLeastPrivilege(t *testing.T) {
	objs := render(t, Options{WorkerRuntime: "kube"})
	role := find[rbacv1.Role](t, objs, "Role", "brisk-worker")
	if want := kube.Role(role.Namespace, role.Name).Rules; !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("worker Role rules %+v, want kube.Role's %+v", role.Rules, want)
	}
	rb := find[rbacv1.RoleBinding](t, objs, "RoleBinding", "brisk-worker")
	if rb.RoleRef.Name != role.Name || rb.Subjects[0].Name != "brisk-worker" || rb.Subjects[0].Namespace != DefaultNamespace {
		t.Errorf("worker RoleBinding %+v", rb)
	}
	kw := find[appsv1.DaemonSet](t, objs, "DaemonSet", "brisk-worker").Spec.Template.Spec
	if kw.HostNetwork || kw.Containers[0].SecurityContext.Privileged != nil || !contains(kw.Containers[0].Args, "--runtime=kube") {
		t.Errorf("kube worker: hostNetwork %v, privileged %v, args %v", kw.HostNetwork, kw.Containers[0].SecurityContext.Privileged, kw.Containers[0].Args)
	}
	if sc := kw.Containers[0].SecurityContext; sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || *sc.AllowPrivilegeEscalation {
		t.Errorf("kube worker: security context %+v, want every capability dropped", sc)
	}

	objs = render(t, Options{})
	cw := find[appsv1.DaemonSet](t, objs, "DaemonSet", "brisk-worker").Spec.Template.Spec
	if cw.AutomountServiceAccountToken == nil || *cw.AutomountServiceAccountToken {
		t.Error("the containerd worker gets an API token it does not use")
	}
	dp := find[appsv1.Deployment](t, objs, "Deployment", "brisk-dataplane").Spec.Template.Spec
	if dp.AutomountServiceAccountToken == nil || *dp.AutomountServiceAccountToken {
		t.Error("the data planes get an API token they do not use")
	}
	cp := find[appsv1.StatefulSet](t, objs, "StatefulSet", "brisk-controlplane").Spec.Template.Spec
	if cp.AutomountServiceAccountToken == nil || *cp.AutomountServiceAccountToken {
		t.Error("the control plane gets an API token it does not use")
	}
	fc := find[appsv1.Deployment](t, objs, "Deployment", "brisk-functions").Spec.Template.Spec
	for _, v := range fc.Volumes {
		if v.Secret != nil && v.Secret.SecretName == SecretControlPlane && (len(v.Secret.Items) != 2 || v.Secret.Items[1].Key != KeyDeployToken) {
			t.Errorf("the Function controller mounts %+v of the control plane's Secret, want ca.crt and deploy.token only", v.Secret.Items)
		}
	}
	if !contains(fc.Containers[0].Args, "--token-file=/etc/brisk/deploy.token") {
		t.Errorf("the Function controller's args %v: want the deploy token", fc.Containers[0].Args)
	}
	if !contains(cp.Containers[0].Args, "--bootstrap-deploy-token-file=/etc/brisk/deploy.token") {
		t.Errorf("the control plane's args %v: want the deploy token registered", cp.Containers[0].Args)
	}
	for _, p := range []corev1.PodSpec{dp, cp, fc} {
		if p.SecurityContext == nil || p.SecurityContext.RunAsNonRoot == nil || !*p.SecurityContext.RunAsNonRoot {
			t.Errorf("%s runs as root", p.ServiceAccountName)
		}
		for _, v := range p.Volumes {
			if v.Secret != nil && v.Secret.SecretName == SecretControlPlane && p.ServiceAccountName != "brisk-controlplane" && len(v.Secret.Items) == 0 {
				t.Errorf("%s mounts the CA's key", p.ServiceAccountName)
			}
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestPeers checks that --peers, as the Pods expand it, is what brisk
// controlplane accepts, with ids the StatefulSet's Pod names.
func TestPeers(t *testing.T) {
	for _, n := range []int{1, 3, 5} {
		peers, err := replica.ParsePeers(strings.ReplaceAll(Peers(n), "$(POD_NAMESPACE)", "ns1"))
		if err != nil {
			t.Fatalf("%d replicas: %v", n, err)
		}
		if len(peers) != n {
			t.Fatalf("%d replicas: %d peers", n, len(peers))
		}
		for i, p := range peers {
			id := "brisk-controlplane-" + string(rune('0'+i))
			if p.ID != id || p.GRPCAddr != id+".brisk-controlplane.ns1.svc:9091" || p.RaftAddr != id+".brisk-controlplane.ns1.svc:7100" {
				t.Errorf("peer %d: %+v", i, p)
			}
		}
		if got := len(strings.Split(ControlPlanes(n), ",")); got != n {
			t.Errorf("%d replicas: %d control-plane addresses", n, got)
		}
	}
	objs := render(t, Options{Replicas: 5})
	ss := find[appsv1.StatefulSet](t, objs, "StatefulSet", "brisk-controlplane")
	for _, e := range ss.Spec.Template.Spec.Containers[0].Env {
		if e.Name == envPeers && e.Value != Peers(5) {
			t.Errorf("BRISK_PEERS = %q, want Peers(5)", e.Value)
		}
	}
}

func TestRenderRejects(t *testing.T) {
	for _, o := range []Options{
		{Replicas: 2}, {Replicas: -1}, {DataPlanes: -3}, {Namespace: "Not_A_Name"},
		{WorkerRuntime: "docker"}, {Image: "a b"}, {StorageSize: "lots"}, {StorageSize: "-1Gi"},
		// Kubernetes' own namespaces.
		{Namespace: "default"}, {Namespace: "kube-system"}, {Namespace: "kube-public"}, {Namespace: "kube-node-lease"},
		{Namespace: "kube-brisk"}, {SandboxNamespace: "default"}, {SandboxNamespace: "kube-system"},
		// The sandboxes away from brisk's Secrets.
		{Namespace: "faas", SandboxNamespace: "faas"}, {SandboxNamespace: "Not_A_Name"},
		{Namespace: strings.Repeat("n", 60)}, // its sandbox namespace would be too long
		{APIServer: "10.0.0.1"}, {APIServer: "10.0.0.1:0"}, {APIServer: ":443"}, {APIServer: "10.0.0.1:https"},
		{APIServer: "$(POD_IP):443"},
	} {
		if _, err := Render(o); err == nil {
			t.Errorf("Render(%+v) accepted", o)
		}
	}
}

func TestEphemeral(t *testing.T) {
	objs := render(t, Options{Ephemeral: true, Replicas: 1})
	ss := find[appsv1.StatefulSet](t, objs, "StatefulSet", "brisk-controlplane")
	if len(ss.Spec.VolumeClaimTemplates) != 0 {
		t.Error("ephemeral storage kept the volume claim template")
	}
	found := false
	for _, v := range ss.Spec.Template.Spec.Volumes {
		found = found || v.Name == "data" && v.EmptyDir != nil
	}
	if !found {
		t.Error("no emptyDir data volume")
	}
}

// TestRenderSandboxNamespace checks the kube worker's sandbox namespace:
// the functions' Pods go there, Pod Security baseline enforced and
// restricted warned and audited; the workers' Role is there and not in
// brisk's namespace; its default ServiceAccount mounts no token; and no
// ServiceAccount of brisk's mounts one unless its Pod asks.
func TestRenderSandboxNamespace(t *testing.T) {
	objs := render(t, Options{Namespace: "faas", WorkerRuntime: "kube"})
	ns := find[corev1.Namespace](t, objs, "Namespace", "faas-sandboxes")
	for k, v := range map[string]string{
		"pod-security.kubernetes.io/enforce": "baseline",
		"pod-security.kubernetes.io/warn":    "restricted",
		"pod-security.kubernetes.io/audit":   "restricted",
	} {
		if ns.Labels[k] != v {
			t.Errorf("sandbox namespace: %s=%q, want %q", k, ns.Labels[k], v)
		}
	}
	if l := find[corev1.Namespace](t, objs, "Namespace", "faas").Labels; l["pod-security.kubernetes.io/enforce"] != "" {
		t.Errorf("brisk's namespace labelled %v: the containerd worker is privileged", l)
	}
	for _, u := range objs {
		switch u.GetKind() {
		case "Role", "RoleBinding":
			if u.GetNamespace() != "faas-sandboxes" {
				t.Errorf("%s %s/%s: the workers' rights belong in the sandbox namespace only", u.GetKind(), u.GetNamespace(), u.GetName())
			}
		case "Secret":
			t.Errorf("Secret %s/%s rendered", u.GetNamespace(), u.GetName())
		}
	}
	rb := find[rbacv1.RoleBinding](t, objs, "RoleBinding", "brisk-worker")
	if rb.Subjects[0].Namespace != "faas" || rb.Subjects[0].Name != "brisk-worker" {
		t.Errorf("worker RoleBinding subjects %+v, want faas/brisk-worker", rb.Subjects)
	}
	kw := find[appsv1.DaemonSet](t, objs, "DaemonSet", "brisk-worker").Spec.Template.Spec
	if !contains(kw.Containers[0].Args, "--kube-namespace=faas-sandboxes") {
		t.Errorf("kube worker args %v: want --kube-namespace=faas-sandboxes", kw.Containers[0].Args)
	}
	var defaultSA bool
	for _, u := range objs {
		if u.GetKind() != "ServiceAccount" {
			continue
		}
		sa := find[corev1.ServiceAccount](t, []*unstructured.Unstructured{u}, "ServiceAccount", u.GetName())
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("ServiceAccount %s/%s mounts its token in every Pod", sa.Namespace, sa.Name)
		}
		defaultSA = defaultSA || sa.Name == "default" && sa.Namespace == "faas-sandboxes"
	}
	if !defaultSA {
		t.Error("no default ServiceAccount (without a token) for the sandbox namespace")
	}
	// The sandbox namespace is the kube worker's only.
	if objs := render(t, Options{Namespace: "faas"}); has(objs, "Namespace", "faas-sandboxes") {
		t.Error("the containerd worker got a sandbox namespace")
	}
	objs = render(t, Options{Namespace: "faas", SandboxNamespace: "fns", WorkerRuntime: "kube"})
	if !has(objs, "Namespace", "fns") || find[rbacv1.Role](t, objs, "Role", "brisk-worker").Namespace != "fns" {
		t.Error("--sandbox-namespace fns not applied")
	}
}

// TestRenderWorkerPlacement checks that neither worker runs on the
// cluster's control-plane nodes nor tolerates every taint.
func TestRenderWorkerPlacement(t *testing.T) {
	for _, rt := range WorkerRuntimes {
		ds := find[appsv1.DaemonSet](t, render(t, Options{WorkerRuntime: rt}), "DaemonSet", "brisk-worker").Spec.Template.Spec
		for _, tol := range ds.Tolerations {
			if tol.Key == "" && tol.Operator == corev1.TolerationOpExists {
				t.Errorf("%s worker tolerates every taint: %+v", rt, tol)
			}
		}
		ok := false
		if a := ds.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				for _, e := range term.MatchExpressions {
					ok = ok || e.Key == "node-role.kubernetes.io/control-plane" && e.Operator == corev1.NodeSelectorOpDoesNotExist
				}
			}
		}
		if !ok {
			t.Errorf("%s worker: affinity %+v, want node-role.kubernetes.io/control-plane DoesNotExist required", rt, ds.Affinity)
		}
	}
}

// TestRenderPullPolicy: brisk's own local image is never pulled (no
// registry serves image.LocalDomain); others are pulled when missing.
func TestRenderPullPolicy(t *testing.T) {
	for ref, want := range map[string]corev1.PullPolicy{
		ImageRef:                    corev1.PullNever,
		"registry.invalid/brisk:v9": corev1.PullIfNotPresent,
		"brisk.local.example/b:v1":  corev1.PullIfNotPresent,
	} {
		for _, u := range render(t, Options{Image: ref, WorkerRuntime: "kube"}) {
			var pod *corev1.PodSpec
			switch u.GetKind() {
			case "Deployment":
				pod = &find[appsv1.Deployment](t, []*unstructured.Unstructured{u}, u.GetKind(), u.GetName()).Spec.Template.Spec
			case "StatefulSet":
				pod = &find[appsv1.StatefulSet](t, []*unstructured.Unstructured{u}, u.GetKind(), u.GetName()).Spec.Template.Spec
			case "DaemonSet":
				pod = &find[appsv1.DaemonSet](t, []*unstructured.Unstructured{u}, u.GetKind(), u.GetName()).Spec.Template.Spec
			default:
				continue
			}
			for _, c := range pod.Containers {
				if c.ImagePullPolicy != want {
					t.Errorf("image %s, %s %s: pull policy %s, want %s", ref, u.GetKind(), u.GetName(), c.ImagePullPolicy, want)
				}
			}
		}
	}
}

// TestRenderFunctionsCreateNamespaces: the Function controller creates
// brisk namespaces only when asked.
func TestRenderFunctionsCreateNamespaces(t *testing.T) {
	for _, on := range []bool{false, true} {
		fc := find[appsv1.Deployment](t, render(t, Options{FunctionsCreateNamespaces: on}), "Deployment", "brisk-functions")
		want := "--create-namespaces=false"
		if on {
			want = "--create-namespaces=true"
		}
		token := KeyDeployToken
		if on {
			token = KeyAdminToken // creating namespaces is an admin's act
		}
		if args := fc.Spec.Template.Spec.Containers[0].Args; !contains(args, want) || !contains(args, "--token-file=/etc/brisk/"+token) {
			t.Errorf("FunctionsCreateNamespaces %v: args %v, want %s and the %s", on, args, want, token)
		}
		var mounted []string
		for _, v := range fc.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				for _, it := range v.Secret.Items {
					mounted = append(mounted, it.Key)
				}
			}
		}
		if !slices.Equal(mounted, []string{KeyCACert, token}) {
			t.Errorf("FunctionsCreateNamespaces %v: mounts %v, want ca.crt and %s", on, mounted, token)
		}
	}
}

// TestRenderAPIServer: --api-server reaches the Pods that use the API (the
// kube worker, the Function controller) as the variables client-go's
// in-cluster config reads, and no other Pod.
func TestRenderAPIServer(t *testing.T) {
	env := func(c corev1.Container) map[string]string {
		m := map[string]string{}
		for _, e := range c.Env {
			m[e.Name] = e.Value
		}
		return m
	}
	objs := render(t, Options{WorkerRuntime: "kube", APIServer: "10.216.0.1:6443"})
	for _, c := range []corev1.Container{
		find[appsv1.DaemonSet](t, objs, "DaemonSet", "brisk-worker").Spec.Template.Spec.Containers[0],
		find[appsv1.Deployment](t, objs, "Deployment", "brisk-functions").Spec.Template.Spec.Containers[0],
	} {
		if e := env(c); e["KUBERNETES_SERVICE_HOST"] != "10.216.0.1" || e["KUBERNETES_SERVICE_PORT"] != "6443" {
			t.Errorf("%s: %v, want the apiserver's address", c.Name, e)
		}
	}
	for _, c := range []corev1.Container{
		find[appsv1.StatefulSet](t, objs, "StatefulSet", "brisk-controlplane").Spec.Template.Spec.Containers[0],
		find[appsv1.Deployment](t, objs, "Deployment", "brisk-dataplane").Spec.Template.Spec.Containers[0],
	} {
		if _, ok := env(c)["KUBERNETES_SERVICE_HOST"]; ok {
			t.Errorf("%s, which has no API token, is given the apiserver's address", c.Name)
		}
	}
	// Without it, the kubelet's variables of the kubernetes Service stay.
	w := find[appsv1.DaemonSet](t, render(t, Options{WorkerRuntime: "kube"}), "DaemonSet", "brisk-worker").Spec.Template.Spec.Containers[0]
	if _, ok := env(w)["KUBERNETES_SERVICE_HOST"]; ok {
		t.Error("the worker's apiserver address is set without --api-server")
	}
}

package install

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
)

// TestInstall installs brisk on a real kube-apiserver (RBAC on): every
// object applies; a second install changes nothing; the ServiceAccounts
// have the rights asked and no more, as the apiserver's authorizer says;
// switching the worker runtime adds and removes the worker's Role;
// uninstall removes it all but the CRD.
func TestInstall(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := c.AdminConfig()
	o := Options{Namespace: "brisk-test", Ephemeral: true}

	changes, err := Install(ctx, cfg, o)
	if err != nil {
		t.Fatalf("install: %v\n%v", err, changes)
	}
	objs := render(t, o)
	if len(changes) != len(objs)+2 { // and the two Secrets
		t.Errorf("install made %d changes for %d objects and 2 Secrets: %v", len(changes), len(objs), changes)
	}
	for _, ch := range changes {
		if ch.Action != Created {
			t.Errorf("first install: %s", ch)
		}
	}
	cs := c.Client
	ss, err := cs.AppsV1().StatefulSets(o.Namespace).Get(ctx, "brisk-controlplane", metav1.GetOptions{})
	if err != nil || *ss.Spec.Replicas != 3 {
		t.Fatalf("control plane StatefulSet: %v", err)
	}
	if _, err := cs.AppsV1().Deployments(o.Namespace).Get(ctx, "brisk-dataplane", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().DaemonSets(o.Namespace).Get(ctx, "brisk-worker", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services(o.Namespace).Get(ctx, "brisk-dataplane", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	cpSecret, err := cs.CoreV1().Secrets(o.Namespace).Get(ctx, SecretControlPlane, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	join, err := cs.CoreV1().Secrets(o.Namespace).Get(ctx, SecretJoin, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := join.Data[KeyCAKey]; ok || string(join.Data[KeyJoinToken]) != string(cpSecret.Data[KeyJoinToken]) {
		t.Errorf("join Secret holds %d keys; want the CA certificate and the control plane's join token only", len(join.Data))
	}
	for k, scope := range map[string]string{KeyAdminToken: auth.ScopeAdmin, KeyJoinToken: auth.ScopeJoin, KeyDeployToken: auth.ScopeDeploy} {
		if _, err := auth.GrantOf(string(cpSecret.Data[k][:len(cpSecret.Data[k])-1]), []string{scope}); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}

	// Idempotent: nothing changes, the Secrets least of all.
	again, err := Install(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range again {
		if ch.Action != Unchanged {
			t.Errorf("second install: %s", ch)
		}
	}
	if s, _ := cs.CoreV1().Secrets(o.Namespace).Get(ctx, SecretControlPlane, metav1.GetOptions{}); string(s.Data[KeyCAKey]) != string(cpSecret.Data[KeyCAKey]) {
		t.Error("re-install replaced the cluster CA")
	}

	// A Secret made before install made deploy tokens: install neither
	// refuses nor rotates it; the Function controller keeps the admin
	// token, as its control plane would not register a new deploy token.
	controllerToken := func() (item, arg string) {
		t.Helper()
		d, err := cs.AppsV1().Deployments(o.Namespace).Get(ctx, "brisk-functions", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil && len(v.Secret.Items) == 2 {
				item = v.Secret.Items[1].Key
			}
		}
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--token-file=") {
				arg = a
			}
		}
		return item, arg
	}
	legacy := cpSecret.DeepCopy()
	delete(legacy.Data, KeyDeployToken)
	if _, err := cs.CoreV1().Secrets(o.Namespace).Update(ctx, legacy, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if chs, err := Install(ctx, cfg, o); err != nil {
		t.Fatalf("install over a Secret without %s: %v\n%v", KeyDeployToken, err, chs)
	}
	if item, arg := controllerToken(); item != KeyAdminToken || arg != "--token-file=/etc/brisk/"+KeyAdminToken {
		t.Errorf("over a Secret without %s the controller mounts %q with %q, want the admin token", KeyDeployToken, item, arg)
	}
	if s, _ := cs.CoreV1().Secrets(o.Namespace).Get(ctx, SecretControlPlane, metav1.GetOptions{}); string(s.Data[KeyCAKey]) != string(cpSecret.Data[KeyCAKey]) {
		t.Error("install over an older Secret replaced the cluster CA")
	}
	restored := cpSecret.DeepCopy()
	restored.ResourceVersion = ""
	if cur, err := cs.CoreV1().Secrets(o.Namespace).Get(ctx, SecretControlPlane, metav1.GetOptions{}); err == nil {
		restored.ResourceVersion = cur.ResourceVersion
	}
	if _, err := cs.CoreV1().Secrets(o.Namespace).Update(ctx, restored, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(ctx, cfg, o); err != nil {
		t.Fatal(err)
	}
	if item, arg := controllerToken(); item != KeyDeployToken || arg != "--token-file=/etc/brisk/"+KeyDeployToken {
		t.Errorf("the controller mounts %q with %q, want the deploy token", item, arg)
	}

	sa := func(name string) authzv1.SubjectAccessReviewSpec {
		return authzv1.SubjectAccessReviewSpec{User: "system:serviceaccount:" + o.Namespace + ":" + name,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + o.Namespace, "system:authenticated"}}
	}
	type access struct {
		who                            string
		verb, group, resource, ns, sub string
		allowed                        bool
	}
	check := func(t *testing.T, cases []access) {
		t.Helper()
		for _, a := range cases {
			spec := sa(a.who)
			spec.ResourceAttributes = &authzv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.ns, Subresource: a.sub}
			if got := allowed(ctx, t, cs, spec); got != a.allowed {
				t.Errorf("%s may %s %s/%s in %q: %v, want %v", a.who, a.verb, a.resource, a.sub, a.ns, got, a.allowed)
			}
		}
	}
	ns := o.Namespace
	// The containerd worker and the data planes never use the API.
	check(t, []access{
		{"brisk-worker", "create", "", "pods", ns, "", false},
		{"brisk-worker", "list", "", "pods", ns, "", false},
		{"brisk-dataplane", "get", "", "secrets", ns, "", false},
		{"brisk-dataplane", "list", "", "pods", ns, "", false},
		{"brisk-controlplane", "get", "", "secrets", ns, "", false},
		{"brisk-controlplane", "create", "", "pods", ns, "", false},
		{"brisk-controlplane", "list", "brisk.dev", "functions", "", "", false},
		// The Function controller: Function objects in every namespace.
		{"brisk-functions", "watch", "brisk.dev", "functions", "", "", true},
		{"brisk-functions", "update", "brisk.dev", "functions", "team-a", "", true},
		{"brisk-functions", "update", "brisk.dev", "functions", "team-a", "status", true},
		{"brisk-functions", "delete", "brisk.dev", "functions", "team-a", "", false},
		{"brisk-functions", "create", "brisk.dev", "functions", "team-a", "", false},
		{"brisk-functions", "get", "", "secrets", ns, "", false},
		{"brisk-functions", "create", "", "pods", ns, "", false},
	})

	// The kube worker: Pods in the sandbox namespace, nothing else.
	o.WorkerRuntime = "kube"
	if changes, err = Install(ctx, cfg, o); err != nil {
		t.Fatal(err)
	}
	sb := ns + SandboxSuffix
	check(t, []access{
		{"brisk-worker", "create", "", "pods", sb, "", true},
		{"brisk-worker", "watch", "", "pods", sb, "", true},
		{"brisk-worker", "delete", "", "pods", sb, "", true},
		{"brisk-worker", "create", "", "pods", ns, "", false},
		{"brisk-worker", "list", "", "pods", ns, "", false},
		{"brisk-worker", "get", "", "secrets", sb, "", false},
		{"brisk-worker", "create", "", "pods", "default", "", false},
		{"brisk-worker", "list", "", "pods", "", "", false}, // all namespaces
		{"brisk-worker", "get", "", "secrets", ns, "", false},
		{"brisk-worker", "list", "", "nodes", "", "", false},
		{"brisk-worker", "update", "", "pods", ns, "", false},
	})
	ds, err := cs.AppsV1().DaemonSets(ns).Get(ctx, "brisk-worker", metav1.GetOptions{})
	if err != nil || ds.Spec.Template.Spec.HostNetwork || ds.Labels[LabelWorkerRuntime] != "kube" {
		t.Fatalf("after switching to the kube worker: %v, %+v", err, ds.Labels)
	}
	// And back: the Role goes.
	o.WorkerRuntime = "containerd"
	if changes, err = Install(ctx, cfg, o); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(sb).Get(ctx, "brisk-worker", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the kube worker's Role outlived the switch back to containerd: %v (%v)", err, changes)
	}
	check(t, []access{{"brisk-worker", "create", "", "pods", sb, "", false}})

	// Uninstall removes everything install made but the CRD.
	removed, err := Uninstall(ctx, cfg, UninstallOptions{Namespace: ns})
	if err != nil {
		t.Fatalf("uninstall: %v\n%v", err, removed)
	}
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			continue
		}
		_, err := newTestClient(t, cfg).get(ctx, u)
		if u.GetKind() == "CustomResourceDefinition" {
			if err != nil {
				t.Errorf("uninstall removed CRD %s without --crds: %v", u.GetName(), err)
			}
			continue
		}
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s %s after uninstall: %v", u.GetKind(), u.GetName(), err)
		}
	}
	for _, s := range []string{SecretControlPlane, SecretJoin} {
		if _, err := cs.CoreV1().Secrets(ns).Get(ctx, s, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("secret %s after uninstall: %v", s, err)
		}
	}
	// No namespace controller runs here to finish the deletion: the
	// namespace is Terminating, or gone.
	if n, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil && n.DeletionTimestamp == nil {
		t.Error("uninstall left the namespace it made")
	}
	// A second uninstall finds nothing to do.
	removed, err = Uninstall(ctx, cfg, UninstallOptions{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range removed {
		if ch.Action == Deleted && ch.Kind != "Namespace" {
			t.Errorf("second uninstall: %s", ch)
		}
	}
}

// TestInstallKeepsForeignNamespace installs into a namespace someone else
// made: install leaves it as it is and uninstall does not delete it.
func TestInstallKeepsForeignNamespace(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := c.Namespace(t, "shared")
	o := Options{Namespace: ns, Ephemeral: true, Replicas: 1}
	changes, err := Install(ctx, c.AdminConfig(), o)
	if err != nil {
		t.Fatal(err)
	}
	if changes[0].Kind != "Namespace" || changes[0].Action != Kept {
		t.Errorf("install of a foreign namespace: %s", changes[0])
	}
	if _, err := Uninstall(ctx, c.AdminConfig(), UninstallOptions{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	n, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil || n.DeletionTimestamp != nil {
		t.Errorf("uninstall deleted a namespace it did not make: %v", err)
	}
	if _, err := c.Client.AppsV1().StatefulSets(ns).Get(ctx, "brisk-controlplane", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("control plane after uninstall: %v", err)
	}
}

func allowed(ctx context.Context, t *testing.T, cs kubernetes.Interface, spec authzv1.SubjectAccessReviewSpec) bool {
	t.Helper()
	r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return r.Status.Allowed
}

func newTestClient(t *testing.T, cfg *rest.Config) *client {
	t.Helper()
	c, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInstallPodsRun installs brisk on a cluster with the controllers and
// the scheduler running, and waits for every Pod of its workloads to be
// scheduled and Running on the KWOK nodes (which run no container: this
// checks that the objects are schedulable and the controllers accept
// them, not that brisk serves). One of the three nodes is a Kubernetes
// control-plane node: it gets no worker.
func TestInstallPodsRun(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{Nodes: 3})
	c.Schedulable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cpNode := c.Nodes[0]
	patch := []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, cpNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c.StartControllers(t, 0)
	o := Options{Namespace: "brisk-run", Ephemeral: true}
	if changes, err := Install(ctx, c.AdminConfig(), o); err != nil {
		t.Fatalf("install: %v\n%v", err, changes)
	}
	// 3 control-plane replicas, 2 data planes, a worker on each of the 2
	// nodes that are not the cluster's control plane, the Function
	// controller.
	want := map[string]int{"controlplane": 3, "dataplane": 2, "worker": 2, "functions": 1}
	var last map[string]int
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		last = map[string]int{}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
				last[p.Labels["app.kubernetes.io/component"]]++
			}
			if p.Labels["app.kubernetes.io/component"] == "worker" && p.Spec.NodeName == cpNode {
				return false, fmt.Errorf("worker %s on control-plane node %s", p.Name, cpNode)
			}
		}
		return maps.Equal(last, want), nil
	})
	if err != nil {
		t.Fatalf("Running Pods by component: %v, want %v (%v)", last, want, err)
	}
	ss, err := c.Client.AppsV1().StatefulSets(o.Namespace).Get(ctx, "brisk-controlplane", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p, err := c.Client.CoreV1().Pods(o.Namespace).Get(ctx, ss.Name+"-"+strconv.Itoa(i), metav1.GetOptions{})
		if err != nil || p.Spec.Hostname != p.Name || p.Spec.Subdomain != "brisk-controlplane" {
			t.Errorf("replica %d: %v; want the stable name the peers list", i, err)
		}
	}
}

package fncontroller

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestController runs the controller against a real kube-apiserver (with
// only the rights ClusterRole grants) and an in-process brisk control
// plane: namespaces are served only once opted in; a brisk namespace
// deleted behind the controller's back is made again, not reported
// missing for ever; a function carrying an object's label in another
// brisk namespace is never taken for the object's, updated or deleted;
// and an object whose deletion brisk refuses (the token revoked) says so
// and goes with AnnotationOrphan, leaving the function.
func TestController(t *testing.T) {
	kc := kubecluster.Start(t, kubecluster.Options{})
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(kc.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	kc.InstallFunctionCRD(t)
	kc.GrantClusterRole(t, ClusterRole("brisk-functions"), kubecluster.WorkerUser)

	adm := startBrisk(t)
	// A controller of one namespace (-n) runs with a Role there and
	// NamespaceReader: no right to list the other Namespaces. (Before the
	// controller of all namespaces starts: it alone writes n1's status.)
	nsOnly := kc.Namespace(t, "team-n")
	if _, err := kc.Client.RbacV1().Roles(nsOnly).Create(ctx, Role(nsOnly, "brisk-functions"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client.RbacV1().RoleBindings(nsOnly).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "brisk-functions", Namespace: nsOnly},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "brisk-functions"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "ns-only"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc.GrantClusterRole(t, NamespaceReader(nsOnly, "brisk-functions-team-n"), "ns-only")
	rc := kc.AdminConfig()
	rc.Impersonate.UserName = "ns-only"
	c2, err := New(Config{REST: rc, Brisk: adm, Namespace: nsOnly, StatusInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- c2.Run(ctx2) }()
	nfns := dyn.Resource(GVR).Namespace(nsOnly)
	o := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"builtin": "trace"}}}
	o.SetAPIVersion(APIVersion)
	o.SetKind(Kind)
	o.SetNamespace(nsOnly)
	o.SetName("n1")
	if _, err := nfns.Create(ctx, o, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool {
		select {
		case err := <-done2:
			t.Fatalf("the controller of one namespace stopped: %v", err)
		default:
		}
		cur, err := nfns.Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			return false
		}
		r := readyCondition(cur)
		return r != nil && r["reason"] == ReasonNamespaceNotEnabled
	}, "n1: NamespaceNotEnabled, from the controller of team-n")
	stop2()
	if err := <-done2; err != nil {
		t.Errorf("the controller of one namespace: %v", err)
	}

	tok, err := adm.CreateToken(ctx, api.TokenRequest{Name: "k8s-functions", Scopes: []string{auth.ScopeAdmin}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := &testutil.RequestCounter{}
	ctl := client.New(adm.Admin, "")
	ctl.Token, ctl.HTTP = tok.Token, &http.Client{Transport: reqs, Timeout: time.Minute}
	c, err := New(Config{REST: kc.WorkerConfig(), Brisk: ctl, CreateNamespaces: true, Resync: time.Hour,
		StatusInterval: 100 * time.Millisecond, RetryBase: 50 * time.Millisecond, RetryMax: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})

	ns := kc.Namespace(t, "team-a")
	fns := dyn.Resource(GVR).Namespace(ns)
	apply := func(name, specYAML string) {
		t.Helper()
		var s map[string]any
		if err := yaml.Unmarshal([]byte(specYAML), &s); err != nil {
			t.Fatal(err)
		}
		o := &unstructured.Unstructured{Object: map[string]any{"spec": s}}
		o.SetAPIVersion(APIVersion)
		o.SetKind(Kind)
		o.SetNamespace(ns)
		o.SetName(name)
		if _, err := fns.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	reason := func(name string) (string, string) {
		o, err := fns.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err.Error()
		}
		r := readyCondition(o)
		if r == nil {
			return "", ""
		}
		m, _ := r["message"].(string)
		return r["reason"].(string), m
	}
	fnNamespace := func(name string) string { // "" when brisk has no such function
		v, err := adm.Get(ctx, spec.Qualify(name, ns))
		if err != nil {
			return ""
		}
		return cmpOr(v.Namespace, spec.DefaultNamespace)
	}
	objectGone := func(name string) bool {
		_, err := fns.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	passes := func(n int) { // n more passes of the status loop
		t.Helper()
		from := reqs.Count("GET /v1/functions")
		testutil.Eventually(t, 30*time.Second, func() bool { return reqs.Count("GET /v1/functions") >= from+n }, "status passes")
	}

	// Not opted in: nothing deployed, the condition says how to opt in.
	apply("a1", "builtin: trace\n")
	testutil.Eventually(t, 30*time.Second, func() bool { r, _ := reason("a1"); return r == ReasonNamespaceNotEnabled }, "a1: NamespaceNotEnabled")
	if _, m := reason("a1"); !strings.Contains(m, "kubectl label namespace team-a brisk.dev/functions=enabled") {
		t.Errorf("a1's message %q does not say how to opt in", m)
	}
	if n := fnNamespace("a1"); n != "" {
		t.Fatalf("a1 deployed into brisk namespace %q from a namespace not opted in", n)
	}
	if _, err := kc.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"brisk.dev/functions":"enabled"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return fnNamespace("a1") == ns }, "a1 deployed once team-a is opted in")

	// The brisk namespace is deleted behind the controller's back (its
	// only function's object deleted first); a new object makes it again.
	if err := fns.Delete(ctx, "a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return objectGone("a1") && fnNamespace("a1") == "" }, "a1 deleted")
	if err := adm.DeleteNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	apply("a2", "builtin: trace\n")
	testutil.Eventually(t, 30*time.Second, func() bool { return fnNamespace("a2") == ns }, "a2 deployed, brisk namespace team-a made again")

	// Functions of the objects' names made through the admin API, not by
	// the objects: not theirs. "f1" has an object, which gets NameTaken
	// and whose deletion leaves f1; "f2" has none, and is not taken for
	// the function of an object deleted without its finalizer.
	for _, name := range []string{"f1", "f2"} {
		if _, err := adm.Create(ctx, &spec.Function{Name: name, Namespace: ns, Builtin: "trace"}); err != nil {
			t.Fatal(err)
		}
	}
	apply("f1", "builtin: trace\nenv: {X: \"1\"}\n")
	testutil.Eventually(t, 30*time.Second, func() bool { r, _ := reason("f1"); return r == ReasonNameTaken }, "f1: NameTaken")
	if err := fns.Delete(ctx, "f1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return objectGone("f1") }, "the f1 object gone")
	passes(3)
	for _, name := range []string{"f1", "f2"} {
		v, err := adm.Get(ctx, spec.Qualify(name, ns))
		if err != nil || v.Namespace != ns || len(v.Env) != 0 {
			t.Errorf("the function %s made through the admin API was changed or deleted: %v %v", name, v, err)
		}
	}

	// The controller's token is revoked: an object being deleted says
	// brisk refuses, and goes once annotated AnnotationOrphan, leaving its
	// function.
	apply("a3", "builtin: trace\n")
	testutil.Eventually(t, 30*time.Second, func() bool { return fnNamespace("a3") == ns }, "a3 deployed")
	if err := adm.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	if err := fns.Delete(ctx, "a3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { r, _ := reason("a3"); return r == ReasonForbidden }, "a3: Forbidden")
	if _, m := reason("a3"); !strings.Contains(m, "brisk.dev/orphan=true") {
		t.Errorf("a3's message %q does not name the escape", m)
	}
	if objectGone("a3") {
		t.Fatal("a3 went although brisk refused to delete its function")
	}
	if _, err := fns.Patch(ctx, "a3", types.MergePatchType, []byte(`{"metadata":{"annotations":{"brisk.dev/orphan":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return objectGone("a3") }, "a3 let go")
	if n := fnNamespace("a3"); n != ns {
		t.Errorf("a3's function was not left alone: namespace %q", n)
	}
}

// startBrisk runs a brisk control plane in the test process and returns
// an admin client.
func startBrisk(t *testing.T) *client.Client {
	t.Helper()
	admin, _, _ := auth.New([]string{auth.ScopeAdmin}, nil, "")
	cp, err := controlplane.New(controlplane.Config{DataDir: t.TempDir(), AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		BootstrapAdminToken: admin, StartupGrace: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-cp.Ready():
	case err := <-done:
		t.Fatalf("brisk control plane: %v", err)
	}
	c := client.New("http://"+cp.AdminAddr(), "")
	c.Token = admin
	return c
}

package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/kubernetes/fncontroller"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestKubeFunctions is issue 22's CRD: Function objects applied to a real
// kube-apiserver are deployed into brisk by the controller (run here in
// the test process, as `brisk k8s functions` runs it, with only the RBAC
// rights fncontroller.ClusterRole grants): applied, a function is
// invokable through the data plane; an update makes a new revision; a
// spec brisk refuses gets a condition with brisk's message; a deleted
// object's function is removed; a function made through the admin API is
// never touched; and objects created, fixed and deleted while the control
// plane is down converge once it is back.
func TestKubeFunctions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	kc := kubecluster.Start(t, kubecluster.Options{})
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(kc.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	kc.InstallFunctionCRD(t)
	ns := kc.Namespace(t, "team-a")
	// Opted in: the controller serves only namespaces so labelled.
	if _, err := kc.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+fncontroller.LabelNamespaceEnabled+`":"`+fncontroller.NamespaceEnabled+`"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller's user has the ClusterRole's rights and no others.
	kc.GrantClusterRole(t, fncontroller.ClusterRole("brisk-functions"), kubecluster.WorkerUser)

	c := newCluster(t)
	p := c.up(t)
	// As brisk k8s install runs it: a deploy token (on every namespace),
	// brisk's namespace made by an admin, none created by the controller.
	adm := client.New(c.admin, c.invokeAddr)
	adm.Token = adminToken(c.admin)
	if _, err := adm.PutNamespace(ctx, ns, spec.Quota{}); err != nil {
		t.Fatal(err)
	}
	deploy, err := adm.CreateToken(ctx, api.TokenRequest{Name: "k8s-functions", Scopes: []string{auth.ScopeDeploy}})
	if err != nil {
		t.Fatal(err)
	}
	briskCl := client.New(c.admin, c.invokeAddr)
	briskCl.Token = deploy.Token
	reqs := &testutil.RequestCounter{}
	briskCl.HTTP = &http.Client{Transport: reqs, Timeout: time.Minute}
	ctrl, err := fncontroller.New(fncontroller.Config{REST: kc.WorkerConfig(), Brisk: briskCl, CreateNamespaces: false,
		StatusInterval: 200 * time.Millisecond, RetryMax: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})

	fns := dyn.Resource(fncontroller.GVR).Namespace(ns)
	get := func(name string) *unstructured.Unstructured {
		t.Helper()
		o, err := fns.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get function %s: %v", name, err)
		}
		return o
	}
	ready := func(o *unstructured.Unstructured) (status, reason, message string) {
		conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
		for _, c := range conds {
			if m := c.(map[string]any); m["type"] == "Ready" {
				s, _ := m["status"].(string)
				r, _ := m["reason"].(string)
				msg, _ := m["message"].(string)
				return s, r, msg
			}
		}
		return "", "", ""
	}
	observed := func(o *unstructured.Unstructured) bool {
		g, _, _ := unstructured.NestedInt64(o.Object, "status", "observedGeneration")
		return g == o.GetGeneration()
	}
	// mutate changes an object as a user would, again when the
	// controller's status write came in between.
	mutate := func(name string, change func(*unstructured.Unstructured)) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := fns.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(cur)
			_, err = fns.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatalf("update function %s: %v", name, err)
		}
	}
	apply := func(name, specYAML string) {
		t.Helper()
		obj := functionObject(t, ns, name, specYAML)
		_, err := fns.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			mutate(name, func(cur *unstructured.Unstructured) { cur.Object["spec"] = obj.Object["spec"] })
			return
		}
		if err != nil {
			t.Fatalf("create function %s: %v", name, err)
		}
	}
	bn := func(name string) string { return spec.Qualify(name, ns) } // the object's function's name in brisk
	deployed := func(name string) bool {
		v, err := c.cl.Get(ctx, bn(name))
		if err != nil {
			return false
		}
		o := get(name)
		s, _, _ := ready(o)
		rev, _, _ := unstructured.NestedInt64(o.Object, "status", "revision")
		return s == "True" && observed(o) && uint64(rev) == v.Revision && v.Namespace == ns
	}
	gone := func(name string) bool {
		_, err := c.cl.Get(ctx, bn(name))
		_, kerr := fns.Get(ctx, name, metav1.GetOptions{})
		return client.IsNotFound(err) && apierrors.IsNotFound(kerr)
	}

	// Applied (with kubectl when it was built), it deploys, into the brisk
	// namespace of the object's, and serves.
	helloYAML := "builtin: trace\nscaling: {max: 3}\nenv: {V: \"1\"}\n"
	if kubectl := filepath.Join(kubecluster.BinDir(), "kubectl"); fileExists(kubectl) {
		f := filepath.Join(t.TempDir(), "hello.yaml")
		if err := os.WriteFile(f, []byte("apiVersion: brisk.dev/v1\nkind: Function\nmetadata: {name: hello, namespace: "+ns+"}\nspec:\n  "+strings.ReplaceAll(strings.TrimSpace(helloYAML), "\n", "\n  ")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		kc.Kubectl(t, "apply", "-f", f)
	} else {
		apply("hello", helloYAML)
	}
	eventually(t, 30*time.Second, "hello deployed and Ready", func() bool { return deployed("hello") })
	if inv := c.invoke(t, bn("hello"), `{}`); inv.status != 200 {
		t.Fatalf("call of hello: %d %s", inv.status, inv.body)
	}
	o := get("hello")
	if u, _, _ := unstructured.NestedString(o.Object, "status", "url"); u != "http://hello."+ns+".brisk.local" {
		t.Errorf("status.url %q", u)
	}
	if !slices.Contains(o.GetFinalizers(), fncontroller.Finalizer) {
		t.Errorf("finalizers %v, want %s", o.GetFinalizers(), fncontroller.Finalizer)
	}
	if fileExists(filepath.Join(kubecluster.BinDir(), "kubectl")) {
		out := kc.Kubectl(t, "get", "functions", "-n", ns)
		if !strings.Contains(out, "READY") || !strings.Contains(out, "hello") || !strings.Contains(out, "True") || !strings.Contains(out, "http://hello.") {
			t.Errorf("kubectl get functions:\n%s", out)
		}
	}

	// An update makes a new revision; status follows.
	rev1 := c.fn(t, bn("hello")).Revision
	apply("hello", "builtin: trace\nscaling: {max: 3}\nenv: {V: \"2\"}\n")
	eventually(t, 30*time.Second, "hello updated", func() bool {
		v := c.fn(t, bn("hello"))
		return v.Env["V"] == "2" && v.Revision != rev1 && deployed("hello")
	})
	rev2 := c.fn(t, bn("hello")).Revision

	// A spec brisk refuses: a condition with brisk's message; the revision
	// before keeps serving. The CRD's own checks refuse what they can
	// before it is stored.
	apply("hello", "builtin: trace\nscaling: {min: 5, max: 2}\n")
	apply("bad", "builtin: trace\nscaling: {min: 5, max: 2}\n")
	for _, name := range []string{"hello", "bad"} {
		eventually(t, 30*time.Second, name+": the InvalidSpec condition", func() bool {
			o := get(name)
			s, r, msg := ready(o)
			return observed(o) && s == "False" && r == fncontroller.ReasonInvalidSpec && strings.Contains(msg, "scaling.min: 5 is above scaling.max 2")
		})
	}
	if v := c.fn(t, bn("hello")); v.Revision != rev2 {
		t.Errorf("a refused update changed hello's revision: %d, want %d", v.Revision, rev2)
	}
	if _, err := c.cl.Get(ctx, bn("bad")); !client.IsNotFound(err) {
		t.Errorf("bad: %v, want no brisk function", err)
	}

	// A spec only the control plane can refuse (its secret is missing):
	// the condition has brisk's message, and it is not sent again and
	// again; an annotation asks for a retry once the secret is there.
	apply("needs", "builtin: trace\nsecrets: [db]\n")
	eventually(t, 30*time.Second, "needs: the InvalidSpec condition", func() bool {
		s, r, msg := ready(get("needs"))
		return s == "False" && r == fncontroller.ReasonInvalidSpec && strings.Contains(msg, "not found in namespace")
	})
	lists, creates := reqs.Count("GET /v1/functions"), reqs.Count("POST /v1/functions")
	eventually(t, 30*time.Second, "5 more passes of the status loop", func() bool { return reqs.Count("GET /v1/functions") >= lists+5 })
	if n := reqs.Count("POST /v1/functions"); n != creates {
		t.Errorf("a refused spec was sent %d more times", n-creates)
	}
	c.mustBrisk(t, "secret", "create", "db", "-n", ns, "--from-literal", "pw")
	mutate("needs", func(o *unstructured.Unstructured) { o.SetAnnotations(map[string]string{"retry": "1"}) })
	eventually(t, 30*time.Second, "needs deployed once its secret exists", func() bool { return deployed("needs") })

	_, err = fns.Create(ctx, functionObject(t, ns, "two", "builtin: trace\nimage: x\n"), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "exactly one of builtin, command, image and code") {
		t.Errorf("builtin and image: %v, want the CRD's refusal", err)
	}

	// A function made through the admin API is never touched: an object of
	// the same name says so, and deleting it leaves the function.
	c.mustBrisk(t, "fn", "deploy", "manual", "--namespace", ns, "--builtin", "trace")
	manual := c.fn(t, bn("manual"))
	apply("manual", "builtin: trace\nenv: {X: \"y\"}\n")
	eventually(t, 30*time.Second, "manual: the NameTaken condition", func() bool {
		s, r, msg := ready(get("manual"))
		return s == "False" && r == fncontroller.ReasonNameTaken && strings.Contains(msg, "admin API")
	})
	if err := fns.Delete(ctx, "manual", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the manual object gone", func() bool {
		_, err := fns.Get(ctx, "manual", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if v := c.fn(t, bn("manual")); v.Revision != manual.Revision || v.Env["X"] != "" || v.Namespace != ns {
		t.Errorf("the admin API's function was changed: revision %d (was %d), env %v, namespace %s", v.Revision, manual.Revision, v.Env, v.Namespace)
	}

	// Deleted, the function goes.
	if err := fns.Delete(ctx, "hello", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "hello removed from brisk and Kubernetes", func() bool { return gone("hello") })

	// An object whose finalizer was taken off by hand: its function is
	// found and deleted all the same.
	apply("orphan", "builtin: trace\n")
	eventually(t, 30*time.Second, "orphan deployed", func() bool { return deployed("orphan") })
	mutate("orphan", func(o *unstructured.Unstructured) { o.SetFinalizers(nil) })
	if err := fns.Delete(ctx, "orphan", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "orphan removed from brisk", func() bool { return gone("orphan") })

	// The control plane goes down while objects are created, fixed and
	// deleted; back, brisk converges to them.
	apply("doomed", "builtin: trace\n")
	eventually(t, 30*time.Second, "doomed deployed", func() bool { return deployed("doomed") })
	p.stop(syscall.SIGKILL)
	apply("later", "builtin: trace\n")
	apply("bad", "builtin: trace\nscaling: {min: 1, max: 2}\n")
	if err := fns.Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the controller finds brisk unavailable", func() bool {
		_, r, _ := ready(get("later"))
		return r == fncontroller.ReasonUnavailable
	})
	c.up(t)
	eventually(t, 60*time.Second, "later and bad deployed, doomed removed", func() bool {
		return deployed("later") && deployed("bad") && gone("doomed")
	})
	for _, name := range []string{"later", "bad"} {
		if inv := c.invoke(t, bn(name), `{}`); inv.status != 200 {
			t.Errorf("call of %s after the restart: %d %s", name, inv.status, inv.body)
		}
	}
	eventually(t, 30*time.Second, "bad's status shows its ready sandbox", func() bool {
		n, _, _ := unstructured.NestedInt64(get("bad").Object, "status", "readySandboxes")
		return n >= 1
	})

	// A function deleted behind the controller's back (through the admin
	// API) comes back: the object is the record.
	before := c.fn(t, bn("later")).Revision
	if err := c.cl.Delete(ctx, bn("later")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "later deployed again", func() bool {
		v, err := c.cl.Get(ctx, bn("later"))
		return err == nil && v.Revision != before && deployed("later")
	})
}

func functionObject(t *testing.T, ns, name, specYAML string) *unstructured.Unstructured {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal([]byte(specYAML), &s); err != nil {
		t.Fatal(err)
	}
	o := &unstructured.Unstructured{Object: map[string]any{"spec": s}}
	o.SetAPIVersion(fncontroller.APIVersion)
	o.SetKind(fncontroller.Kind)
	o.SetNamespace(ns)
	o.SetName(name)
	return o
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

package kubecluster

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	manifests "github.com/brisk-faas/brisk/deploy/kubernetes"
)

// InstallFunctionCRD creates brisk's Function CRD (deploy/kubernetes) and
// returns once it is established and its objects can be listed.
func (c *Cluster) InstallFunctionCRD(t testing.TB) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifests.FS.ReadFile("function-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := crds.Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("installing the Function CRD: %v", err)
	}
	fns := dyn.Resource(schema.GroupVersionResource{Group: "brisk.dev", Version: "v1", Resource: "functions"})
	for {
		if established(ctx, crds) {
			if _, err := fns.List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatal("the Function CRD was not served within 30 s")
		}
		time.Sleep(pollEvery)
	}
}

// established reports whether the Function CRD's Established condition is
// true.
func established(ctx context.Context, crds dynamic.NamespaceableResourceInterface) bool {
	o, err := crds.Get(ctx, "functions.brisk.dev", metav1.GetOptions{})
	if err != nil {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

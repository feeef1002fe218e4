package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Actions a Change reports.
const (
	Created   = "created"
	Updated   = "configured"
	Unchanged = "unchanged"
	Deleted   = "deleted"
	Absent    = "absent" // nothing to delete
	Kept      = "kept"   // not ours, or kept on purpose
	Released  = "finalizer removed"
)

// Change is what Install or Uninstall did to one object.
type Change struct {
	Kind, Namespace, Name, Action string
}

func (c Change) String() string {
	if c.Namespace != "" {
		return fmt.Sprintf("%s %s/%s %s", c.Kind, c.Namespace, c.Name, c.Action)
	}
	return fmt.Sprintf("%s %s %s", c.Kind, c.Name, c.Action)
}

// client applies objects through the dynamic client, finding each kind's
// resource with a RESTMapper over the apiserver's discovery.
type client struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newClient(cfg *rest.Config) (*client, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// One request first, so that an unreachable apiserver or a refused
	// credential is one clear error, not a failed discovery.
	if _, err := dc.ServerVersion(); err != nil {
		return nil, fmt.Errorf("the apiserver at %s: %w", cfg.Host, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &client{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// resource is u's endpoint.
func (c *client) resource(u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		// A CRD applied a moment ago: discovery may not have had it.
		c.mapper.Reset()
		m, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if meta.IsNoMatchError(err) {
		return nil, fmt.Errorf("%s: the cluster does not serve it: %w", gvk, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: discovering the API: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(u.GetNamespace()), nil
	}
	return c.dyn.Resource(m.Resource), nil
}

// apply server-side-applies u, reporting whether it changed anything.
func (c *client) apply(ctx context.Context, u *unstructured.Unstructured) (Change, error) {
	ch := Change{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
	r, err := c.resource(u)
	if err != nil {
		return ch, err
	}
	before := ""
	switch cur, err := r.Get(ctx, u.GetName(), metav1.GetOptions{}); {
	case err == nil:
		before = cur.GetResourceVersion()
	case !apierrors.IsNotFound(err):
		return ch, fmt.Errorf("%s: %w", ch, err)
	}
	b, err := json.Marshal(u.Object)
	if err != nil {
		return ch, err
	}
	// Force: these objects are install's; a field someone changed by hand
	// goes back to what the manifests say.
	after, err := r.Patch(ctx, u.GetName(), types.ApplyPatchType, b, metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true)})
	if err != nil {
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "privileged") {
			err = fmt.Errorf("%w (the apiserver refuses privileged containers, which the containerd worker needs: run it with --allow-privileged=true, or install with --worker-runtime kube)", err)
		}
		return ch, fmt.Errorf("apply %s %s: %w", ch.Kind, name(ch), err)
	}
	switch {
	case before == "":
		ch.Action = Created
	case after.GetResourceVersion() == before:
		ch.Action = Unchanged
	default:
		ch.Action = Updated
	}
	return ch, nil
}

// remove deletes u if it is there and install made it.
func (c *client) remove(ctx context.Context, u *unstructured.Unstructured) (Change, error) {
	ch := Change{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
	r, err := c.resource(u)
	if err != nil {
		if meta.IsNoMatchError(err) {
			ch.Action = Absent // a CRD's kind with no CRD
			return ch, nil
		}
		return ch, err
	}
	cur, err := r.Get(ctx, u.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ch.Action = Absent
		return ch, nil
	}
	if err != nil {
		return ch, fmt.Errorf("%s %s: %w", ch.Kind, name(ch), err)
	}
	if cur.GetLabels()[LabelManagedBy] != ManagedBy {
		ch.Action = Kept
		return ch, nil
	}
	policy := metav1.DeletePropagationBackground
	err = r.Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &policy, Preconditions: &metav1.Preconditions{UID: ptr(cur.GetUID())}})
	if err != nil && !apierrors.IsNotFound(err) {
		return ch, fmt.Errorf("delete %s %s: %w", ch.Kind, name(ch), err)
	}
	ch.Action = Deleted
	return ch, nil
}

func name(ch Change) string {
	if ch.Namespace != "" {
		return ch.Namespace + "/" + ch.Name
	}
	return ch.Name
}

// Install applies the manifests for o to the cluster of cfg, after making
// the Secrets when the namespace has none. It is idempotent: run again
// with the same options it changes nothing; with others it updates the
// objects and removes those of the other worker runtime. It stops at the
// first error, naming the object.
func Install(ctx context.Context, cfg *rest.Config, o Options) ([]Change, error) {
	all, err := renderAll(&o)
	if err != nil {
		return nil, err
	}
	if err := o.checkNamespaces(); err != nil {
		return nil, err
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	// Refusals first: nothing is changed when one applies.
	if err := c.otherInstall(ctx, o.Namespace); err != nil {
		return nil, err
	}
	if err := c.staleVolumes(ctx, o); err != nil {
		return nil, err
	}
	if o.WorkerRuntime == "kube" {
		if err := c.checkSandboxNamespace(ctx, o.SandboxNamespace); err != nil {
			return nil, err
		}
	}
	var changes []Change
	want := map[string]bool{}
	for _, u := range all {
		if forRuntime(u, o.WorkerRuntime) {
			want[key(u)] = true
		}
	}
	secretsDone, legacySecret := false, false
	for _, u := range all {
		if !forRuntime(u, o.WorkerRuntime) {
			continue
		}
		if u.GetKind() == "Namespace" {
			ch, err := c.applyNamespace(ctx, u)
			if err != nil {
				return changes, err
			}
			changes = append(changes, ch)
			continue
		}
		if !secretsDone && applyRank(u) > rankSecret {
			chs, deployToken, err := c.ensureSecrets(ctx, o.Namespace)
			changes = append(changes, chs...)
			if err != nil {
				return changes, err
			}
			secretsDone, legacySecret = true, !deployToken
		}
		if legacySecret && u.GetKind() == "Deployment" && u.GetName() == "brisk-functions" {
			if err := typed(u, func(d *appsv1.Deployment) error { useAdminToken(&d.Spec.Template.Spec); return nil }); err != nil {
				return changes, err
			}
		}
		ch, err := c.apply(ctx, u)
		if err != nil {
			return changes, err
		}
		changes = append(changes, ch)
	}
	// Objects of the other worker runtime, left by an earlier install, and
	// those of earlier manifests.
	var stale []*unstructured.Unstructured
	for _, u := range all {
		if !forRuntime(u, o.WorkerRuntime) && !want[key(u)] {
			stale = append(stale, u)
		}
	}
	for _, u := range append(stale, legacy(o.Namespace)...) {
		ch, err := c.remove(ctx, u)
		if err != nil {
			return changes, err
		}
		if ch.Action == Deleted {
			changes = append(changes, ch)
		}
	}
	return changes, nil
}

func key(u *unstructured.Unstructured) string {
	return u.GroupVersionKind().GroupKind().String() + "/" + u.GetNamespace() + "/" + u.GetName()
}

// applyNamespace applies the namespace unless it exists and is not
// install's (say "default"): Uninstall must not delete a namespace it did
// not make.
func (c *client) applyNamespace(ctx context.Context, u *unstructured.Unstructured) (Change, error) {
	r, err := c.resource(u)
	if err != nil {
		return Change{}, err
	}
	cur, err := r.Get(ctx, u.GetName(), metav1.GetOptions{})
	if err == nil && cur.GetLabels()[LabelManagedBy] != ManagedBy {
		return Change{Kind: "Namespace", Name: u.GetName(), Action: Kept}, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return Change{}, fmt.Errorf("namespace %s: %w", u.GetName(), err)
	}
	return c.apply(ctx, u)
}

// ensureSecrets makes the control plane's Secret when there is none
// (never replacing one: the cluster's CA and tokens live in it), and
// applies the join Secret from it. deployToken says whether the Secret
// holds the Function controller's deploy token (those made before install
// made one do not).
func (c *client) ensureSecrets(ctx context.Context, ns string) (_ []Change, deployToken bool, err error) {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	r := c.dyn.Resource(gvr).Namespace(ns)
	var cp corev1.Secret
	cur, err := r.Get(ctx, SecretControlPlane, metav1.GetOptions{})
	action := Unchanged // an existing one is never replaced
	switch {
	case err == nil:
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(cur.Object, &cp); err != nil {
			return nil, false, err
		}
	case apierrors.IsNotFound(err):
		s, err := newControlPlaneSecret(ns)
		if err != nil {
			return nil, false, err
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
		if err != nil {
			return nil, false, err
		}
		clean(m)
		if _, err := r.Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{FieldManager: FieldManager}); err != nil {
			return nil, false, fmt.Errorf("create secret %s/%s: %w", ns, SecretControlPlane, err)
		}
		cp, action = *s, Created
	default:
		return nil, false, fmt.Errorf("secret %s/%s: %w", ns, SecretControlPlane, err)
	}
	changes := []Change{{Kind: "Secret", Namespace: ns, Name: SecretControlPlane, Action: action}}
	js, err := joinSecret(&cp)
	if err != nil {
		return changes, false, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(js)
	if err != nil {
		return changes, false, err
	}
	clean(m)
	ch, err := c.apply(ctx, &unstructured.Unstructured{Object: m})
	return append(changes, ch), len(cp.Data[KeyDeployToken]) > 0, err
}

// UninstallOptions say what Uninstall removes besides the objects.
type UninstallOptions struct {
	Namespace        string
	SandboxNamespace string // default Namespace + SandboxSuffix
	// CRDs removes the CustomResourceDefinitions too, and with them every
	// object of their kinds in every namespace. Off by default.
	CRDs bool
	// DeleteData deletes the control plane's registry volumes (its
	// PersistentVolumeClaims) too. Without it they are kept when the
	// namespace is (one install did not make), and a later install there
	// refuses to start until they are deleted or the Secret restored.
	DeleteData bool
}

// Uninstall deletes what Install made in namespace o.Namespace, the
// Secrets included, in the reverse order: workloads first, the namespaces
// (brisk's and the sandboxes') last, only when install made them. Before
// anything it takes the Function controller's finalizer off every
// Function object (releaseFunctions). Objects someone else made under the
// same names are kept; so are the registry's volumes in a namespace that
// stays, unless o.DeleteData. CRDs are kept unless o.CRDs.
func Uninstall(ctx context.Context, cfg *rest.Config, o UninstallOptions) ([]Change, error) {
	ro := Options{Namespace: o.Namespace, SandboxNamespace: o.SandboxNamespace}
	all, err := renderAll(&ro)
	if err != nil {
		return nil, err
	}
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	var changes []Change
	seen := map[string]bool{}
	// The Function objects first: each holds the controller's finalizer,
	// which nothing removes once the controller is gone (namespaces and
	// the CRD would never finish deleting). Unless another install's
	// controller runs (then they are its).
	switch err := c.otherInstall(ctx, ro.Namespace); {
	case err == nil:
		chs, err := c.releaseFunctions(ctx, all, ro.Namespace, seen)
		changes = append(changes, chs...)
		if err != nil {
			return changes, err
		}
	case !errors.Is(err, errOtherInstall):
		return changes, err
	}
	all = append(all, legacy(ro.Namespace)...)
	for _, s := range []string{SecretJoin, SecretControlPlane} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("Secret")
		u.SetNamespace(ro.Namespace)
		u.SetName(s)
		all = append(all, u)
	}
	slices.SortStableFunc(all, func(a, b *unstructured.Unstructured) int { return applyRank(a) - applyRank(b) })
	nsAction := ""
	for i := len(all) - 1; i >= 0; i-- {
		u := all[i]
		if seen[key(u)] {
			continue // the DaemonSet of each worker runtime: one object
		}
		seen[key(u)] = true
		if u.GetKind() == "CustomResourceDefinition" && !o.CRDs {
			changes = append(changes, Change{Kind: u.GetKind(), Name: u.GetName(), Action: Kept})
			continue
		}
		ch, err := c.remove(ctx, u)
		if err != nil {
			return changes, err
		}
		if u.GetKind() == "Namespace" && u.GetName() == ro.Namespace {
			nsAction = ch.Action
		}
		changes = append(changes, ch)
	}
	chs, err := c.removeVolumes(ctx, ro.Namespace, o.DeleteData, nsAction == Deleted)
	return append(changes, chs...), err
}

// get reads u's object from the cluster.
func (c *client) get(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	r, err := c.resource(u)
	if err != nil {
		return nil, err
	}
	return r.Get(ctx, u.GetName(), metav1.GetOptions{})
}

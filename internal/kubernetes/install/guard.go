package install

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// What Install refuses and Uninstall cleans up besides the manifests'
// objects.

// FunctionFinalizer is the Function controller's finalizer on every
// Function object (internal/kubernetes/fncontroller.Finalizer).
const FunctionFinalizer = "brisk.dev/function"

const (
	functionsName     = "brisk-functions"
	functionsRoleName = "brisk:functions:" // + namespace
	// pvcPrefix begins the names of the control plane's registry volumes:
	// the StatefulSet's claim template "data", then the Pod's name.
	pvcPrefix = "data-" + controlPlaneName + "-"
)

var (
	gvrSecrets  = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	gvrPVCs     = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	gvrNS       = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	gvrCRoles   = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}
	gvrSAR      = schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "subjectaccessreviews"}
	gvrWorkload = []schema.GroupVersionResource{
		{Group: "apps", Version: "v1", Resource: "deployments"},
		{Group: "apps", Version: "v1", Resource: "statefulsets"},
		{Group: "apps", Version: "v1", Resource: "daemonsets"},
	}
	gvkFunction = schema.GroupVersionKind{Group: "brisk.dev", Version: "v1", Kind: "Function"}
)

// errOtherInstall: brisk is installed in another namespace of the cluster.
var errOtherInstall = errors.New("brisk is already installed in this cluster")

// otherInstall reports an install in a namespace other than ns. There is
// one per cluster: the Function controller watches every namespace and
// holds one finalizer on every Function object, and the workers keep their
// state in the nodes' /var/lib/brisk/worker*, so two installs would fight
// over both.
func (c *client) otherInstall(ctx context.Context, ns string) error {
	sel := metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy}
	found := func(where, what string) error {
		return fmt.Errorf("%w, in namespace %s (%s): one install per cluster (its Function controller watches every namespace, its workers use the nodes' /var/lib/brisk/worker*); "+
			"update that one (-n %s), or remove it first (brisk k8s uninstall -n %s)", errOtherInstall, where, what, where, where)
	}
	for _, gvr := range gvrWorkload {
		l, err := c.dyn.Resource(gvr).List(ctx, sel) // every namespace
		if err != nil {
			return fmt.Errorf("looking for other installs of brisk: %s: %w", gvr.Resource, err)
		}
		for _, u := range l.Items {
			if u.GetNamespace() != ns {
				return found(u.GetNamespace(), gvr.Resource+" "+u.GetName())
			}
		}
	}
	// The Function controller's ClusterRole outlives a half-done
	// uninstall of the workloads.
	l, err := c.dyn.Resource(gvrCRoles).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("looking for other installs of brisk: clusterroles: %w", err)
	}
	for _, u := range l.Items {
		if other, ok := strings.CutPrefix(u.GetName(), functionsRoleName); ok && other != ns {
			return found(other, "clusterrole "+u.GetName())
		}
	}
	return nil
}

// controlPlaneVolumes lists the control plane's registry volumes in ns
// that are not already being deleted.
func (c *client) controlPlaneVolumes(ctx context.Context, ns string) ([]string, error) {
	l, err := c.dyn.Resource(gvrPVCs).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("persistentvolumeclaims in %s: %w", ns, err)
	}
	var out []string
	for _, u := range l.Items {
		if strings.HasPrefix(u.GetName(), pvcPrefix) && u.GetDeletionTimestamp() == nil {
			out = append(out, u.GetName())
		}
	}
	slices.Sort(out)
	return out, nil
}

// staleVolumes refuses an install whose control plane would start on the
// registry of an earlier one without that one's Secret: the registry
// trusts only the old CA and tokens, and the new ones would be refused.
func (c *client) staleVolumes(ctx context.Context, o Options) error {
	if o.Ephemeral {
		return nil // the registry is an emptyDir: the volumes are not used
	}
	_, err := c.dyn.Resource(gvrSecrets).Namespace(o.Namespace).Get(ctx, SecretControlPlane, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("secret %s/%s: %w", o.Namespace, SecretControlPlane, err)
	}
	pvcs, err := c.controlPlaneVolumes(ctx, o.Namespace)
	if err != nil || len(pvcs) == 0 {
		return err
	}
	return fmt.Errorf("namespace %s holds the registry volumes of an earlier install (persistentvolumeclaims %s) but not its Secret %s: "+
		"a control plane on them would refuse the new CA and tokens. Either delete them to start afresh, losing that registry "+
		"(kubectl -n %s delete pvc %s), or restore the Secret %s from a backup, then install again",
		o.Namespace, strings.Join(pvcs, ", "), SecretControlPlane, o.Namespace, strings.Join(pvcs, " "), SecretControlPlane)
}

// checkSandboxNamespace refuses a sandbox namespace install did not make:
// it must hold the functions' Pods alone (the workers may create Pods
// anywhere in it; install labels it for Pod Security Admission, and must
// not change the rules of someone else's namespace).
func (c *client) checkSandboxNamespace(ctx context.Context, name string) error {
	cur, err := c.dyn.Resource(gvrNS).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("namespace %s: %w", name, err)
	case cur.GetLabels()[LabelManagedBy] != ManagedBy:
		return fmt.Errorf("sandbox namespace %s exists and brisk k8s install did not make it: the functions' Pods need a namespace of their own; "+
			"name another with --sandbox-namespace, or delete it", name)
	}
	return nil
}

// legacy are objects earlier versions of the manifests made and these no
// longer do: the kube worker's Role in brisk's own namespace (it now has
// one in the sandbox namespace only). Install and Uninstall delete them.
func legacy(ns string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, kind := range []string{"Role", "RoleBinding"} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("rbac.authorization.k8s.io/v1")
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName("brisk-worker")
		out = append(out, u)
	}
	return out
}

// releaseFunctions removes the Function controller's finalizer from every
// Function object in the cluster. It takes the controller's rights away
// first (its ClusterRoleBinding, among all, marked in seen), and waits
// until the apiserver's authorizer says so: a controller still running
// would put the finalizer back on the next event.
func (c *client) releaseFunctions(ctx context.Context, all []*unstructured.Unstructured, ns string, seen map[string]bool) ([]Change, error) {
	var changes []Change
	for _, u := range all {
		if u.GetKind() == "ClusterRoleBinding" && u.GetName() == functionsRoleName+ns {
			ch, err := c.remove(ctx, u)
			if err != nil {
				return changes, err
			}
			seen[key(u)] = true
			changes = append(changes, ch)
		}
	}
	fn := &unstructured.Unstructured{}
	fn.SetGroupVersionKind(gvkFunction)
	r, err := c.resource(fn) // namespace "": every namespace
	if meta.IsNoMatchError(err) {
		return changes, nil // no CRD, no Function objects
	}
	if err != nil {
		return changes, err
	}
	c.awaitRevoked(ctx, ns)
	l, err := r.List(ctx, metav1.ListOptions{})
	if err != nil {
		return changes, fmt.Errorf("function objects: %w", err)
	}
	for _, u := range l.Items {
		if !slices.Contains(u.GetFinalizers(), FunctionFinalizer) {
			continue
		}
		ch := Change{Kind: "Function", Namespace: u.GetNamespace(), Name: u.GetName(), Action: Released}
		nr := c.dyn.Resource(schema.GroupVersionResource{Group: gvkFunction.Group, Version: gvkFunction.Version, Resource: "functions"}).Namespace(u.GetNamespace())
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := nr.Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			f := cur.GetFinalizers()
			if !slices.Contains(f, FunctionFinalizer) {
				return nil
			}
			cur.SetFinalizers(slices.DeleteFunc(f, func(s string) bool { return s == FunctionFinalizer }))
			_, err = nr.Update(ctx, cur, metav1.UpdateOptions{FieldManager: FieldManager})
			return err
		})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return changes, fmt.Errorf("remove finalizer %s of function %s/%s: %w", FunctionFinalizer, u.GetNamespace(), u.GetName(), err)
		}
		changes = append(changes, ch)
	}
	return changes, nil
}

// awaitRevoked waits (30s at most) until the apiserver denies the
// Function controller's ServiceAccount updates of Function objects. It
// gives up quietly: an apiserver that will not answer access reviews, or
// another binding granting the same, leaves the finalizers to this
// removal and the controller's deletion right after.
func (c *client) awaitRevoked(ctx context.Context, ns string) {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + ns + ":" + functionsName,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: "update", Group: gvkFunction.Group, Resource: "functions"},
	}}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sar)
	if err != nil {
		return
	}
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err := c.dyn.Resource(gvrSAR).Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{})
		if err != nil {
			return false, err // stop waiting
		}
		allowed, _, _ := unstructured.NestedBool(out.Object, "status", "allowed")
		return !allowed, nil
	})
}

// removeVolumes deletes the control plane's registry volumes in ns when
// del; otherwise it reports them kept, unless they go with the namespace.
func (c *client) removeVolumes(ctx context.Context, ns string, del, nsDeleted bool) ([]Change, error) {
	pvcs, err := c.controlPlaneVolumes(ctx, ns)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var changes []Change
	for _, name := range pvcs {
		ch := Change{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name, Action: Kept}
		switch {
		case del:
			if err := c.dyn.Resource(gvrPVCs).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return changes, fmt.Errorf("delete persistentvolumeclaim %s/%s: %w", ns, name, err)
			}
			ch.Action = Deleted
		case nsDeleted:
			continue // they go with the namespace
		}
		changes = append(changes, ch)
	}
	return changes, nil
}

// Package fncontroller keeps brisk's functions in step with Kubernetes
// objects of the brisk.dev/v1 Function CRD (deploy/kubernetes/function-crd.yaml):
// a controller, outside the control plane, that watches them with
// client-go's dynamic informer and deploys, updates and deletes the
// functions through brisk's admin API, whose validation is the authority,
// writing the outcome back as the objects' status.
//
// A Function object NAME in Kubernetes namespace NS is brisk function NAME
// in brisk namespace NS. The brisk functions it made carry the label
// LabelObject (NS/NAME); the controller changes and deletes no other
// function, so those made through the admin API are never touched. Only
// Kubernetes namespaces opted in (LabelNamespaceEnabled) are served: the
// right to create objects in NS is not by itself a right to brisk
// namespace NS.
package fncontroller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// The CRD's coordinates.
const (
	Group    = "brisk.dev"
	Version  = "v1"
	Kind     = "Function"
	Resource = "functions"
)

// GVR is the resource the controller watches.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// APIVersion is the objects' apiVersion.
const APIVersion = Group + "/" + Version

// LabelObject is the brisk label of a function made from a Function
// object: its value is the object's "NAMESPACE/NAME". With the function's
// brisk namespace being NAMESPACE, it is the controller's mark of
// ownership (brisk.dev/ keys never go on Pods).
const LabelObject = "brisk.dev/kubernetes-function"

// Finalizer holds a Function object until its brisk function is deleted.
const Finalizer = "brisk.dev/function"

// objectKey is the value of LabelObject for namespace/name.
func objectKey(namespace, name string) string { return namespace + "/" + name }

// serverSet are the spec fields an object does not carry: its name and
// namespace are the object's metadata, the uid, revision and times are
// brisk's, and the traffic split is not part of a revision (brisk fn
// traffic).
var serverSet = []string{"name", "namespace", "uid", "revision", "generation", "created_at", "updated_at", "traffic"}

// ToSpec reads a Function object as a brisk spec, strictly (an unknown
// field is an error, as in the admin API), with its name and namespace
// from the metadata and the controller's label added. It applies brisk's
// defaults but leaves validation to the admin API. The error wraps
// spec.ErrInvalid and names the field.
func ToSpec(obj *unstructured.Unstructured) (*spec.Function, error) {
	raw, _, err := unstructured.NestedFieldNoCopy(obj.Object, "spec")
	if err != nil {
		return nil, fmt.Errorf("%w: spec: %v", spec.ErrInvalid, err)
	}
	m, ok := raw.(map[string]any)
	if raw != nil && !ok {
		return nil, fmt.Errorf("%w: spec: not an object", spec.ErrInvalid)
	}
	for _, k := range serverSet {
		if _, set := m[k]; set {
			return nil, fmt.Errorf("%w: spec.%s: not part of a Function object's spec (it is the object's own, or brisk's)", spec.ErrInvalid, k)
		}
	}
	data, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("%w: spec: %v", spec.ErrInvalid, err)
	}
	if m == nil {
		data = []byte("{}")
	}
	f, err := spec.Decode(data)
	if err != nil {
		return nil, err
	}
	f.Name, f.Namespace = functionName(obj), obj.GetNamespace()
	f.Labels = maps.Clone(f.Labels)
	if f.Labels == nil {
		f.Labels = map[string]string{}
	}
	f.Labels[LabelObject] = objectKey(obj.GetNamespace(), obj.GetName())
	f.ApplyDefaults()
	return f, nil
}

// functionName is the brisk name of a Function object: its name,
// qualified with its namespace outside the default one (spec.Qualify).
func functionName(obj *unstructured.Unstructured) string {
	return spec.Qualify(obj.GetName(), obj.GetNamespace())
}

// FromSpec is a brisk function as a Function object in namespace (its
// brisk namespace when ""), e.g. to move a function made through the admin
// API under Kubernetes' management: the inverse of ToSpec.
func FromSpec(f *spec.Function, namespace string) (*unstructured.Unstructured, error) {
	c := *f
	c.Labels = maps.Clone(f.Labels)
	delete(c.Labels, LabelObject)
	c.SecretData = nil
	data, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // integers stay integers
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	for _, k := range serverSet {
		delete(m, k)
	}
	if namespace == "" {
		namespace = f.Namespace
		if namespace == "" {
			namespace = spec.DefaultNamespace
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"spec": jsonNumbers(m)}}
	obj.SetAPIVersion(APIVersion)
	obj.SetKind(Kind)
	obj.SetName(spec.ShortName(f.Name))
	obj.SetNamespace(namespace)
	return obj, nil
}

// jsonNumbers turns json.Numbers into int64 or float64, the number types
// unstructured objects hold.
func jsonNumbers(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonNumbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = jsonNumbers(e)
		}
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, _ := v.Float64()
		return f
	}
	return v
}

// sameSpec reports whether brisk's current spec is the desired one, so an
// unchanged object makes no new revision: both are compared as the admin
// API writes them, less what brisk sets and the traffic split.
func sameSpec(desired, current *spec.Function) bool {
	norm := func(f *spec.Function) []byte {
		c := *f
		c.UID, c.Revision, c.Generation, c.Traffic, c.SecretData = "", 0, 0, nil, nil
		c.CreatedAt, c.UpdatedAt = time.Time{}, time.Time{}
		b, _ := json.Marshal(&c)
		return b
	}
	return bytes.Equal(norm(desired), norm(current))
}

// owner is the Function object (NAMESPACE/NAME) that f's label names, or
// "" for a function made otherwise.
func owner(f *spec.Function) string { return f.Labels[LabelObject] }

// owned reports whether f is the function of object key (NAMESPACE/NAME):
// its label names the object and it is in the object's brisk namespace.
// The label alone is not proof: a token allowed to deploy only into its
// own namespace could set it (brisk refuses brisk.dev/ labels from such
// tokens, but the namespace is checked here all the same).
func owned(key string, f *spec.Function) bool {
	ns, _, _ := strings.Cut(key, "/")
	fns := f.Namespace
	if fns == "" {
		fns = spec.DefaultNamespace
	}
	return owner(f) == key && fns == ns
}

package install

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	manifests "github.com/brisk-faas/brisk/deploy/kubernetes"
	"github.com/brisk-faas/brisk/internal/image"
)

// What the manifests are written for; Render replaces each.
const (
	DefaultNamespace = "brisk-system"
	// SandboxSuffix makes the default sandbox namespace of an install:
	// NAMESPACE-sandboxes. The manifests name DefaultNamespace's.
	SandboxSuffix           = "-sandboxes"
	defaultSandboxNamespace = DefaultNamespace + SandboxSuffix
	// LabelWorkerRuntime marks objects that go only with one worker runtime.
	LabelWorkerRuntime = "brisk.dev/worker-runtime"
	// LabelManagedBy marks every object Install makes (not the Pods: the
	// kube runtime's Pods are app.kubernetes.io/managed-by=brisk, and
	// brisk's own Pods must not look like them).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "brisk-k8s-install"
	// FieldManager is the server-side apply field manager.
	FieldManager = "brisk-k8s-install"

	controlPlaneName = "brisk-controlplane"
	dataPlaneName    = "brisk-dataplane"
	envPeers         = "BRISK_PEERS"
	envControlPlanes = "BRISK_CONTROLPLANES"
	raftPort         = 7100
	adminPort        = 9090
	grpcPort         = 9091
)

// Worker runtimes the manifests offer.
var WorkerRuntimes = []string{"containerd", "kube"}

// Options say what to render.
type Options struct {
	Namespace string // default DefaultNamespace
	// SandboxNamespace holds the functions' Pods with the kube worker
	// runtime (default Namespace + SandboxSuffix): the only namespace the
	// workers may create Pods in, Pod Security "baseline" enforced, no
	// Secrets.
	SandboxNamespace string
	Image            string // default brisk.local/brisk:latest
	Replicas         int    // control-plane replicas, default 3
	DataPlanes       int    // data-plane replicas, default 2
	WorkerRuntime    string // containerd (default) or kube
	// StorageSize and StorageClass are those of each control-plane
	// replica's registry volume (default 1Gi, the cluster's default
	// class). Ephemeral gives the replicas an emptyDir instead: the
	// registry then lives as long as the Pods (test clusters without a
	// volume provisioner).
	StorageSize, StorageClass string
	Ephemeral                 bool
	// FunctionsCreateNamespaces lets the Function controller create the
	// brisk namespace (with no quota) of a Kubernetes namespace whose
	// first Function appears. Off: an admin makes brisk namespaces.
	FunctionsCreateNamespaces bool
	// APIServer, host:port, is where the Pods that use the Kubernetes API
	// (the kube worker, the Function controller) reach the apiserver,
	// given them as KUBERNETES_SERVICE_HOST and _PORT. Empty: the
	// kubernetes Service's ClusterIP, which needs a kube-proxy (or a
	// replacement) on the nodes.
	APIServer string
}

// ImageRef is the default reference of brisk's own image.
var ImageRef = image.Ref("brisk")

func (o *Options) defaults() error {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.SandboxNamespace == "" {
		o.SandboxNamespace = o.Namespace + SandboxSuffix
	}
	if o.Image == "" {
		o.Image = ImageRef
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.DataPlanes == 0 {
		o.DataPlanes = 2
	}
	if o.WorkerRuntime == "" {
		o.WorkerRuntime = "containerd"
	}
	if o.StorageSize == "" {
		o.StorageSize = "1Gi"
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(o.SandboxNamespace); len(errs) > 0 {
		return fmt.Errorf("sandbox namespace %q: %s (give another with --sandbox-namespace)", o.SandboxNamespace, strings.Join(errs, "; "))
	}
	if o.SandboxNamespace == o.Namespace {
		return fmt.Errorf("sandbox namespace %q: must not be brisk's own namespace (the functions' Pods are kept away from its Secrets)", o.SandboxNamespace)
	}
	// Raft wants an odd number of voters; 1 is a cluster without HA.
	if o.Replicas < 1 || o.Replicas > 7 || o.Replicas%2 == 0 {
		return fmt.Errorf("control-plane replicas %d: want 1, 3, 5 or 7", o.Replicas)
	}
	if o.DataPlanes < 1 {
		return fmt.Errorf("data-plane replicas %d: want at least 1", o.DataPlanes)
	}
	if !slices.Contains(WorkerRuntimes, o.WorkerRuntime) {
		return fmt.Errorf("worker runtime %q: want one of %s", o.WorkerRuntime, strings.Join(WorkerRuntimes, ", "))
	}
	if strings.ContainsAny(o.Image, " \t\n") || o.Image == "" {
		return fmt.Errorf("image %q: want an image reference", o.Image)
	}
	q, err := resource.ParseQuantity(o.StorageSize)
	if err != nil || q.Sign() <= 0 {
		return fmt.Errorf("storage size %q: want a positive quantity such as 1Gi", o.StorageSize)
	}
	if o.APIServer != "" {
		host, port, err := net.SplitHostPort(o.APIServer)
		p, perr := strconv.Atoi(port)
		if err != nil || host == "" || perr != nil || p < 1 || p > 65535 || strings.ContainsAny(host, " \t\n$") {
			return fmt.Errorf("apiserver address %q: want HOST:PORT, as the nodes' Pods reach it", o.APIServer)
		}
	}
	if o.StorageClass != "" && len(validation.IsDNS1123Subdomain(o.StorageClass)) > 0 {
		return fmt.Errorf("storage class %q: not a valid name", o.StorageClass)
	}
	return nil
}

// reservedNamespace reports why brisk must not be installed in ns, or "".
// Kubernetes' own namespaces hold the cluster's system components and
// their credentials (kube-system), are readable by everyone (kube-public)
// or are where anything lands by default (default): brisk's Secrets and
// function Pods belong in none of them.
func reservedNamespace(ns string) string {
	switch {
	case ns == "default":
		return "the namespace where objects without one land"
	case strings.HasPrefix(ns, "kube-"): // kube-system, kube-public, kube-node-lease...
		return "the kube- prefix is Kubernetes' own"
	}
	return ""
}

// checkNamespaces refuses reserved namespaces for an install (Uninstall
// does not check: it only removes what install made).
func (o *Options) checkNamespaces() error {
	for _, n := range []struct{ flag, ns string }{{"--namespace", o.Namespace}, {"--sandbox-namespace", o.SandboxNamespace}} {
		if why := reservedNamespace(n.ns); why != "" {
			return fmt.Errorf("%s %s: reserved (%s); install brisk in a namespace of its own, e.g. %s", n.flag, n.ns, why, DefaultNamespace)
		}
	}
	return nil
}

// Render returns the objects of the manifests for o, in the order they
// are applied, without the Secrets (Install makes those). Objects for
// another worker runtime are left out.
func Render(o Options) ([]*unstructured.Unstructured, error) {
	all, err := renderAll(&o)
	if err != nil {
		return nil, err
	}
	if err := o.checkNamespaces(); err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, u := range all {
		if forRuntime(u, o.WorkerRuntime) {
			out = append(out, u)
		}
	}
	return out, nil
}

func forRuntime(u *unstructured.Unstructured, rt string) bool {
	v, ok := u.GetLabels()[LabelWorkerRuntime]
	return !ok || v == rt
}

// renderAll renders every object, whatever its worker runtime.
func renderAll(o *Options) ([]*unstructured.Unstructured, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	docs, err := readManifests(manifests.FS)
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, 0, len(docs))
	for _, u := range docs {
		if err := o.apply(u); err != nil {
			return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
		out = append(out, u)
	}
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int { return applyRank(a) - applyRank(b) })
	return out, nil
}

const rankSecret = 5

// applyRank orders objects so that each finds what it refers to: the
// namespace and the CRDs first, the workloads last.
func applyRank(u *unstructured.Unstructured) int {
	switch u.GetKind() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition":
		return 1
	case "ServiceAccount":
		return 2
	case "ClusterRole", "Role":
		return 3
	case "ClusterRoleBinding", "RoleBinding":
		return 4
	case "Secret", "ConfigMap":
		return rankSecret
	case "Service":
		return 6
	case "StatefulSet", "Deployment", "DaemonSet":
		return 8
	}
	return 7
}

// readManifests decodes every YAML document of every *.yaml file of fsys,
// files in name order.
func readManifests(fsys fs.FS) ([]*unstructured.Unstructured, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []*unstructured.Unstructured
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for i := 1; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("manifests: %s: %w", name, err)
			}
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("manifests: %s, document %d: %w", name, i, err)
			}
			if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
				continue // only comments
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(js); err != nil {
				return nil, fmt.Errorf("manifests: %s, document %d: %w", name, i, err)
			}
			out = append(out, u)
		}
	}
	return out, nil
}

// apply makes u what o asks for: its namespace, names and subjects in
// o.Namespace, and the workloads' image, replicas, peers and storage.
func (o *Options) apply(u *unstructured.Unstructured) error {
	ns := o.Namespace
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy], labels["app.kubernetes.io/part-of"] = ManagedBy, "brisk"
	u.SetLabels(labels)
	// The manifests' two namespaces, brisk's and the sandboxes'.
	renameNS := func(s string) string {
		if s == defaultSandboxNamespace {
			return o.SandboxNamespace
		}
		return ns
	}
	if u.GetNamespace() != "" {
		u.SetNamespace(renameNS(u.GetNamespace()))
	}
	if u.GetKind() == "Namespace" {
		u.SetName(renameNS(u.GetName()))
	}
	// Cluster-scoped objects of an install end in its namespace.
	rename := func(s string) string {
		if base, ok := strings.CutSuffix(s, ":"+DefaultNamespace); ok {
			return base + ":" + ns
		}
		return s
	}
	u.SetName(rename(u.GetName()))
	switch u.GetKind() {
	case "RoleBinding", "ClusterRoleBinding":
		if name, ok, _ := unstructured.NestedString(u.Object, "roleRef", "name"); ok {
			_ = unstructured.SetNestedField(u.Object, rename(name), "roleRef", "name")
		}
		subjects, _, _ := unstructured.NestedSlice(u.Object, "subjects")
		for _, s := range subjects {
			if m, ok := s.(map[string]any); ok && m["namespace"] != nil {
				m["namespace"] = renameNS(fmt.Sprint(m["namespace"]))
			}
		}
		if subjects != nil {
			_ = unstructured.SetNestedSlice(u.Object, subjects, "subjects")
		}
	case "StatefulSet":
		return typed(u, func(s *appsv1.StatefulSet) error {
			s.Spec.Replicas = ptr(int32(o.Replicas))
			o.podSpec(&s.Spec.Template.Spec)
			return o.storage(s)
		})
	case "Deployment":
		return typed(u, func(d *appsv1.Deployment) error {
			if d.Name == dataPlaneName {
				d.Spec.Replicas = ptr(int32(o.DataPlanes))
			}
			o.podSpec(&d.Spec.Template.Spec)
			return nil
		})
	case "DaemonSet":
		return typed(u, func(d *appsv1.DaemonSet) error {
			o.podSpec(&d.Spec.Template.Spec)
			return nil
		})
	}
	return nil
}

// podSpec sets the image, its pull policy, the control-plane addresses
// and the options of every container.
func (o *Options) podSpec(p *corev1.PodSpec) {
	if o.FunctionsCreateNamespaces {
		useAdminToken(p) // creating brisk namespaces is an admin's act
	}
	usesAPI := p.AutomountServiceAccountToken != nil && *p.AutomountServiceAccountToken
	for _, cs := range [][]corev1.Container{p.InitContainers, p.Containers} {
		for i := range cs {
			c := &cs[i]
			if usesAPI && o.APIServer != "" {
				// A container's own variables win over those the kubelet
				// makes from the kubernetes Service.
				host, port, _ := net.SplitHostPort(o.APIServer)
				c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: host},
					corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: port})
			}
			c.Image = o.Image
			c.ImagePullPolicy = PullPolicy(o.Image)
			for j, a := range c.Args {
				switch {
				case strings.HasPrefix(a, "--kube-namespace="):
					c.Args[j] = "--kube-namespace=" + o.SandboxNamespace
				case strings.HasPrefix(a, "--create-namespaces="):
					c.Args[j] = "--create-namespaces=" + strconv.FormatBool(o.FunctionsCreateNamespaces)
				}
			}
			for j := range c.Env {
				switch c.Env[j].Name {
				case envPeers:
					c.Env[j].Value = Peers(o.Replicas)
				case envControlPlanes:
					c.Env[j].Value = ControlPlanes(o.Replicas)
				}
			}
		}
	}
}

// storage gives the control plane's replicas their registry volume.
func (o *Options) storage(s *appsv1.StatefulSet) error {
	if o.Ephemeral {
		s.Spec.VolumeClaimTemplates = nil
		s.Spec.Template.Spec.Volumes = append(s.Spec.Template.Spec.Volumes,
			corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		return nil
	}
	for i := range s.Spec.VolumeClaimTemplates {
		pvc := &s.Spec.VolumeClaimTemplates[i]
		if pvc.Name != "data" {
			continue
		}
		pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.StorageSize)}
		if o.StorageClass != "" {
			pvc.Spec.StorageClassName = ptr(o.StorageClass)
		}
		return nil
	}
	return errors.New("no volume claim template named data")
}

// PullPolicy is the imagePullPolicy for ref: Never for brisk's own local
// references (under image.LocalDomain, imported on each node; no registry
// answers that name, and a node lacking the image must say so rather than
// try to pull it from whoever does), IfNotPresent otherwise.
func PullPolicy(ref string) corev1.PullPolicy {
	if strings.HasPrefix(ref, image.LocalDomain+"/") {
		return corev1.PullNever
	}
	return corev1.PullIfNotPresent
}

// replicaHost is control-plane replica i's stable DNS name, relative to
// the cluster domain; the Pod's own namespace comes from the environment
// ($(POD_NAMESPACE), which Kubernetes expands in env values and args).
func replicaHost(i int) string {
	return controlPlaneName + "-" + strconv.Itoa(i) + "." + controlPlaneName + ".$(POD_NAMESPACE).svc"
}

// Peers is brisk controlplane --peers for n replicas of the StatefulSet:
// each replica's id is its Pod name.
func Peers(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		h := replicaHost(i)
		fmt.Fprintf(&b, "%s-%d=%s:%d|%s:%d|%s:%d", controlPlaneName, i, h, raftPort, h, adminPort, h, grpcPort)
	}
	return b.String()
}

// ControlPlanes is --controlplane of the workers and data planes: every
// replica's gRPC address.
func ControlPlanes(n int) string {
	addrs := make([]string, n)
	for i := range n {
		addrs[i] = fmt.Sprintf("%s:%d", replicaHost(i), grpcPort)
	}
	return strings.Join(addrs, ",")
}

// typed edits u as the typed object T.
func typed[T any](u *unstructured.Unstructured, edit func(*T) error) error {
	var obj T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &obj, true); err != nil {
		return err
	}
	if err := edit(&obj); err != nil {
		return err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&obj)
	if err != nil {
		return err
	}
	delete(m, "status")
	clean(m)
	u.Object = m
	return nil
}

// clean drops what a round trip through a typed object adds: null
// creation timestamps and empty statuses.
func clean(v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if x == nil {
				delete(v, k)
				continue
			}
			if m, ok := x.(map[string]any); ok && k == "status" && len(m) == 0 {
				delete(v, k)
				continue
			}
			clean(x)
		}
	case []any:
		for _, x := range v {
			clean(x)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// YAML writes objs as one YAML stream.
func YAML(w io.Writer, objs []*unstructured.Unstructured) error {
	for i, u := range objs {
		b, err := yaml.Marshal(u.Object)
		if err != nil {
			return err
		}
		sep := "---\n"
		if i == 0 {
			sep = ""
		}
		if _, err := fmt.Fprintf(w, "%s%s", sep, b); err != nil {
			return err
		}
	}
	return nil
}

package kube

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// Labels and annotations on every Pod the runtime creates. The labels are
// for selectors (the informer's, kubectl's, a ResourceQuota's scope); the
// annotations carry what a label value cannot hold.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "brisk"
	LabelFunction  = "brisk.dev/function"
	LabelRevision  = "brisk.dev/revision"
	// LabelSandbox is the sandbox id, on Pods whose id is a valid label
	// value (brisk's own ids always are).
	LabelSandbox = "brisk.dev/sandbox"
	// AnnotationSandbox is the sandbox id, always: the runtime's key.
	AnnotationSandbox = "brisk.dev/sandbox-id"
	// annotationCreate is a random token of the Create that made the Pod,
	// so that a Create whose reply was lost deletes its own Pod only.
	annotationCreate = "brisk.dev/create-token"
	// ContainerName names the function's container; its port is named
	// portName.
	ContainerName = "function"
	portName      = "http"
	// tmpSizeMB sizes /tmp (memory-backed) when the function has no memory
	// limit, as the containerd runtime does.
	tmpSizeMB = 64
)

// Selector selects brisk's Pods.
const Selector = LabelManagedBy + "=" + ManagedBy

// Role is what a worker's credentials need in namespace: the runtime only
// creates, deletes and watches Pods.
func Role(namespace, name string) *rbacv1.Role {
	return &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""},
			Resources: []string{"pods"},
			Verbs:     []string{"get", "list", "watch", "create", "delete"},
		}},
	}
}

// PodName is the Pod name of sandbox id: the id itself when it is a valid
// DNS-1123 subdomain (brisk's ids, a hex prefix and a base-36 counter,
// are), otherwise a lowercased, cleaned-up form with a hash of the id, so
// that two ids never share a name. The id itself is in AnnotationSandbox.
func PodName(id string) string {
	if len(validation.IsDNS1123Subdomain(id)) == 0 {
		return id
	}
	var b strings.Builder
	for _, c := range []byte(strings.ToLower(id)) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			b.WriteByte('-') // a dot could make an empty or '-'-edged label
		}
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	// "x" keeps the name valid when nothing of the id survived.
	return "x" + strings.TrimRight(b.String(), "-") + "-" + strconv.FormatUint(h.Sum64(), 36)
}

// tenantKey reports whether a function's own label or annotation key k may
// go on its Pods: an unprefixed key, or one under a prefix the operator
// allowed (Config.KeyPrefixes). Prefixed keys are what the cluster's
// integrations act on (AppArmor and seccomp annotations, Vault's injector,
// service meshes, cloud IAM roles) with the namespace's authority, not the
// tenant's; brisk's own (brisk.dev/) and Kubernetes' (kubernetes.io,
// k8s.io and subdomains) are refused even when allowed.
func tenantKey(k string, allowed []string) bool {
	prefix, _, ok := strings.Cut(k, "/")
	if !ok {
		return true
	}
	if prefix == "brisk.dev" {
		return false
	}
	for _, d := range []string{"kubernetes.io", "k8s.io"} {
		if prefix == d || strings.HasSuffix(prefix, "."+d) {
			return false
		}
	}
	return slices.Contains(allowed, prefix)
}

// imageRef is the image that runs s: the spec's, or the trace function's
// image for the builtin (as in the containerd runtime). Commands and the
// other builtins are host processes: not for this runtime.
func imageRef(s runtime.Spec) (string, error) {
	f := s.Function
	switch {
	case s.ID == "" || !runtime.ValidName(s.ID):
		return "", fmt.Errorf("sandbox %q: invalid id", s.ID)
	case f == nil:
		return "", fmt.Errorf("sandbox %s: no function spec", s.ID)
	case f.Port < 1 || f.Port > 65535:
		return "", fmt.Errorf("sandbox %s: port %d out of range", s.ID, f.Port)
	case len(f.Secrets) > 0:
		// Secrets would be Kubernetes Secrets mounted into the Pod; not
		// done yet, and silently dropping them is worse than refusing.
		return "", fmt.Errorf("sandbox %s: function %s has secrets, which the kube runtime does not mount yet: %w", s.ID, f.Name, errors.ErrUnsupported)
	}
	return runtime.FunctionImage(s, "kube")
}

// podFor is the Pod of sandbox s on node, in namespace: bound to the node,
// never restarted (a sandbox that ends is reported and replaced by the
// control plane, not revived behind its back), with the function's
// variables and brisk's (runtime.FunctionEnv), its port, its requests and
// limits, a read-only root with a memory-backed /tmp unless the spec asks
// for a writable root, no service-account token and no service links (a
// function sees the same environment under every runtime).
func podFor(s runtime.Spec, namespace, node, token string, killGrace time.Duration, keyPrefixes []string) (*corev1.Pod, error) {
	ref, err := imageRef(s)
	if err != nil {
		return nil, err
	}
	f := s.Function
	labels := map[string]string{}
	for k, v := range f.Labels {
		if tenantKey(k, keyPrefixes) &&
			len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			labels[k] = v
		}
	}
	labels[LabelManagedBy] = ManagedBy
	labels[LabelFunction] = f.Name
	labels[LabelRevision] = strconv.FormatUint(f.Revision, 10)
	if len(validation.IsValidLabelValue(s.ID)) == 0 {
		labels[LabelSandbox] = s.ID
	}
	annotations := map[string]string{}
	for k, v := range f.Annotations {
		if tenantKey(k, keyPrefixes) && len(validation.IsQualifiedName(k)) == 0 {
			annotations[k] = v
		}
	}
	annotations[AnnotationSandbox] = s.ID
	annotations[annotationCreate] = token

	var env []corev1.EnvVar
	for _, kv := range runtime.FunctionEnv(nil, s, f.Port, "") {
		k, v, _ := strings.Cut(kv, "=")
		// The kubelet expands $(NAME) in values and reads $$ as $: double
		// every $ so the function sees its values as written, as under
		// the other runtimes.
		env = append(env, corev1.EnvVar{Name: k, Value: strings.ReplaceAll(v, "$", "$$")})
	}

	lim := f.SandboxLimits()
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	if f.Resources.MilliCPU > 0 {
		res.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(f.Resources.MilliCPU, resource.DecimalSI)
	}
	if f.Resources.MemoryMB > 0 {
		res.Requests[corev1.ResourceMemory] = *resource.NewQuantity(f.Resources.MemoryMB<<20, resource.BinarySI)
	}
	if lim.MilliCPU > 0 {
		res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(lim.MilliCPU, resource.DecimalSI)
	}
	if lim.MemoryMB > 0 {
		res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(lim.MemoryMB<<20, resource.BinarySI)
	}

	no, yes := false, true
	c := corev1.Container{
		Name:            ContainerName,
		Image:           ref,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Env:             env,
		Ports:           []corev1.ContainerPort{{Name: portName, ContainerPort: int32(f.Port), Protocol: corev1.ProtocolTCP}},
		Resources:       res,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	var volumes []corev1.Volume
	if f.WritableRoot {
		c.SecurityContext.ReadOnlyRootFilesystem = &no
	} else {
		tmpMB := int64(tmpSizeMB)
		if lim.MemoryMB > 0 {
			tmpMB = lim.MemoryMB
		}
		size := resource.NewQuantity(tmpMB<<20, resource.BinarySI)
		volumes = append(volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: size}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	}
	grace := int64(math.Ceil(killGrace.Seconds()))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(s.ID),
			Namespace:   namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			Containers:                    []corev1.Container{c},
			Volumes:                       volumes,
		},
	}, nil
}

// podAddr is where the Pod's function serves: its IP and the container's
// port; "" before the Pod has an IP.
func podAddr(p *corev1.Pod) string {
	if p.Status.PodIP == "" {
		return ""
	}
	for _, c := range p.Spec.Containers {
		if c.Name != ContainerName {
			continue
		}
		for _, port := range c.Ports {
			if port.Name == portName {
				return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port.ContainerPort)))
			}
		}
	}
	return ""
}

// running says the Pod serves as far as Kubernetes knows: Running, with an
// address, not being deleted.
func running(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && podAddr(p) != ""
}

// fatalWaiting are the reasons a container of a Pod that is never
// restarted waits for ever: the Pod will not start, and Create should say
// so at once rather than at its timeout.
var fatalWaiting = map[string]bool{
	"ErrImagePull":               true,
	"ImagePullBackOff":           true,
	"InvalidImageName":           true,
	"ErrImageNeverPull":          true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
	"RunContainerError":          true,
}

// ended says why the Pod's sandbox is over, nil while it is not: the Pod
// failed or completed (its container's exit, as the kubelet reports it), is
// being deleted, or cannot start.
func ended(p *corev1.Pod) error {
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		msg := "pod " + strings.ToLower(string(p.Status.Phase))
		if t := containerTerminated(p); t != nil {
			msg += fmt.Sprintf(": container exited with status %d", t.ExitCode)
			if t.Signal != 0 {
				msg += fmt.Sprintf(" (signal %d)", t.Signal)
			}
			if t.Reason != "" {
				msg += ", " + t.Reason
			}
			if t.Message != "" {
				msg += ": " + strings.TrimSpace(t.Message)
			}
			if t.Reason == "OOMKilled" {
				return fmt.Errorf("%w (%s)", runtime.ErrOOMKilled, msg)
			}
		} else if p.Status.Reason != "" {
			msg += ": " + p.Status.Reason
			if p.Status.Message != "" {
				msg += ": " + p.Status.Message
			}
		}
		return errors.New(msg)
	}
	if p.DeletionTimestamp != nil {
		return fmt.Errorf("pod %s/%s is being deleted, not by this worker", p.Namespace, p.Name)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && fatalWaiting[w.Reason] {
			return fmt.Errorf("pod %s/%s cannot start: %s: %s", p.Namespace, p.Name, w.Reason, w.Message)
		}
	}
	return nil
}

func containerTerminated(p *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == ContainerName && cs.State.Terminated != nil {
			return cs.State.Terminated
		}
	}
	return nil
}

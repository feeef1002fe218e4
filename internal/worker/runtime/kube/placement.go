package kube

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Placement says who chooses the Kubernetes node of a Runtime's Pods.
type Placement string

const (
	// PlaceBrisk binds each Pod to the Runtime's node (spec.nodeName):
	// brisk's placer chose that node, no scheduler runs (KubeDirect's way).
	PlaceBrisk Placement = "brisk"
	// PlaceScheduler leaves spec.nodeName empty: the Kubernetes scheduler
	// (the default one) places each Pod, on one of Config.Nodes when they
	// are given. The Runtime's node is then a brisk worker node standing
	// for those Kubernetes nodes, and its Pods carry its name in
	// AnnotationWorkerNode.
	PlaceScheduler Placement = "scheduler"
)

// AnnotationWorkerNode names the brisk worker node a Pod placed by the
// scheduler belongs to: its Kubernetes node says nothing about that (and
// is empty until the scheduler binds it).
const AnnotationWorkerNode = "brisk.dev/worker-node"

// owner is the brisk worker node of Pod p: AnnotationWorkerNode, else (a
// bound Pod) its Kubernetes node; "" for neither.
func owner(p *corev1.Pod) string {
	if n := p.Annotations[AnnotationWorkerNode]; n != "" {
		return n
	}
	return p.Spec.NodeName
}

// place makes pod, built bound to the Runtime's node, one for the
// scheduler: no node, the worker node's name, and node affinity to the
// configured nodes (the field selector DaemonSets use: node names need no
// label).
func (r *Runtime) place(pod *corev1.Pod) {
	if r.cfg.Placement != PlaceScheduler {
		return
	}
	pod.Spec.NodeName = ""
	pod.Annotations[AnnotationWorkerNode] = r.node
	if len(r.cfg.Nodes) == 0 {
		return
	}
	// A field selector takes one value: a term per node, which are ORed.
	terms := make([]corev1.NodeSelectorTerm, len(r.cfg.Nodes))
	for i, n := range r.cfg.Nodes {
		terms[i].MatchFields = []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{n}}}
	}
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms},
	}}
}

// unschedulable says why the scheduler cannot place Pod p, nil while it
// can, has, or is making room by preemption (a nominated node). A Create
// fails on it after Config.UnschedulableGrace rather than at its timeout:
// the control plane retries with its backoff, and meanwhile the call waits
// or takes the emergency track instead of a Pod that may never run.
func unschedulable(p *corev1.Pod) error {
	if p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
		return nil
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return fmt.Errorf("pod %s/%s cannot be scheduled: %s", p.Namespace, p.Name, c.Message)
		}
	}
	return nil
}

// NodeReaderRole is what a worker whose node stands for Kubernetes nodes
// (PlaceScheduler) needs to size itself from them (NodesCapacity): get and
// list on nodes, cluster-wide. Not needed when its capacity is given.
func NodeReaderRole(name string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""},
			Resources: []string{"nodes"},
			Verbs:     []string{"get", "list"},
		}},
	}
}

// Capacity is what some Kubernetes nodes offer Pods.
type Capacity struct {
	MilliCPU, MemoryMB int64
	Pods               int
	Nodes              int // how many nodes it sums
}

// NodesCapacity sums the allocatable CPU, memory and Pods of the named
// nodes, or of every schedulable node when names is empty: the capacity
// of a worker node standing for them. Cordoned nodes count only when
// named. It is a snapshot: nodes added later are not counted.
func NodesCapacity(ctx context.Context, client corev1client.NodesGetter, names []string) (Capacity, error) {
	var nodes []corev1.Node
	if len(names) == 0 {
		list, err := client.Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return Capacity{}, fmt.Errorf("list nodes: %w", err)
		}
		for _, n := range list.Items {
			if !n.Spec.Unschedulable {
				nodes = append(nodes, n)
			}
		}
	} else {
		for _, name := range names {
			n, err := client.Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return Capacity{}, fmt.Errorf("node %s: %w", name, err)
			}
			nodes = append(nodes, *n)
		}
	}
	var c Capacity
	for _, n := range nodes {
		a := n.Status.Allocatable
		c.MilliCPU += a.Cpu().MilliValue()
		c.MemoryMB += a.Memory().Value() >> 20
		c.Pods += int(a.Pods().Value())
		c.Nodes++
	}
	if c.Nodes == 0 {
		return c, errors.New("no schedulable node")
	}
	return c, nil
}

package kubecluster

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// Schedulable lifts the not-ready taint from the cluster's KWOK nodes. The
// apiserver gives it to every new node, and the node-lifecycle controller
// that lifts it once the node is Ready does not run here (KWOK keeps no
// leases for it to follow), so without this kube-scheduler places only
// Pods that tolerate it.
func (c *Cluster) Schedulable(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	nodes := slices.Clone(c.Nodes)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, name := range nodes {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(tn corev1.Taint) bool {
				return tn.Key == corev1.TaintNodeNotReady
			})
			if len(kept) == len(n.Spec.Taints) {
				return nil
			}
			n.Spec.Taints = kept
			_, err = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatalf("kubecluster: untaint node %s: %v", name, err)
		}
	}
}

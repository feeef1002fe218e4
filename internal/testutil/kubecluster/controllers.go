package kubecluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// StartControllers starts kube-controller-manager (the Deployment,
// ReplicaSet, StatefulSet and DaemonSet controllers only) and kube-scheduler against the cluster, for
// the stock Kubernetes baseline of the KubeDirect benchmark. qps > 0 lifts
// both clients' rate limits to qps (and burst qps), as kwokctl's
// DisableQPSLimits does; 0 keeps the stock limits (controller-manager 20
// QPS, burst 30; scheduler 50, burst 100), which bound a scale-up from the
// client side. Neither serves HTTPS (--secure-port=0): a caller sees them
// work by what they do. Both stop with the cluster. extra names more of
// the controller manager's controllers to run (for Pods on a real
// kubelet: endpointslice-controller for cluster DNS,
// root-ca-certificate-publisher-controller for service-account tokens'
// CA, garbage-collector-controller and namespace-controller for deletes
// to reach the Pods).
func (c *Cluster) StartControllers(t testing.TB, qps float64, extra ...string) {
	t.Helper()
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(c.bin, name)); err != nil {
			t.Fatalf("kubecluster: %s is not in %s (scripts/k8s-binaries.sh builds it): %v", name, c.bin, err)
		}
	}
	limits := func() []string {
		if qps <= 0 {
			return nil
		}
		q := strconv.FormatFloat(qps, 'f', -1, 64)
		return []string{"--kube-api-qps=" + q, "--kube-api-burst=" + strconv.Itoa(int(qps))}
	}
	common := []string{"--kubeconfig=" + c.Kubeconfig, "--bind-address=127.0.0.1", "--secure-port=0",
		"--leader-elect=false", "--authentication-skip-lookup=true"}
	c.start(t, "kube-controller-manager", append(append(common,
		// The StatefulSet and DaemonSet controllers for brisk's own
		// manifests (internal/kubernetes/install); idle, they cost a few watches.
		"--controllers="+strings.Join(append([]string{"deployment-controller", "replicaset-controller", "statefulset-controller", "daemonset-controller"}, extra...), ","),
		"--root-ca-file="+c.pki.caFile,
		"--cert-dir="+filepath.Join(c.Dir, "kcm-certs")), limits()...)...)
	c.start(t, "kube-scheduler", append(append(common,
		"--cert-dir="+filepath.Join(c.Dir, "scheduler-certs")), limits()...)...)
}

// Package kubernetes is where brisk meets Kubernetes, and Config is how
// every part of brisk finds the cluster. The parts live by concern:
//
//   - fncontroller: `brisk k8s functions`, the controller that deploys
//     brisk.dev/v1 Function objects through brisk's admin API;
//   - install: `brisk k8s install|uninstall|manifests|image`, brisk
//     deployed on a cluster from deploy/kubernetes;
//   - internal/worker/runtime/kube: the "kube" sandbox runtime (sandboxes
//     as Pods), with the other runtimes;
//   - internal/compat/knative: Knative Serving's Service as a function
//     spec, with the other compatibility layers;
//   - internal/testutil/kubecluster: a real control plane (etcd,
//     kube-apiserver, KWOK, a kubelet) for tests.
package kubernetes

import (
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config is the REST config of the cluster brisk talks to, found as
// kubectl finds it: the kubeconfig at path if given; else, with $KUBECONFIG
// unset, the Pod's service account when running in one; else $KUBECONFIG
// or ~/.kube/config. Rates and timeouts are the caller's: an installer's
// short requests want a timeout that would cut an informer's watch.
func Config(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case path != "":
		if cfg, err = clientcmd.BuildConfigFromFlags("", path); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "":
		if cfg, err = rest.InClusterConfig(); err == nil {
			break
		}
		fallthrough
	default:
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig(); err != nil {
			return nil, fmt.Errorf("no cluster to talk to (give a kubeconfig, set KUBECONFIG, or run in a Pod): %w", err)
		}
	}
	return cfg, nil
}

package cli

import (
	"errors"
	"os"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/brisk-faas/brisk/internal/kubernetes"
	"github.com/brisk-faas/brisk/internal/kubernetes/fncontroller"
)

// newK8sFunctions is `brisk k8s functions`: the controller that deploys
// brisk.dev/v1 Function objects through the admin API.
func newK8sFunctions(g *globals) *cobra.Command {
	var (
		kubeconfig string
		cfg        fncontroller.Config
	)
	c := &cobra.Command{
		Use:   "functions",
		Short: "Deploy brisk.dev/v1 Function objects from Kubernetes into brisk (a controller)",
		Long: `Watch Function objects (the CRD in deploy/kubernetes/function-crd.yaml) and
keep brisk's functions in step with them through the admin API (--admin-url,
with a deploy token; an admin token with --create-namespaces):
kubectl apply of a Function deploys it, a change makes a new revision, and
deleting the object deletes the function. A Function NAME in Kubernetes
namespace NS is brisk function NAME in brisk namespace NS, served only when
NS is labelled brisk.dev/functions=enabled (kubectl label namespace NS
brisk.dev/functions=enabled): NS's objects get brisk namespace NS's secrets
and quota. Annotating an object brisk.dev/orphan=true lets it be deleted
without deleting its function (when brisk refuses, e.g. the token was
revoked). The outcome is
the object's status: observedGeneration, the Ready condition (brisk's
error when it refuses the spec), revision, ready sandboxes and URL.
Functions made through the admin API are never changed or deleted.

Its Kubernetes rights: get, list, watch and update functions.brisk.dev,
update functions/status, and get, list, watch namespaces
(fncontroller.ClusterRole). Run one replica.
See docs/operations.md, "Function objects (Kubernetes)".`,
		Example: `  kubectl apply -f deploy/kubernetes/function-crd.yaml
  brisk k8s functions --kubeconfig ~/.kube/config --admin-url brisk-cp:9090 --token-file /var/run/brisk/token
  kubectl get functions -A`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			rc, err := kubernetes.Config(kubeconfig)
			if err != nil {
				return usageError{err}
			}
			if g.apiToken() == "" {
				return usageError{errors.New("no brisk token: give --token or --token-file (a deploy token, or admin with --create-namespaces)")}
			}
			cfg.REST, cfg.Brisk, cfg.Logger = rc, g.client(), log.With("component", "k8s-functions")
			ctrl, err := fncontroller.New(cfg)
			if err != nil {
				return usageError{err}
			}
			return ctrl.Run(c.Context())
		},
	}
	fl := c.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: the in-cluster service account when $KUBECONFIG is unset, else $KUBECONFIG or ~/.kube/config)")
	fl.StringVarP(&cfg.Namespace, "namespace", "n", "", "watch only this Kubernetes namespace (default: all; a Role then suffices)")
	fl.IntVar(&cfg.Workers, "workers", 4, "objects reconciled at once")
	fl.DurationVar(&cfg.Resync, "resync", 5*time.Minute, "re-read every object this often, retrying specs brisk refused (kubectl annotate retries one at once)")
	fl.DurationVar(&cfg.StatusInterval, "status-interval", 5*time.Second, "how often brisk's functions are listed to update the objects' status and delete functions whose object is gone")
	fl.StringVar(&cfg.Domain, "domain", "brisk.local", "domain of status.url (http://NAME.NAMESPACE.DOMAIN)")
	fl.BoolVar(&cfg.CreateNamespaces, "create-namespaces", false, "create a missing brisk namespace (without a quota) for an opted-in Kubernetes namespace (needs an admin token)")
	c.AddCommand(newK8sFunctionsExport(g))
	return c
}

// newK8sFunctionsExport prints a brisk function as a Function object.
func newK8sFunctionsExport(g *globals) *cobra.Command {
	var namespace string
	c := &cobra.Command{
		Use:   "export NAME",
		Short: "Print a brisk function as a brisk.dev/v1 Function object (YAML)",
		Long: `Print function NAME's spec as a Function object, in Kubernetes namespace -n
(default: the function's brisk namespace). The controller does not take
over a function made through the admin API: delete it, then apply the
object, and the controller deploys it again under the object.`,
		Example: "  brisk k8s functions export hello > hello.yaml",
		Args:    exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := g.client().Get(c.Context(), args[0])
			if err != nil {
				return err
			}
			obj, err := fncontroller.FromSpec(v.Function, namespace)
			if err != nil {
				return err
			}
			y, err := yaml.Marshal(obj.Object)
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(y)
			return err
		},
	}
	c.Flags().StringVarP(&namespace, "namespace", "n", "", "the object's Kubernetes namespace (default: the function's brisk namespace)")
	return c
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/kubernetes"
	"github.com/brisk-faas/brisk/internal/kubernetes/install"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
)

func newK8s(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "k8s",
		Short: "Run brisk on Kubernetes: its image, its manifests, install and uninstall",
		Long: `Deploy brisk itself on a Kubernetes cluster: the control plane as a
3-replica StatefulSet, the data planes as a Deployment behind a Service, a
worker on every node (a DaemonSet) and the Function controller ('brisk k8s
functions', one replica), each with its own ServiceAccount and only the
rights it uses (docs/operations.md "Running on Kubernetes").

  brisk k8s image --out brisk-image.tar            # brisk's own image, no Docker
  ctr -n k8s.io images import brisk-image.tar      # on every node (no registry)
  brisk k8s install                                # brisk k8s manifests shows what it applies
  brisk k8s uninstall`,
	}
	c.AddCommand(newK8sImage(), newK8sManifests(), newK8sInstall(), newK8sUninstall(), newK8sFunctions(g))
	return c
}

// k8sFlags are what the manifests are rendered for.
type k8sFlags struct{ o install.Options }

func (f *k8sFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVarP(&f.o.Namespace, "namespace", "n", install.DefaultNamespace, "namespace of brisk's objects (created unless it exists; not default or kube-*)")
	fl.StringVar(&f.o.SandboxNamespace, "sandbox-namespace", "", "with --worker-runtime kube: namespace of the functions' Pods, brisk's alone, Pod Security baseline enforced (default NAMESPACE"+install.SandboxSuffix+")")
	fl.StringVar(&f.o.Image, "image", install.ImageRef, "brisk's image (brisk k8s image builds it)")
	fl.IntVar(&f.o.Replicas, "replicas", 3, "control-plane replicas: 1, 3, 5 or 7 (raft)")
	fl.IntVar(&f.o.DataPlanes, "dataplanes", 2, "data-plane replicas")
	fl.StringVar(&f.o.WorkerRuntime, "worker-runtime", "containerd", "the workers' sandbox runtime: containerd (the node's containerd, privileged DaemonSet, native emergency track) or kube (sandboxes are Pods in --sandbox-namespace, unprivileged DaemonSet)")
	fl.StringVar(&f.o.StorageSize, "storage-size", "1Gi", "each control-plane replica's registry volume (a PersistentVolumeClaim)")
	fl.StringVar(&f.o.StorageClass, "storage-class", "", "storage class of those volumes (default: the cluster's)")
	fl.BoolVar(&f.o.Ephemeral, "ephemeral-storage", false, "keep the registry in an emptyDir instead: lost with the Pods (clusters without volumes, tests)")
	fl.StringVar(&f.o.APIServer, "api-server", "", "HOST:PORT where the kube worker and the Function controller reach the apiserver (default: the kubernetes Service's ClusterIP, which needs kube-proxy or a replacement on the nodes)")
	fl.BoolVar(&f.o.FunctionsCreateNamespaces, "functions-create-namespaces", false, "let the Function controller create the brisk namespace (with no quota) of a Kubernetes namespace's first Function; off: an admin makes them")
}

func newK8sManifests() *cobra.Command {
	var f k8sFlags
	c := &cobra.Command{
		Use:   "manifests",
		Short: "Print brisk's Kubernetes manifests, rendered for --namespace, --image, --replicas...",
		Long: `Print the manifests of deploy/kubernetes rendered for the flags, as one YAML
stream for kubectl apply -f -. They leave out the Secrets (the cluster CA,
the first admin and join tokens): brisk k8s install makes those. Objects
for the other worker runtime are left out.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			objs, err := install.Render(f.o)
			if err != nil {
				return usageError{err}
			}
			fmt.Fprintf(c.OutOrStdout(), "# brisk on Kubernetes, namespace %s. Secrets %s and %s are not here: 'brisk k8s install' makes them.\n",
				f.o.Namespace, install.SecretControlPlane, install.SecretJoin)
			return install.YAML(c.OutOrStdout(), objs)
		},
	}
	f.register(c)
	return c
}

// kubeFlags find the cluster.
type kubeFlags struct{ kubeconfig string }

func (f *kubeFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: $KUBECONFIG, else the in-cluster service account, else ~/.kube/config)")
}

func (f *kubeFlags) config() (*rest.Config, error) {
	cfg, err := kubernetes.Config(f.kubeconfig)
	if err != nil {
		return nil, usageError{err}
	}
	cfg.Timeout = 30 * time.Second // per request: an unreachable apiserver is an error, not a hang
	// Install makes about a hundred requests (a read and an apply per
	// object): client-go's default 5 per second would make it take 20s.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

func newK8sInstall() *cobra.Command {
	var f k8sFlags
	var kf kubeFlags
	c := &cobra.Command{
		Use:   "install",
		Short: "Install or update brisk on a Kubernetes cluster (server-side apply; idempotent)",
		Long: `Apply brisk's manifests (brisk k8s manifests shows them) with server-side apply,
as field manager brisk-k8s-install. The first install also makes the
Secrets: brisk-controlplane (the cluster CA, its key, the first admin token,
join token and the Function controller's deploy token; only the control
plane mounts it whole) and brisk-join (the CA
certificate and the join token, for the workers and data planes). An
existing Secret is never replaced. Running it again changes nothing;
with other flags it updates what differs, and removes the objects of the
other worker runtime. With --worker-runtime kube the functions' Pods go to
--sandbox-namespace, the one namespace the workers may create Pods in.

One install per cluster: install refuses when brisk is installed in
another namespace, when the namespace is default or kube-*, and when the
namespace holds an earlier install's registry volumes but not its Secret
(delete the volumes, or restore the Secret).

brisk's image must be on the nodes (brisk k8s image, then ctr -n k8s.io
images import on each node) or in a registry the nodes pull from (--image).
The admin token: kubectl -n NAMESPACE get secret brisk-controlplane -o
jsonpath='{.data.admin\.token}' | base64 -d.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			if _, err := install.Render(f.o); err != nil {
				return usageError{err}
			}
			cfg, err := kf.config()
			if err != nil {
				return err
			}
			changes, err := install.Install(c.Context(), cfg, f.o)
			printChanges(c.OutOrStdout(), changes)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "brisk is installed in namespace %s; admin API: https://brisk-admin.%s.svc:9090 (CA and admin token in secret %s)\n",
				f.o.Namespace, f.o.Namespace, install.SecretControlPlane)
			return nil
		},
	}
	f.register(c)
	kf.register(c)
	return c
}

func newK8sUninstall() *cobra.Command {
	var o install.UninstallOptions
	var kf kubeFlags
	c := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove what brisk k8s install made (the Function CRD only with --crds)",
		Long: `Delete the objects brisk k8s install made in --namespace, its Secrets
included, workloads first; then the namespace and the sandbox namespace, if
install made them (with them go the registry's volumes and any function
Pods). First it takes the Function controller's finalizer off every
Function object in the cluster: nothing would remove it later. Objects of
the same names that install did not make are kept, and so are the
registry's volumes in a namespace install did not make, unless
--delete-data. The CRDs are kept unless --crds: deleting one deletes every
object of its kind in the cluster.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := kf.config()
			if err != nil {
				return err
			}
			changes, err := install.Uninstall(c.Context(), cfg, o)
			printChanges(c.OutOrStdout(), changes)
			for _, ch := range changes {
				if ch.Kind == "PersistentVolumeClaim" && ch.Action == install.Kept {
					fmt.Fprintf(c.OutOrStdout(), "the registry's volumes are kept (the Secret with its CA and tokens is gone): an install here refuses them; uninstall --delete-data deletes them\n")
					break
				}
			}
			return err
		},
	}
	c.Flags().StringVarP(&o.Namespace, "namespace", "n", install.DefaultNamespace, "namespace brisk was installed in")
	c.Flags().StringVar(&o.SandboxNamespace, "sandbox-namespace", "", "the functions' Pods' namespace install made (default NAMESPACE"+install.SandboxSuffix+")")
	c.Flags().BoolVar(&o.CRDs, "crds", false, "delete the CustomResourceDefinitions too (and every Function object in the cluster)")
	c.Flags().BoolVar(&o.DeleteData, "delete-data", false, "delete the control plane's registry volumes (PersistentVolumeClaims) too")
	kf.register(c)
	return c
}

func printChanges(w io.Writer, changes []install.Change) {
	for _, ch := range changes {
		fmt.Fprintln(w, ch)
	}
}

func newK8sImage() *cobra.Command {
	var out, tag, briskBin, initBin, ns, address, snapshotter string
	var doImport bool
	c := &cobra.Command{
		Use:   "image",
		Short: "Build brisk's own OCI image (brisk and the sandbox init), without Docker",
		Long: `Build the image the manifests run: a static brisk (this binary when it is
static, else one built with CGO_ENABLED=0 from brisk's source tree) and the
native runtime's sandbox init (bin/brisk-sandbox-init beside this binary, as
make build puts it; scripts/build-sandbox-init.sh builds it), in
/usr/local/bin, entrypoint brisk, user 65532. The OCI archive goes to
--out; load it on each node with

  ctr -n k8s.io images import FILE.tar

(or --import here, into this machine's containerd), or push it to your
registry and install with --image.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			ctx := c.Context()
			if out == "" {
				return usageError{errors.New("--out FILE.tar is required")}
			}
			tmp, err := os.MkdirTemp("", "brisk-k8s-image-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			if briskBin == "" {
				if static, err := image.IsStatic(exe); err == nil && !static {
					fmt.Fprintf(c.ErrOrStderr(), "%s is dynamically linked: building a static brisk (CGO_ENABLED=0; minutes on a cold build cache)\n", exe)
				}
				if briskBin, err = image.StaticBrisk(ctx, exe, tmp); err != nil {
					return err
				}
			}
			if initBin == "" {
				initBin = filepath.Join(filepath.Dir(exe), nsinit.BinaryName)
				if _, err := os.Stat(initBin); err != nil {
					return usageError{fmt.Errorf("no sandbox init at %s: build it with scripts/build-sandbox-init.sh (make build puts it in bin/) and give it with --sandbox-init", initBin)}
				}
			}
			img, err := install.BuildImage(briskBin, initBin)
			if err != nil {
				return err
			}
			if err := image.WriteArchive(out, img, tag); err != nil {
				return err
			}
			dgst, _ := img.Digest()
			st, _ := os.Stat(out)
			fmt.Fprintf(c.OutOrStdout(), "built %s (%s), archive %s (%s)\n", tag, dgst, out, formatBytes(st.Size()))
			if !doImport {
				return nil
			}
			t := imageTarget{address: address, namespace: ns, snapshotter: snapshotter}
			ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			refs, err := t.importFile(ictx, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "imported %s into containerd (namespace %s)\n", strings.Join(refs, ", "), ns)
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&out, "out", "", "write the OCI archive here")
	fl.StringVar(&tag, "tag", install.ImageRef, "the image's reference (install --image must name the same)")
	fl.StringVar(&briskBin, "brisk", "", "static brisk binary to put in the image (default: see above)")
	fl.StringVar(&initBin, "sandbox-init", "", "static sandbox init binary (default: "+nsinit.BinaryName+" beside this binary)")
	fl.BoolVar(&doImport, "import", false, "also import the image into this machine's containerd")
	fl.StringVar(&ns, "containerd-namespace", "k8s.io", "with --import: containerd namespace (the kubelet's is k8s.io)")
	fl.StringVar(&address, "containerd-address", image.DefaultContainerdAddress, "with --import: containerd's socket")
	fl.StringVar(&snapshotter, "snapshotter", image.DefaultSnapshotter, "with --import: snapshotter to unpack into")
	return c
}

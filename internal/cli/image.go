package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/credentials"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtimes"
)

// ctrFlags are the worker's flags for --runtime containerd.
type ctrFlags struct {
	address, namespace, snapshotter   string
	poolSize                          int
	subnet, bridge, prefix            string
	firewall                          bool
	allowHostPorts                    []int
	shells                            int
	egress, dns                       bool
	egressDeny, dnsUpstreams, ingress []string
}

func (f *ctrFlags) register(c *cobra.Command) {
	fl := c.Flags()
	d := netpool.Default()
	fl.StringVar(&f.address, "containerd-address", image.DefaultContainerdAddress, "with --runtime containerd: containerd's socket")
	fl.StringVar(&f.namespace, "containerd-namespace", image.DefaultNamespace, "with --runtime containerd: containerd namespace for images and containers")
	fl.StringVar(&f.snapshotter, "snapshotter", image.DefaultSnapshotter, "with --runtime containerd: snapshotter that unpacks images")
	fl.IntVar(&f.poolSize, "net-pool", d.Size, "with --runtime containerd or native: sandbox network namespaces kept pre-created (0 = each made on demand)")
	fl.StringVar(&f.subnet, "net-subnet", d.Subnet.String(), "with --runtime containerd or native: sandbox addresses (the bridge takes the first)")
	fl.StringVar(&f.bridge, "net-bridge", d.Bridge, "with --runtime containerd or native: host bridge the sandboxes' veths join")
	fl.StringVar(&f.prefix, "net-prefix", d.NamePrefix, "with --runtime containerd or native: name prefix of the sandboxes' network namespaces and veths")
	fl.BoolVar(&f.firewall, "net-firewall", true, "with --runtime containerd or native: netfilter rules (nf_tables table brisk_netpool_<net-prefix>) that keep sandboxes from every address of this host (admin, gRPC, data plane ports) and from each other; =false only where the kernel lacks nf_tables")
	fl.IntVar(&f.shells, "native-shells", 0, "with --runtime native: parked sandbox shells kept ready (0 = 16)")
	fl.BoolVar(&f.egress, "net-egress", d.Egress, "with --runtime containerd or native: sandboxes may open connections beyond this host, NAT'd through it (turns the host's IPv4 forwarding on); this host's addresses, other sandboxes and link-local addresses (cloud metadata) stay refused")
	fl.StringSliceVar(&f.ingress, "net-ingress", nil, "with --runtime containerd or native: networks whose hosts may connect to sandboxes, e.g. data planes on other hosts at 10.0.1.0/24 (they route --net-subnet to this host); turns IPv4 forwarding on; default: only this host reaches sandboxes")
	fl.StringSliceVar(&f.egressDeny, "net-egress-deny", nil, "with --runtime containerd or native: more networks sandboxes may not reach, e.g. 10.0.0.0/8,192.168.0.0/16")
	fl.BoolVar(&f.dns, "net-dns", d.DNS, "with --runtime containerd or native: sandboxes resolve names through a DNS forwarder on their gateway (their /etc/resolv.conf names it), which relays to this host's resolvers")
	fl.StringSliceVar(&f.dnsUpstreams, "net-dns-upstreams", nil, "with --runtime containerd or native: resolvers (ip:port) the sandboxes' DNS forwarder relays to (default: the nameservers of this host's /etc/resolv.conf)")
	fl.IntSliceVar(&f.allowHostPorts, "net-allow-host-ports", nil, "with --runtime containerd or native: TCP ports on this host that sandboxes may connect to despite --net-firewall, e.g. 3128,8125")
}

// apply sets w's containerd options when w runs containerd.
func (f *ctrFlags) apply(w *runtimes.Workers) error {
	if w.Runtime != "containerd" && w.Runtime != "native" {
		return nil
	}
	subnet, err := netip.ParsePrefix(f.subnet)
	if err != nil {
		return usageError{fmt.Errorf("--net-subnet %q: want an IPv4 prefix like 10.211.0.0/16", f.subnet)}
	}
	w.ContainerdAddress, w.ContainerdNamespace, w.Snapshotter = f.address, f.namespace, f.snapshotter
	w.NetPool = netpool.Default()
	w.NetPool.Size, w.NetPool.Subnet, w.NetPool.Bridge, w.NetPool.NamePrefix = f.poolSize, subnet, f.bridge, f.prefix
	w.NetPool.NoFirewall = !f.firewall
	w.NetPool.Egress, w.NetPool.DNS = f.egress, f.dns
	if !f.firewall { // their NAT lives in the firewall's tables
		w.NetPool.Egress, w.NetPool.DNS = false, false
	}
	for _, d := range f.egressDeny {
		pfx, err := netip.ParsePrefix(d)
		if err != nil {
			return usageError{fmt.Errorf("--net-egress-deny %q: want an IPv4 network like 10.0.0.0/8", d)}
		}
		w.NetPool.EgressDeny = append(w.NetPool.EgressDeny, pfx)
	}
	for _, d := range f.ingress {
		pfx, err := netip.ParsePrefix(d)
		if err != nil {
			return usageError{fmt.Errorf("--net-ingress %q: want an IPv4 network like 10.0.1.0/24", d)}
		}
		w.NetPool.Ingress = append(w.NetPool.Ingress, pfx)
	}
	w.NetPool.DNSUpstreams = f.dnsUpstreams
	if f.shells < 0 {
		return usageError{fmt.Errorf("--native-shells %d must not be negative", f.shells)}
	}
	w.NativeShells = f.shells
	for _, p := range f.allowHostPorts {
		if p < 1 || p > 65535 {
			return usageError{fmt.Errorf("--net-allow-host-ports: %d is not a port (1-65535)", p)}
		}
		w.NetPool.AllowHostPorts = append(w.NetPool.AllowHostPorts, uint16(p))
	}
	if err := w.NetPool.Validate(); err != nil {
		return usageError{fmt.Errorf("--net-*: %w", err)}
	}
	return nil
}

// imageTarget is where an image command finds containerd.
type imageTarget struct{ address, namespace, snapshotter string }

func (t *imageTarget) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&t.address, "containerd-address", image.DefaultContainerdAddress, "containerd's socket")
	fl.StringVar(&t.namespace, "containerd-namespace", image.DefaultNamespace, "containerd namespace the workers use")
	fl.StringVar(&t.snapshotter, "snapshotter", image.DefaultSnapshotter, "snapshotter to unpack into")
}

// importFile imports an OCI archive into the local containerd.
func (t *imageTarget) importFile(ctx context.Context, path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := containerd.New(t.address, containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", t.address, err)
	}
	defer c.Close()
	return image.Import(ctx, c, t.namespace, t.snapshotter, f)
}

func newImage(g *globals) *cobra.Command {
	c := &cobra.Command{
		Use:   "image",
		Short: "Build OCI images for functions and get them to the workers, without a registry",
		Long: `Build single-layer OCI images from a static binary or a directory, and get
them to the workers that run them (--runtime containerd or native). build
also imports the image into this host's containerd unless --no-import is
given (a native-runtime host has no containerd: use push). No registry and no
Docker engine are involved: images travel as OCI archives.

  brisk image build hello ./hello-server --entrypoint "/hello-server --flag"
  brisk image build trace                      # the built-in trace function
  brisk image import hello.tar                 # on a worker machine
  brisk image push hello --to-workers          # to every worker of the cluster (containerd or native)
  brisk fn deploy hello --image brisk.local/hello:latest --port 8080`,
	}
	c.AddCommand(newImageBuild(g), newImageImport(), newImagePush(g))
	return c
}

func newImageBuild(g *globals) *cobra.Command {
	var (
		entrypoint, cmd, workdir, tag, out, dataDir string
		env                                         []string
		ports                                       []int
		doImport, noImport                          bool
		tgt                                         imageTarget
	)
	c := &cobra.Command{
		Use:   "build NAME [PATH]",
		Short: "Build an image from a static binary or a directory (or `build trace`: the built-in trace function)",
		Long: `Build an OCI image NAME (reference brisk.local/NAME:latest unless --tag) with
one layer: PATH's file at /<basename>, or a directory's content at /. The
binary must be static (build Go with CGO_ENABLED=0): the image holds nothing
else. Without --entrypoint, a file is its own entrypoint.

'brisk image build trace' with no PATH builds the built-in trace function
from the lean brisk-trace binary beside this brisk (make build puts it
there), else from one built with the go command from brisk's source tree,
else from this brisk binary itself (entrypoint "/brisk __trace", rebuilt with
CGO_ENABLED=0 when it is not static); the containerd runtime runs
'--builtin trace' functions from that image.

The archive goes to --out, or to <data-dir>/images/NAME.tar. Without --out
the image is also imported into the local containerd, so a worker on this
machine can run it at once; with --out only the archive is written unless
--import is given.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usageError{fmt.Errorf("%s takes NAME [PATH], got %d argument(s)\nUsage: %s", c.CommandPath(), len(args), c.UseLine())}
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			name := args[0]
			if !image.ValidName(name) {
				return usageError{fmt.Errorf("image name %q: want lowercase letters and digits, joined by '.', '_' or '-'", name)}
			}
			ctx := c.Context()
			var opts image.Options
			ref := image.Ref(name)
			switch {
			case len(args) == 2:
				opts.Path = args[1]
			case name == image.TraceName:
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				tmp, err := os.MkdirTemp("", "brisk-image-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(tmp)
				if opts, err = image.TraceBuildOptions(ctx, exe, tmp); err != nil {
					return err
				}
			default:
				return usageError{fmt.Errorf("brisk image build %s: PATH is required (only 'trace' is built in)", name)}
			}
			if entrypoint != "" {
				argv, err := splitCommand(entrypoint)
				if err != nil {
					return usageError{fmt.Errorf("--entrypoint: %w", err)}
				}
				opts.Entrypoint = argv
			}
			if cmd != "" {
				argv, err := splitCommand(cmd)
				if err != nil {
					return usageError{fmt.Errorf("--cmd: %w", err)}
				}
				opts.Cmd = argv
			}
			opts.Env = append(opts.Env, env...)
			opts.WorkingDir, opts.ExposedPorts = workdir, ports
			if tag != "" {
				ref = tag
			}
			img, err := image.Build(opts)
			if err != nil {
				return usageOr(err)
			}
			archive := out
			if archive == "" {
				archive = filepath.Join(dataDir, "images", name+".tar")
				doImport = !noImport
			}
			if err := os.MkdirAll(filepath.Dir(archive), 0o755); err != nil {
				return err
			}
			if err := image.WriteArchive(archive, img, ref); err != nil {
				return err
			}
			dgst, _ := img.Digest()
			st, _ := os.Stat(archive)
			fmt.Fprintf(c.OutOrStdout(), "built %s (%s), archive %s (%d bytes)\n", ref, dgst, archive, st.Size())
			if !doImport {
				return nil
			}
			refs, err := tgt.importFile(ctx, archive)
			if err != nil {
				return fmt.Errorf("%w\n(the archive is written; import it later with 'brisk image import %s', send it to the workers with 'brisk image push %s --to-workers', or pass --no-import to skip the import)", err, archive, name)
			}
			fmt.Fprintf(c.OutOrStdout(), "imported %s into containerd (namespace %s)\n", strings.Join(refs, ", "), tgt.namespace)
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&entrypoint, "entrypoint", "", "the image's entrypoint; quotes group words (default: the file itself)")
	fl.StringVar(&cmd, "cmd", "", "the image's command (arguments after the entrypoint); quotes group words")
	fl.StringArrayVar(&env, "env", nil, "KEY=VALUE in the image's environment (repeatable)")
	fl.StringVar(&workdir, "workdir", "", "the image's working directory")
	fl.IntSliceVar(&ports, "port", nil, "TCP port the image exposes (metadata only; the function spec's port is what counts)")
	fl.StringVar(&tag, "tag", "", "image reference (default brisk.local/NAME:latest)")
	fl.StringVar(&out, "out", "", "write the OCI archive here and do not import it (unless --import)")
	fl.BoolVar(&doImport, "import", false, "with --out: import into the local containerd too")
	fl.BoolVar(&noImport, "no-import", false, "without --out: only write the archive")
	fl.StringVar(&dataDir, "data-dir", defaultDataDir(), "brisk's data directory; archives go to <data-dir>/images")
	tgt.register(c)
	return c
}

func newImageImport() *cobra.Command {
	var tgt imageTarget
	c := &cobra.Command{
		Use:   "import FILE.tar",
		Short: "Import an OCI archive into this machine's containerd, for its worker",
		Long: `Import an OCI archive (as written by 'brisk image build' or any OCI tool;
index.json names the image with org.opencontainers.image.ref.name) into the
local containerd and unpack it, so this machine's worker can run it.`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			refs, err := tgt.importFile(c.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "imported %s into containerd (namespace %s)\n", strings.Join(refs, ", "), tgt.namespace)
			return nil
		},
	}
	tgt.register(c)
	return c
}

func newImagePush(g *globals) *cobra.Command {
	var dataDir string
	var toWorkers bool
	c := &cobra.Command{
		Use:   "push NAME|FILE.tar --to-workers",
		Short: "Send an image archive to every worker of the cluster, which imports it",
		Long: `Send the OCI archive of image NAME (<data-dir>/images/NAME.tar, as 'brisk image
build' writes it) or FILE.tar to every worker the control plane knows
(GET /v1/status), over each worker's gRPC endpoint (Worker.ImportImage).
Each worker imports and unpacks it into its containerd. Workers that do not
run the containerd runtime refuse it.`,
		Args: exactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !toWorkers {
				return usageError{fmt.Errorf("brisk image push needs --to-workers (the only destination: there is no registry)")}
			}
			path := archivePath(dataDir, args[0])
			st, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("image archive: %w (build it with 'brisk image build %s PATH')", err, args[0])
			}
			view, err := g.client().Status(c.Context())
			if err != nil {
				return err
			}
			seen := map[string]bool{}
			var addrs []string
			for _, n := range view.Nodes {
				if n.Address != "" && !seen[n.Address] {
					seen[n.Address] = true
					addrs = append(addrs, n.Address)
				}
			}
			if len(addrs) == 0 {
				return fmt.Errorf("the control plane at %s knows no workers", g.admin)
			}
			// Workers take images from control planes only: with the
			// cluster CA in --data-dir (run on a control-plane host), the
			// push carries a control-plane certificate; without it, only
			// workers run with --insecure-no-tls accept it.
			var creds credentials.TransportCredentials
			if ca, err := pki.LoadCA(dataDir); err == nil {
				id, err := ca.Issue(pki.KindControlPlane, []string{"image-push"}, nil, nil)
				if err != nil {
					return err
				}
				creds = credentials.NewTLS(id.ClientTLS(pki.KindWorker, ""))
			} else if !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cluster CA: %w", err)
			}
			results := make([]error, len(addrs))
			replies := make([]*briskv1.ImportImageReply, len(addrs))
			var wg sync.WaitGroup
			sem := make(chan struct{}, 4) // workers unpack in parallel; the sender's disk is read 4 times at once at most
			for i, addr := range addrs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					replies[i], results[i] = pushArchive(c.Context(), addr, path, creds)
				}()
			}
			wg.Wait()
			var failed []error
			for i, addr := range addrs {
				if results[i] != nil {
					fmt.Fprintf(c.ErrOrStderr(), "%s: %v\n", addr, results[i])
					failed = append(failed, results[i])
					continue
				}
				fmt.Fprintf(c.OutOrStdout(), "%s (node %s): imported %s\n", addr, replies[i].GetNodeId(), strings.Join(replies[i].GetRefs(), ", "))
			}
			if len(failed) > 0 {
				return fmt.Errorf("%d of %d workers did not import %s (%s)", len(failed), len(addrs), path, formatBytes(st.Size()))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&toWorkers, "to-workers", false, "send the archive to every worker of the cluster")
	c.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "brisk's data directory, where 'image build' wrote NAME's archive, and (on a control-plane host) the cluster CA the push authenticates to workers with")
	return c
}

// pushChunk is the size of one ImageChunk; the worker's gRPC limit is 64 MiB.
const pushChunk = 1 << 20

// pushArchive streams the archive at path to the worker at addr.
func pushArchive(ctx context.Context, addr, path string, creds credentials.TransportCredentials) (*briskv1.ImportImageReply, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	conn, err := rpc.Dial(addr, creds)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stream, err := briskv1.NewWorkerClient(conn).ImportImage(ctx)
	if err != nil {
		return nil, err
	}
	for {
		buf := make([]byte, pushChunk) // gRPC may hold on to a sent message
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			if err := stream.Send(&briskv1.ImageChunk{Data: buf[:n]}); err != nil {
				// The worker ended the call; CloseAndRecv has its reason.
				_, err = stream.CloseAndRecv()
				return nil, err
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return nil, rerr
		}
	}
	return stream.CloseAndRecv()
}

func archivePath(dataDir, name string) string {
	if strings.HasSuffix(name, ".tar") {
		return name
	}
	return filepath.Join(dataDir, "images", name+".tar")
}

// formatBytes prints a size for humans.
func formatBytes(n int64) string {
	if n < 1<<20 {
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n>>20, 10) + " MiB"
}

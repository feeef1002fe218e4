package cli

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/compat/dirigent"
	"github.com/brisk-faas/brisk/internal/compat/openfaas"
	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/controlplane/replica"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/local"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtimes"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// cpFlags are the control plane's flags, shared by `up` and `controlplane`.
type cpFlags struct {
	dataDir, admin, grpc, placement string
	scalingMode, keepAlivePolicy    string
	loadBalancing                   string
	tick, drainDelay, nodeGrace     time.Duration
	startupGrace                    time.Duration
	caps                            spec.Caps
	noAuth                          bool
	noTLS                           bool
	tlsSANs                         []string
	adminTLS                        httpTLSFlags
	tlsGenerate                     bool
	dirigent, dirigentImages        string
	dirigentKeepAlive               time.Duration
	triggerNATSAllow                []string
	templateFraction                float64
}

func (f *cpFlags) register(c *cobra.Command) {
	fl := c.Flags()
	fl.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "directory for the durable registry (and worker state under `up`)")
	fl.StringVar(&f.admin, "admin", "127.0.0.1:9090", "admin HTTP/JSON API listen address")
	fl.StringVar(&f.grpc, "grpc", "127.0.0.1:9091", "gRPC listen address for workers and data planes")
	fl.StringVar(&f.dirigent, "dirigent-registration", "", "also serve Dirigent's registration contract on this address (the InVitro loader's form POST: give it DirigentControlPlaneIP user:TOKEN@ADDR; docs/compatibility.md); off by default")
	fl.DurationVar(&f.dirigentKeepAlive, "dirigent-keep-alive", 0, "how long an idle sandbox of a function registered through --dirigent-registration lives, under the ttl keep-alive policy (default 0: the cluster's --keep-alive-policy, gd, which keeps idle sandboxes up to 15 min while no call needs their room); for the loader's RPS cold starts, below its RpsCooldownSeconds")
	fl.StringVar(&f.dirigentImages, "dirigent-images", dirigent.ImagesTrace, "what an image registered through --dirigent-registration runs as: trace (the built-in trace function) or keep (the image itself)")
	fl.StringVar(&f.placement, "placement", "kubernetes", "default placement policy of functions whose spec names none: "+strings.Join(spec.Placements, ", ")+" (docs/policies.md)")
	fl.StringVar(&f.keepAlivePolicy, "keep-alive-policy", spec.KeepAliveGD, "default keep-alive policy of functions whose spec names none: gd (idle sandboxes stay 15 min, or the spec's keep_alive, unless a new sandbox needs their room first: FaasCache's Greedy-Dual eviction) or ttl (Knative: idle sandboxes leave after the stable window and the scale-to-zero grace, 90 s) or hybrid (Azure's hybrid histogram policy: per function, from its idle times, unloaded after a call and pre-warmed before the next is due; gd's 15 min until its histogram says)")
	fl.Float64Var(&f.templateFraction, "template-fraction", 1, "the fraction of the workers that make each function from source's template when it is deployed, chosen per function by rendezvous hashing (the others make one at their first sandbox of it; --placement locality prefers the nodes that hold one; brisk sim --template-fraction measures the trade-off): (0,1]")
	fl.StringVar(&f.loadBalancing, "load-balancing", "least-loaded", "default data-plane policy (a call's choice of sandbox) of functions whose spec names none: "+strings.Join(spec.LoadBalancers, ", "))
	fl.StringVar(&f.scalingMode, "scaling-mode", spec.ModeAsync, "default scaling mode of functions whose spec names none: async (calls wait for regular sandboxes, Knative), sync (Lambda-like: a sandbox per waiting call at once, the peak kept for the keep-alive) or dual (a call finding no free sandbox is served at once by a one-shot emergency sandbox, PulseNet)")
	fl.DurationVar(&f.tick, "autoscale-interval", 2*time.Second, "autoscaler decision period")
	fl.DurationVar(&f.drainDelay, "drain-delay", 500*time.Millisecond, "time between withdrawing a sandbox from data planes and terminating it; longer while a data plane reports calls still running in it (up to the function's timeout)")
	fl.DurationVar(&f.nodeGrace, "node-grace", 10*time.Second, "how long an unreachable worker keeps its sandboxes before they are replaced")
	fl.DurationVar(&f.startupGrace, "startup-grace", 5*time.Second, "after a restart, how long to wait for known workers before placing sandboxes")
	fl.BoolVar(&f.noAuth, "insecure-no-auth", false, "serve the admin API without tokens (only behind a proxy that authenticates; default: every route but /healthz and the dashboard page /ui/ needs a token, and the first start writes an admin token to <data-dir>/admin.token)")
	fl.BoolVar(&f.noTLS, "insecure-no-tls", false, "serve gRPC to workers and data planes in plaintext, with no certificates (debugging only: anyone who reaches the gRPC port can then join as a worker and receive calls; default: a cluster CA in <data-dir> and a join token in <data-dir>/join.token)")
	fl.StringSliceVar(&f.tlsSANs, "tls-san", nil, "extra host names or IP addresses for the gRPC server's certificate and the certificates --tls-generate issues (repeatable)")
	f.adminTLS.register(c, "", "the admin API")
	fl.BoolVar(&f.tlsGenerate, "tls-generate", false, "serve the admin API (under brisk up, the invoke listener too) over HTTPS with a certificate issued at start from the cluster CA (SANs localhost, 127.0.0.1, ::1, the listen host, --tls-san); clients trust <data-dir>/ca.crt (--ca-cert, BRISK_CA_CERT)")
	fl.StringSliceVar(&f.triggerNATSAllow, "trigger-nats-allow", nil, "address ranges (CIDR) the external NATS servers of triggers may be at besides public addresses; loopback, private, link-local and the like are refused unless listed, e.g. 10.0.0.0/8")
	d := spec.DefaultCaps()
	fl.IntVar(&f.caps.MaxScale, "max-scale", d.MaxScale, "the most sandboxes one function may have (scaling.min/max; also bounds an unbounded max)")
	fl.IntVar(&f.caps.MaxConcurrency, "max-concurrency", d.MaxConcurrency, "the highest per-sandbox concurrency a spec may ask for")
	fl.Int64Var(&f.caps.MaxMilliCPU, "max-cpu", d.MaxMilliCPU, "the most CPU (millicores) one sandbox may request or be limited to")
	fl.Int64Var(&f.caps.MaxMemoryMB, "max-memory", d.MaxMemoryMB, "the most memory (MiB) one sandbox may request or be limited to")
	fl.IntVar(&f.caps.MaxQueueDepth, "max-queue-depth", d.MaxQueueDepth, "the deepest per-function queue a spec may ask for")
	fl.DurationVar(&f.caps.MaxQueueTimeout, "max-queue-timeout", d.MaxQueueTimeout, "the longest queue timeout a spec may ask for; functions registered through --dirigent-registration get it (Dirigent holds a call until its client gives up)")
	fl.DurationVar(&f.caps.MaxTimeout, "max-timeout", d.MaxTimeout, "the longest function timeout a spec may ask for")
}

func (f *cpFlags) config(g *globals) (controlplane.Config, error) {
	log, err := g.logger()
	if err != nil {
		return controlplane.Config{}, err
	}
	if f.tick <= 0 || f.drainDelay < 0 || f.nodeGrace <= 0 || f.startupGrace <= 0 {
		return controlplane.Config{}, usageError{fmt.Errorf("--autoscale-interval, --node-grace and --startup-grace must be positive, --drain-delay not negative")}
	}
	if c := f.caps; c.MaxScale < 1 || c.MaxConcurrency < 1 || c.MaxMilliCPU < 1 || c.MaxMemoryMB < 1 || c.MaxQueueDepth < 1 || c.MaxQueueTimeout <= 0 || c.MaxTimeout <= 0 {
		return controlplane.Config{}, usageError{fmt.Errorf("--max-scale, --max-concurrency, --max-cpu, --max-memory, --max-queue-depth, --max-queue-timeout and --max-timeout must be positive")}
	}
	adminTLS, err := f.adminTLS.config()
	if err != nil {
		return controlplane.Config{}, err
	}
	if adminTLS != nil && f.tlsGenerate {
		return controlplane.Config{}, usageError{errors.New("--tls-generate or --tls-cert/--tls-key, not both")}
	}
	if f.tlsGenerate && f.noTLS {
		return controlplane.Config{}, usageError{errors.New("--tls-generate issues certificates from the cluster CA, which --insecure-no-tls turns off")}
	}
	if !slices.Contains(spec.ScalingModes, f.scalingMode) {
		return controlplane.Config{}, usageError{fmt.Errorf("--scaling-mode %q: want one of %v", f.scalingMode, spec.ScalingModes)}
	}
	if !slices.Contains(spec.Placements, f.placement) {
		return controlplane.Config{}, usageError{fmt.Errorf("--placement %q: want one of %v", f.placement, spec.Placements)}
	}
	if !slices.Contains(spec.LoadBalancers, f.loadBalancing) {
		return controlplane.Config{}, usageError{fmt.Errorf("--load-balancing %q: want one of %v", f.loadBalancing, spec.LoadBalancers)}
	}
	if !slices.Contains(spec.KeepAlivePolicies, f.keepAlivePolicy) {
		return controlplane.Config{}, usageError{fmt.Errorf("--keep-alive-policy %q: want one of %v", f.keepAlivePolicy, spec.KeepAlivePolicies)}
	}
	if f.dirigentImages != dirigent.ImagesTrace && f.dirigentImages != dirigent.ImagesKeep {
		return controlplane.Config{}, usageError{fmt.Errorf("--dirigent-images %q: want trace or keep", f.dirigentImages)}
	}
	natsAllow, err := parseCIDRs("--trigger-nats-allow", f.triggerNATSAllow)
	if err != nil {
		return controlplane.Config{}, err
	}
	if !(f.templateFraction > 0 && f.templateFraction <= 1) {
		return controlplane.Config{}, usageError{fmt.Errorf("--template-fraction %v: want a fraction in (0,1]", f.templateFraction)}
	}
	return controlplane.Config{DataDir: f.dataDir, AdminAddr: f.admin, GRPCAddr: f.grpc, Placement: f.placement, ScalingMode: f.scalingMode, KeepAlivePolicy: f.keepAlivePolicy, LoadBalancing: f.loadBalancing, TemplateFraction: f.templateFraction,
		DirigentAddr: f.dirigent, DirigentImages: f.dirigentImages, DirigentKeepAlive: f.dirigentKeepAlive,
		TickInterval: f.tick, DrainDelay: f.drainDelay, NodeGrace: f.nodeGrace, StartupGrace: f.startupGrace,
		Caps: f.caps, AuthDisabled: f.noAuth, TLSSANs: f.tlsSANs, AdminTLS: adminTLS, TriggerNATSAllow: natsAllow, Logger: log.With("component", "controlplane")}, nil
}

// loadCA gives cfg the cluster CA (none with --insecure-no-tls), creating
// it unless mustExist.
func (f *cpFlags) loadCA(cfg *controlplane.Config, mustExist bool) error {
	if f.noTLS {
		return nil
	}
	var ca *pki.CA
	var err error
	if mustExist {
		ca, err = pki.LoadCA(f.dataDir)
		if errors.Is(err, os.ErrNotExist) {
			return usageError{fmt.Errorf("no cluster CA in %s: the replicas of an HA control plane share one; create it once with 'brisk ca init --data-dir DIR' and copy ca.crt and ca.key into every replica's --data-dir (or run with --insecure-no-tls)", f.dataDir)}
		}
	} else {
		var created bool
		ca, created, err = pki.LoadOrCreateCA(f.dataDir)
		if created {
			fmt.Fprintf(os.Stderr, "created the cluster CA in %s\n", filepath.Join(f.dataDir, pki.CACertFile))
		}
	}
	if err != nil {
		return fmt.Errorf("cluster CA: %w", err)
	}
	fmt.Fprintf(os.Stderr, "cluster CA pin: %s (workers and data planes join with --join-token from %s and --ca-pin or --ca-cert %s)\n",
		ca.Pin(), filepath.Join(f.dataDir, pki.JoinTokenFile), filepath.Join(f.dataDir, pki.CACertFile))
	cfg.CA = ca
	return nil
}

// generateAdminTLS gives cfg the admin API's certificate with
// --tls-generate, issued from cfg.CA (loadCA has set it).
func (f *cpFlags) generateAdminTLS(cfg *controlplane.Config) error {
	if !f.tlsGenerate || cfg.AdminTLS != nil {
		return nil
	}
	t, err := generateTLS(cfg.CA, "admin API", cfg.AdminAddr, f.tlsSANs)
	if err != nil {
		return err
	}
	cfg.AdminTLS = t
	return nil
}

func defaultDataDir() string { return client.DefaultDataDir() }

// wkFlags are the worker's flags, shared by `up` and `worker`.
type wkFlags struct {
	listen, advertise, nodeID, rt, stateDir string
	sandboxHost                             string
	emergencyRT                             string
	sandboxUser                             string
	python, node                            string
	templates                               bool
	maxTemplates                            int
	emulate                                 int
	createDelay                             time.Duration
	cpu                                     string
	cpuOvercommit                           float64
	memoryMB, maxSandboxes                  int64
	emergencySlots                          int
	stopOnExit                              bool
	ctr                                     ctrFlags // --runtime containerd
	kubeconfig, kubeNamespace, kubePlace    string   // --runtime kube
	kubeNodes, kubeKeyPrefixes              []string
}

// isolationOf says what a runtime isolates, for brisk up's banner: whether
// tenants' sandboxes are kept from each other (docs/security.md).
func isolationOf(rt string) string {
	switch rt {
	case "native", "containerd":
		return rt + " (each sandbox in its own network, mount and PID namespaces and cgroup: tenants are isolated from each other)"
	case "kube":
		return "kube (sandboxes are Pods: isolation is the kubelet's runtime's)"
	case "emulated":
		return "emulated (no real sandboxes: for scale tests)"
	}
	return rt + " (host processes, one user per function: tenants share the host's files and network; for isolation between tenants use --runtime native or containerd: docs/security.md)"
}

func (f *wkFlags) register(c *cobra.Command, standalone bool) {
	fl := c.Flags()
	host, _ := os.Hostname()
	fl.StringVar(&f.rt, "runtime", "process", "sandbox runtime: process, emulated, containerd, native or kube (--emulate implies emulated)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "with --runtime kube: kubeconfig of the kube-apiserver the Pods are created through (default: the in-cluster service account, else $KUBECONFIG or ~/.kube/config)")
	fl.StringVar(&f.kubeNamespace, "kube-namespace", "default", "with --runtime kube: namespace of the functions' Pods")
	fl.StringSliceVar(&f.kubeNodes, "kube-nodes", nil, "with --runtime kube: Kubernetes nodes this process stands for, one worker node each, Pods bound to them directly (default: the one node --node-id, or the host name); with --kube-placement scheduler, the nodes the scheduler may use (default: any)")
	fl.StringSliceVar(&f.kubeKeyPrefixes, "kube-key-prefixes", nil, "with --runtime kube: label and annotation key prefixes (e.g. example.com) a function's own labels and annotations may carry onto its Pods; unprefixed keys always go, others only when listed (they are what the cluster's integrations act on); brisk.dev and Kubernetes' domains never")
	fl.StringVar(&f.kubePlace, "kube-placement", "brisk", "with --runtime kube: who places the Pods: brisk (bound to the worker node's Kubernetes node by brisk's placer) or scheduler (one worker node stands for --kube-nodes or the cluster, the Kubernetes scheduler places its Pods; --cpu, --memory and --max-sandboxes default to the nodes' allocatable sums)")
	fl.IntVar(&f.emulate, "emulate", 1, "with --runtime emulated: number of emulated worker nodes hosted by this process")
	fl.DurationVar(&f.createDelay, "create-delay", 40*time.Millisecond, "with --runtime emulated: sandbox creation delay")
	fl.StringVar(&f.cpu, "cpu", "", "CPU capacity offered per node, e.g. 2 or 1500m (default: all cores)")
	fl.Float64Var(&f.cpuOvercommit, "cpu-overcommit", runtimes.DefaultCPUOvercommit, "how many times --cpu the CPU requests of a node's sandboxes may add up to (1 = none): most FaaS sandboxes sit idle, and memory stays the hard limit; not with --runtime kube, whose kubelet admits Pods by their real requests")
	fl.Int64Var(&f.maxSandboxes, "max-sandboxes", 0, "sandbox limit per node (0 = none)")
	fl.IntVar(&f.emergencySlots, "emergency-slots", 0, "one-shot emergency sandboxes per node for dual-mode functions (0 = the runtime's default: 2 per core with --runtime native or --emergency-runtime native, none otherwise; -1 = none); with --runtime kube, this host's, split over the nodes the process stands for")
	fl.StringVar(&f.emergencyRT, "emergency-runtime", "", "runtime of the emergency track: native beside --runtime containerd or kube (regular sandboxes in containerd or as Pods, one-shot emergency ones from this host's native runtime's pooled shells, as PulseNet pairs them); default: the node's runtime")
	fl.StringVar(&f.python, "python", lang.DefaultPython, "interpreter of functions deployed from Python source (fn deploy --lang python), with --runtime process or native, and the one the containerd runtime builds its Python base image from")
	fl.BoolVar(&f.templates, "templates", true, "with --runtime process or native: start sandboxes of functions deployed from source from per-revision templates that have loaded them: Python sandboxes fork from one, a Node sandbox takes over a started standby (docs/languages.md); =false starts each fresh")
	fl.IntVar(&f.maxTemplates, "max-templates", 16, "with --templates: the most templates a node keeps (the lowest Greedy-Dual priority first out: forks × load time ÷ memory; each holds a function's imported interpreter, 15–30 MiB for a typical one)")
	fl.StringVar(&f.node, "node", lang.DefaultNode, "interpreter of functions deployed from Node source (fn deploy --lang node), with --runtime process or native, and the one the containerd runtime builds its Node base image from (looked up in PATH)")
	fl.StringVar(&f.sandboxUser, "sandbox-user", "", "with --runtime process (and native, for functions without an image): one user every sandbox runs as, a name, uid or uid:gid (default as root: on process a user of each function's own, with a loopback guard between functions; on native nobody; else this user; only root can choose another); sandboxes always get a clean environment and no_new_privs")
	f.ctr.register(c)
	if standalone {
		fl.StringVar(&f.listen, "listen", "127.0.0.1:0", "gRPC listen address of the worker")
		fl.StringVar(&f.advertise, "advertise", "", "address the control plane dials (default: the bound listen address)")
		fl.StringVar(&f.sandboxHost, "sandbox-host", "", "with --runtime process or emulated: this host's IP address the sandboxes listen on and data planes dial (default: process 127.0.0.1, so only a data plane on this host reaches them; emulated the --listen address); sandboxes take no tokens, so give an address of a network only the data planes reach (docs/runtimes.md)")
		fl.StringVar(&f.nodeID, "node-id", host, "node id (with --emulate N, a prefix)")
		fl.StringVar(&f.stateDir, "state-dir", filepath.Join(defaultDataDir(), "worker"), "directory for sandbox state and logs")
		fl.BoolVar(&f.stopOnExit, "stop-on-exit", false, "kill all sandboxes when the worker exits (default: keep them for a restarted worker to adopt)")
	}
}

// options turns the flags into worker options.
func (f *wkFlags) options(c *cobra.Command) (runtimes.Workers, error) {
	// --emulate N alone means the emulated runtime.
	if c.Flags().Changed("emulate") && !c.Flags().Changed("runtime") {
		f.rt = "emulated"
	}
	capacity, err := nodeCapacity(f.cpu, f.memoryMB)
	if err != nil {
		return runtimes.Workers{}, err
	}
	if !(f.cpuOvercommit >= 1 && f.cpuOvercommit <= runtimes.MaxCPUOvercommit) {
		return runtimes.Workers{}, usageError{fmt.Errorf("--cpu-overcommit %v: want a factor from 1 (none) to %d", f.cpuOvercommit, runtimes.MaxCPUOvercommit)}
	}
	if f.rt == "kube" && c.Flags().Changed("cpu-overcommit") && f.cpuOvercommit != 1 {
		return runtimes.Workers{}, usageError{fmt.Errorf("--cpu-overcommit does not apply to --runtime kube: the kubelet admits Pods by their real requests")}
	}
	if f.rt == "process" && f.emulate != 1 {
		return runtimes.Workers{}, usageError{fmt.Errorf("--emulate needs --runtime emulated")}
	}
	if f.sandboxHost != "" && f.rt != "process" && f.rt != "emulated" {
		return runtimes.Workers{}, usageError{fmt.Errorf("--sandbox-host needs --runtime process or emulated (native and containerd sandboxes have addresses of their own network)")}
	}
	if ip := net.ParseIP(f.sandboxHost); f.sandboxHost != "" && (ip == nil || ip.IsUnspecified()) {
		return runtimes.Workers{}, usageError{fmt.Errorf("--sandbox-host %q: want one IP address of this host", f.sandboxHost)}
	}
	if err := runtimes.CheckEmergencyRuntime(f.rt, f.emergencyRT); err != nil {
		return runtimes.Workers{}, usageError{err}
	}
	w := runtimes.Workers{Runtime: f.rt, Nodes: f.emulate, NodeID: f.nodeID, CreateDelay: f.createDelay, StateDir: f.stateDir,
		Capacity: capacity, CPUOvercommit: f.cpuOvercommit, MaxSandboxes: int(f.maxSandboxes), Listen: f.listen, Advertise: f.advertise, SandboxHost: f.sandboxHost, StopOnExit: f.stopOnExit,
		SandboxUser: f.sandboxUser, EmergencySlots: f.emergencySlots, EmergencyRuntime: f.emergencyRT, Python: f.python, Node: f.node, NoTemplates: !f.templates, MaxTemplates: f.maxTemplates}
	if f.rt == "kube" {
		if f.kubePlace != "brisk" && f.kubePlace != "scheduler" {
			return runtimes.Workers{}, usageError{fmt.Errorf("--kube-placement %q: want brisk or scheduler", f.kubePlace)}
		}
		w.Kube = runtimes.KubeWorkers{Kubeconfig: f.kubeconfig, Namespace: f.kubeNamespace, Nodes: f.kubeNodes, Placement: f.kubePlace, KeyPrefixes: f.kubeKeyPrefixes}
	} else if c.Flags().Changed("kubeconfig") || c.Flags().Changed("kube-nodes") || c.Flags().Changed("kube-namespace") || c.Flags().Changed("kube-placement") || c.Flags().Changed("kube-key-prefixes") {
		return runtimes.Workers{}, usageError{fmt.Errorf("--kubeconfig, --kube-namespace, --kube-nodes, --kube-placement and --kube-key-prefixes need --runtime kube")}
	}
	return w, f.ctr.apply(&w)
}

// nodeCapacity parses --cpu/--memory; zero means the whole machine.
func nodeCapacity(cpu string, memMB int64) (spec.Resources, error) {
	var r spec.Resources
	if cpu != "" {
		var err error
		if strings.HasSuffix(cpu, "m") {
			r.MilliCPU, err = strconv.ParseInt(strings.TrimSuffix(cpu, "m"), 10, 64)
		} else {
			var v float64
			v, err = strconv.ParseFloat(cpu, 64)
			r.MilliCPU = int64(v * 1000)
		}
		if err != nil || r.MilliCPU <= 0 {
			return r, usageError{fmt.Errorf("--cpu %q: want a positive number of cores (2, 0.5) or millicores (500m)", cpu)}
		}
	}
	if memMB < 0 {
		return r, usageError{fmt.Errorf("--memory %d must not be negative", memMB)}
	}
	r.MemoryMB = memMB
	return r, nil
}

func usageOr(err error) error {
	if errors.Is(err, runtimes.ErrUsage) {
		return usageError{err}
	}
	return err
}

func newControlPlane(g *globals) *cobra.Command {
	f := &cpFlags{}
	var af asyncFlags
	var id, peers, adminTokenFile, joinTokenFile, deployTokenFile string
	c := &cobra.Command{
		Use:   "controlplane",
		Short: "Run a control plane (registry, autoscaler, placer, admin API), alone or as one of 3 or 5 replicas",
		Long: `Run a control plane: the durable function registry, the autoscaler, the placer,
the worker links and the admin API.

Alone (the default) it keeps its registry in a bbolt file in --data-dir.

With --peers it is one replica of a highly available control plane: the
registry is replicated with raft (hashicorp/raft, log in bbolt under
--data-dir), one replica leads and serves, the others proxy admin calls to it
and point workers and data planes at it. When the leader dies another replica
takes over within about a second and rebuilds the sandbox state from the
workers. --peers lists every replica as id=raft|admin|grpc, e.g.

  brisk controlplane --id cp1 --data-dir /var/lib/brisk/cp1 \
    --peers 'cp1=10.0.0.1:7100|10.0.0.1:9090|10.0.0.1:9091,cp2=10.0.0.2:7100|10.0.0.2:9090|10.0.0.2:9091,cp3=...'

--admin and --grpc are then taken from this replica's entry. Workers and data
planes take every replica's gRPC address: --controlplane a:9091,b:9091,c:9091.

gRPC is TLS with certificates of a cluster CA (docs/security.md "Component
identity"). Alone, the first start creates the CA in --data-dir (ca.crt,
ca.key) and a join token (join.token): workers and data planes join with
--join-token and --ca-cert (or --ca-pin, printed at start). Replicas share
one CA: create it once with 'brisk ca init' and copy ca.crt and ca.key into
every replica's --data-dir before the first start.

The admin API is plain HTTP unless given a certificate (--tls-cert and
--tls-key) or told to issue itself one from the cluster CA at every start
(--tls-generate; SANs: localhost, 127.0.0.1, ::1, the --admin host and
--tls-san). Clients then trust <data-dir>/ca.crt: brisk --ca-cert FILE or
BRISK_CA_CERT.

Triggers (brisk trigger) queue their calls in the asynchronous queue: give
the control plane the data planes' --nats flags, or triggers are refused.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := f.config(g)
			if err != nil {
				return err
			}
			q, closeQueue, err := af.open(c.Context(), "", cfg.Logger.With("component", "async"))
			if err != nil {
				return err
			}
			defer closeQueue()
			cfg.Async = q
			for _, t := range []struct {
				flag, path string
				dst        *string
			}{{"--bootstrap-admin-token-file", adminTokenFile, &cfg.BootstrapAdminToken}, {"--bootstrap-join-token-file", joinTokenFile, &cfg.BootstrapJoinToken},
				{"--bootstrap-deploy-token-file", deployTokenFile, &cfg.BootstrapDeployToken}} {
				if t.path == "" {
					continue
				}
				if *t.dst, err = pki.ReadSecretFile(t.path); err != nil {
					return usageError{fmt.Errorf("%s: %w", t.flag, err)}
				}
			}
			if peers == "" {
				if id != "" {
					return usageError{errors.New("--id needs --peers")}
				}
				if err := f.loadCA(&cfg, false); err != nil {
					return err
				}
				if err := f.generateAdminTLS(&cfg); err != nil {
					return err
				}
				cp, err := controlplane.New(cfg)
				if err != nil {
					return err
				}
				return cp.Run(c.Context())
			}
			list, err := replica.ParsePeers(peers)
			if err != nil {
				return usageError{fmt.Errorf("--peers: %w", err)}
			}
			var self *replica.Peer
			for i := range list {
				if list[i].ID == id {
					self = &list[i]
				}
			}
			if self == nil {
				return usageError{fmt.Errorf("--id %q is not one of --peers", id)}
			}
			if c.Flags().Changed("admin") || c.Flags().Changed("grpc") {
				return usageError{errors.New("with --peers, the admin and gRPC addresses come from this replica's --peers entry: drop --admin and --grpc")}
			}
			cfg.AdminAddr, cfg.GRPCAddr = self.AdminAddr, self.GRPCAddr
			if err := f.loadCA(&cfg, true); err != nil {
				return err
			}
			if err := f.generateAdminTLS(&cfg); err != nil {
				return err
			}
			rcfg := replica.Config{ID: id, Peers: list, Dir: filepath.Join(f.dataDir, "raft"), Logger: cfg.Logger}
			if cfg.CA != nil {
				// Raft between replicas under the cluster CA too: only
				// control planes may replicate the registry.
				ident, err := cfg.CA.Issue(pki.KindControlPlane, []string{id}, nil, nil)
				if err != nil {
					return err
				}
				rcfg.TLS = &replica.Identity{Server: ident.ServerTLS(true, pki.KindControlPlane), Client: ident.ClientTLS(pki.KindControlPlane, "")}
			}
			reg, err := replica.Open(rcfg)
			if err != nil {
				return err
			}
			defer reg.Close()
			return controlplane.RunReplica(c.Context(), cfg, reg, list)
		},
	}
	f.register(c)
	af.register(c, false)
	withConfigFile(c)
	c.Flags().StringVar(&id, "id", "", "this replica's id in --peers")
	c.Flags().StringVar(&peers, "peers", "", "every replica of an HA control plane: id=raft|admin|grpc,... (empty: run alone)")
	c.Flags().StringVar(&adminTokenFile, "bootstrap-admin-token-file", "", "file holding the first admin token, made elsewhere (brisk k8s install puts it in a Secret): registered when the registry has no token, instead of making one into <data-dir>/admin.token")
	c.Flags().StringVar(&joinTokenFile, "bootstrap-join-token-file", "", "file holding the cluster's first join token, made elsewhere: registered when the registry has no join token, instead of making one into <data-dir>/join.token")
	c.Flags().StringVar(&deployTokenFile, "bootstrap-deploy-token-file", "", "file holding a deploy token made elsewhere (brisk k8s install's, for the Function controller): registered as bootstrap-deploy while the registry is unused and has no token of that name")
	return c
}

func newDataPlane(g *globals) *cobra.Command {
	var id, listen, cpAddr, stateDir string
	var jf joinFlags
	var userTLS httpTLSFlags
	var genTLS genTLSFlags
	var maxConns int
	var bodyBuffer, bodyTotal, minRate int64
	var emPct float64
	var af asyncFlags
	var tf traceFlags
	var systemAPI string
	c := &cobra.Command{
		Use:   "dataplane",
		Short: "Run a data plane (invocation proxy, queues, load balancing)",
		Long: `Run a data plane: the invocation proxy, the per-function queues and load
balancing. It joins the cluster with --join-token and --ca-cert or --ca-pin
(docs/security.md "Component identity").

Invocations are plain HTTP/1.1 and h2c on --invoke, or HTTPS (HTTP/1.1 only,
TLS 1.2 or later; no h2) with --tls-cert and --tls-key, or with
--tls-generate, which issues a certificate from the cluster CA at start and
so needs its key (--tls-ca-dir: run it on the control plane's host).

Asynchronous calls (/async-function/NAME, Prefer: respond-async, /v1/calls)
need --nats: a NATS server with JetStream shared by every data plane
(brisk nats, or a NATS cluster with --nats-replicas 3).`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			if maxConns < 1 {
				return usageError{fmt.Errorf("--max-connections %d: must be positive", maxConns)}
			}
			if bodyBuffer < 0 || bodyTotal < 0 || minRate < 1 {
				return usageError{fmt.Errorf("--body-buffer %d, --body-buffer-total %d and --min-body-rate %d: must not be negative (the rate at least 1)", bodyBuffer, bodyTotal, minRate)}
			}
			if emPct <= 0 || emPct > 100 {
				return usageError{fmt.Errorf("--emergency-percentile %g: want (0, 100]", emPct)}
			}
			if stateDir == "" {
				stateDir = filepath.Join(defaultDataDir(), "dataplane", id)
			}
			join, err := jf.joiner(cpAddr, stateDir)
			if err != nil {
				return err
			}
			if join != nil {
				join.Logger = log.With("component", "dataplane")
			}
			invokeTLS, err := genTLS.config(&userTLS, "invoke listener", listen)
			if err != nil {
				return err
			}
			q, closeQueue, err := af.open(c.Context(), "", log.With("component", "async"))
			if err != nil {
				return err
			}
			defer closeQueue()
			var system http.Handler
			if systemAPI != "" {
				hc := &http.Client{Timeout: time.Minute}
				if g.caCert != "" {
					cl := client.New(systemAPI, "")
					if err := cl.TrustCAFile(g.caCert); err != nil {
						return usageError{err}
					}
					hc = cl.HTTP
				}
				system = openfaas.New(client.New(systemAPI, "").Admin, hc, local.BuildInfo())
			}
			tracer, flush, err := tf.tracer(c.Context(), "brisk-dataplane")
			if err != nil {
				return err
			}
			defer flush()
			dp, err := dataplane.New(dataplane.Config{ID: id, Listen: listen, TLS: invokeTLS, ControlPlane: cpAddr, MaxConnections: maxConns, Join: join,
				BodyBufferBytes: bodyBuffer, BodyBufferTotal: bodyTotal, MinBodyRate: minRate, EmergencyPercentile: emPct,
				Async: q, System: system, Tracer: tracer, Logger: log.With("component", "dataplane")})
			if err != nil {
				return err
			}
			return dp.Run(c.Context())
		},
	}
	host, _ := os.Hostname()
	c.Flags().StringVar(&id, "id", host, "data plane id")
	c.Flags().StringVar(&listen, "invoke", "127.0.0.1:8080", "invocation HTTP listen address (HTTP/1.1 and h2c; over TLS, HTTP/1.1 only)")
	userTLS.register(c, "", "invocations")
	genTLS.register(c, "invocations")
	c.Flags().StringVar(&cpAddr, "controlplane", "127.0.0.1:9091", "control plane gRPC address; every replica's, comma-separated, for an HA control plane")
	c.Flags().StringVar(&stateDir, "state-dir", "", "directory for the data plane's key and certificate (default <data dir>/dataplane/<id>)")
	jf.register(c)
	c.Flags().IntVar(&maxConns, "max-connections", dataplane.DefaultMaxConnections, "client connections open at once; more are closed as they are accepted")
	c.Flags().Int64Var(&bodyBuffer, "body-buffer", 0, "bytes of a request body read before the call takes a sandbox slot (0: the whole body, up to the 6 MiB limit)")
	c.Flags().Int64Var(&bodyTotal, "body-buffer-total", dataplane.DefaultBodyBufferTotal, "bytes all buffered request bodies may hold at once; past it, bodies stream")
	c.Flags().Float64Var(&emPct, "emergency-percentile", 50, "dual track's metric filter: a call served by an emergency sandbox counts toward regular scaling only if the function's keep-alive exceeds this percentile of its inter-arrival times over the last hour (PulseNet: 50)")
	c.Flags().Int64Var(&minRate, "min-body-rate", dataplane.DefaultMinBodyRate, "bytes/s a streamed request body must keep up (after 2 s); slower clients get 408")
	af.register(c, false)
	tf.register(c)
	c.Flags().StringVar(&systemAPI, "openfaas-admin", "", "serve the OpenFaaS management API (/system/..., for faas-cli) on the invoke listener, forwarding each request with its caller's credentials to this admin API URL (https: trusts --ca-cert)")
	return c
}

func newWorker(g *globals) *cobra.Command {
	f := &wkFlags{}
	var cpAddr string
	var jf joinFlags
	c := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker daemon (sandbox runtime, readiness probes, heartbeats)",
		Args:  exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			opts, err := f.options(c)
			if err != nil {
				return err
			}
			// The key and certificate live beside the sandbox state.
			if opts.Join, err = jf.joiner(cpAddr, filepath.Join(f.stateDir, "identity")); err != nil {
				return err
			}
			d, host, err := runtimes.BuildWorker(opts, cpAddr, log)
			if err != nil {
				return usageOr(err)
			}
			return runtimes.RunWorker(c.Context(), d, host)
		},
	}
	f.register(c, true)
	c.Flags().StringVar(&cpAddr, "controlplane", "127.0.0.1:9091", "control plane gRPC address; every replica's, comma-separated, for an HA control plane")
	jf.register(c)
	return c
}

func newUp(g *globals) *cobra.Command {
	cf := &cpFlags{}
	wf := &wkFlags{}
	var invoke string
	var invokeTLS httpTLSFlags
	var af asyncFlags
	var tf traceFlags
	c := &cobra.Command{
		Use:   "up",
		Short: "Run a whole cluster on this machine: control plane, data plane and worker",
		Long: `Run a whole cluster in one process on embedded defaults: a control plane
(admin API on --admin), a data plane (invocations on --invoke) and a worker
using the process runtime (or --runtime emulated, containerd or native). State
lives in --data-dir.
The components talk gRPC over TLS with certificates of the cluster CA the
first start creates in --data-dir; nothing needs joining.

The control plane serves a live web dashboard at /ui/ on the admin address
(brisk ui prints its address with your token).

Every admin route and every call of a function not deployed --public needs
an API token: the first start writes an admin token to
<data-dir>/admin.token (mode 0600), which the CLI reads (--token-file);
brisk token create makes more. --insecure-no-auth turns tokens off.

The admin API and the invoke listener are plain HTTP unless given TLS:
--tls-generate issues both a certificate from the cluster CA at every start
(SANs localhost, 127.0.0.1, ::1, the listen host and --tls-san; clients
trust <data-dir>/ca.crt: brisk --ca-cert or BRISK_CA_CERT); --tls-cert and
--tls-key serve the admin API with your certificate, --invoke-tls-cert and
--invoke-tls-key the invoke listener (a listener without one of its own
gets the generated certificate with --tls-generate). The invoke listener
over TLS speaks HTTP/1.1 only.

Asynchronous calls (/async-function/NAME, Prefer: respond-async, brisk
invoke --async, brisk calls) are kept in an embedded NATS server with
JetStream storing under <data-dir>/nats (no listener), or in the NATS
server given with --nats.`,
		Args: exactArgs(0),
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := cf.config(g)
			if err != nil {
				return err
			}
			log, _ := g.logger()
			host, _ := os.Hostname()
			dpTLS, err := invokeTLS.config()
			if err != nil {
				return err
			}
			if cf.tlsGenerate {
				// The CA local.New would load, loaded here to issue the
				// listeners' certificates.
				ca, _, err := pki.LoadOrCreateCA(cf.dataDir)
				if err != nil {
					return fmt.Errorf("cluster CA: %w", err)
				}
				cfg.CA = ca
				if err := cf.generateAdminTLS(&cfg); err != nil {
					return err
				}
				if dpTLS == nil {
					if dpTLS, err = generateTLS(ca, "invoke listener", invoke, cf.tlsSANs); err != nil {
						return err
					}
				}
			}
			// A one-machine cluster stops its sandboxes with it.
			wf.listen, wf.nodeID, wf.stateDir, wf.stopOnExit = "127.0.0.1:0", host, filepath.Join(cf.dataDir, "worker"), true
			opts, err := wf.options(c)
			if err != nil {
				return err
			}
			q, closeQueue, err := af.open(c.Context(), cf.dataDir, log.With("component", "async"))
			if err != nil {
				return err
			}
			defer closeQueue()
			cfg.Async = q
			tracer, flush, err := tf.tracer(c.Context(), "brisk")
			if err != nil {
				return err
			}
			defer flush()
			cl, err := local.New(local.Config{ControlPlane: cfg, Workers: opts, Logger: log, InsecureNoTLS: cf.noTLS,
				DataPlane: dataplane.Config{ID: host, Listen: invoke, TLS: dpTLS, Async: q, Tracer: tracer, Logger: log.With("component", "dataplane")}})
			if err != nil {
				return err
			}
			go func() {
				select {
				case <-c.Context().Done():
				case <-cl.Ready():
					adminScheme, invokeScheme := "http", "http"
					if cfg.AdminTLS != nil {
						adminScheme = "https"
					}
					if dpTLS != nil {
						invokeScheme = "https"
					}
					fmt.Fprintf(os.Stderr, "brisk is up: admin %s://%s  invoke %s://%s  data %s\n", adminScheme, cl.AdminAddr(), invokeScheme, cl.InvokeAddr(), cf.dataDir)
					if cf.tlsGenerate {
						fmt.Fprintf(os.Stderr, "TLS certificates from the cluster CA: clients trust %s (brisk --ca-cert, or export BRISK_CA_CERT=%[1]s)\n",
							filepath.Join(cf.dataDir, pki.CACertFile))
					}
					if !cf.noAuth {
						fmt.Fprintf(os.Stderr, "admin token: %s (the CLI reads it; elsewhere: export BRISK_TOKEN_FILE=%[1]s)\n",
							filepath.Join(cf.dataDir, api.AdminTokenFile))
					}
					fmt.Fprintf(os.Stderr, "dashboard: %s://%s/ui/ (brisk ui prints it with the token)\n", adminScheme, cl.AdminAddr())
					fmt.Fprintf(os.Stderr, "runtime: %s\n", isolationOf(wf.rt))
				}
			}()
			return usageOr(cl.Run(c.Context()))
		},
	}
	cf.register(c)
	withConfigFile(c)
	wf.register(c, false)
	c.Flags().StringVar(&invoke, "invoke", "127.0.0.1:8080", "data plane invocation listen address")
	invokeTLS.register(c, "invoke-", "invocations")
	af.register(c, true)
	tf.register(c)
	return c
}

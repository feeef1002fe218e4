package kubecluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/brisk-faas/brisk/internal/image"
)

// A real kubelet (StartKubelet) runs Pods in containers of a containerd of
// its own, with pod networking on a bridge and subnet of its own. These
// are its fixed names: one such kubelet runs on a host at a time (a
// host-wide lock serialises tests), because the kubelet writes a few
// things at fixed host paths whatever its flags say.
const (
	// KubeletNode is the node the kubelet registers.
	KubeletNode = "brisk-kubelet"
	// KubeletNamespace is the containerd namespace of the CRI plugin:
	// images the kubelet's Pods run must be imported there.
	KubeletNamespace = "k8s.io"
	// KubeletSubnet holds the Pods' addresses; the bridge takes the first.
	KubeletSubnet = "10.216.0.0/24"
	kubeletBridge = "bkubelet0"
	kubeletGW     = KubeletGatewayIP + "/24"
	// kubeletCNINet names the CNI network (and its cache entries).
	kubeletCNINet = "brisk-kubelet"
	// kubeletCgroupRoot is the kubelet's cgroupRoot: its kubepods tree
	// goes under it, in every hierarchy, not at the top.
	kubeletCgroupRoot = "brisk-kubelet"
	kubeletLock       = "/run/brisk/kubelet.lock"
	// PauseImage is the Pods' sandbox image: testdata/pause of the native
	// runtime (no C library, pause() until killed), built and imported by
	// StartKubelet.
	PauseImage = image.LocalDomain + "/pause:latest"
)

// Paths the kubelet and containerd's CRI plugin write whatever their
// configuration says; Stop removes what a run added there.
var (
	// The device-plugin registration socket and checkpoint.
	kubeletDevicePlugins = "/var/lib/kubelet/device-plugins"
	// The symlinks to container logs.
	kubeletContainerLogs = "/var/log/containers"
	// Network namespaces the CRI plugin pins (cni-<uuid>).
	criNetns = "/var/run/netns"
	// libcni's cache of results.
	cniCache = "/var/lib/cni"
)

// Kubelet is a kubelet registered as KubeletNode, Ready, on a containerd
// of its own.
type Kubelet struct {
	// Node is the node's name (KubeletNode).
	Node string
	// Dir holds the kubelet's and containerd's state, configs and logs.
	Dir string
	// ContainerdSocket is the private containerd's socket; import images
	// for Pods into KubeletNamespace there.
	ContainerdSocket string
	// Ready is how long StartKubelet took from starting containerd to the
	// node being Ready.
	Ready time.Duration

	c        *Cluster
	procs    []*proc
	api      *apiProxy // the apiserver for the Pods (APIServer)
	unlock   func()
	before   hostPaths // what was at the fixed host paths before the start
	state    string    // hostState before the start
	stopped  bool
	stopErrs []error
}

// hostPaths lists entries at the fixed paths the kubelet writes to.
type hostPaths map[string]bool

func listHostPaths() hostPaths {
	h := hostPaths{}
	for _, root := range []string{"/var/lib/kubelet", kubeletContainerLogs, cniCache} {
		_ = filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				h[p] = true
			}
			return nil
		})
	}
	if ents, err := os.ReadDir(criNetns); err == nil {
		for _, e := range ents {
			if criNetnsName(e.Name()) {
				h[filepath.Join(criNetns, e.Name())] = true
			}
		}
	}
	return h
}

// criNetnsName says whether a name in criNetns is the CRI plugin's
// (others are, for instance, brisk's network pool's).
func criNetnsName(name string) bool { return strings.HasPrefix(name, "cni-") }

// requireKubelet returns what StartKubelet needs that is missing.
func requireKubelet(bin string) []string {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if fi, err := os.Stat(filepath.Join(bin, "kubelet")); err != nil || fi.Mode()&0o111 == 0 {
		missing = append(missing, filepath.Join(bin, "kubelet")+" (scripts/k8s-binaries.sh)")
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "cc"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(cniBinDir, p)+" (Debian's containernetworking-plugins)")
		}
	}
	return missing
}

const cniBinDir = "/usr/lib/cni"

// StartKubelet starts a real kubelet against the cluster, registered as
// node KubeletNode, on a containerd of its own (its root, state and
// socket in the test's temporary directory) whose CRI plugin runs Pods
// with runc and gives them addresses of KubeletSubnet on a bridge of
// their own, reachable from this host only (no NAT, no route off the
// machine). Pods reach the apiserver at APIServer (a forwarder on the
// bridge's address) and resolve names through StartDNS's CoreDNS, the
// kubelet's cluster DNS; no kube-proxy runs. The Pods' sandbox image is
// PauseImage, built here. It returns
// when the node is Ready; Stop, also run when the test ends, deletes the
// node's Pods, stops both daemons by PID and removes everything the run
// wrote on the host.
//
// It needs root, the kubelet binary (scripts/k8s-binaries.sh), containerd
// and runc, the CNI plugins of Debian's containernetworking-plugins and a
// C compiler: without them the test is skipped, or failed under CI.
func StartKubelet(t testing.TB, c *Cluster) *Kubelet {
	t.Helper()
	if missing := requireKubelet(c.bin); len(missing) > 0 {
		msg := "kubecluster: a real kubelet needs " + strings.Join(missing, ", ")
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI must run these tests")
		}
		t.Skip(msg)
	}
	unlock, err := lockHost()
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	// Stop removes what appeared under the kubelet's and CNI's host
	// directories during the test: on a host with a kubelet (or any CRI
	// and CNI) of its own that would be that one's files and namespaces.
	for _, p := range []string{"/var/lib/kubelet/pods", "/var/lib/cni/networks"} {
		if entries, err := os.ReadDir(p); err == nil && len(entries) > 0 {
			unlock()
			msg := "kubecluster: " + p + " is in use on this host (another kubelet or CNI): the harness's cleanup would touch it"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	k := &Kubelet{Node: KubeletNode, Dir: t.TempDir(), c: c, unlock: unlock, before: listHostPaths(), state: hostState()}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Errorf("kubecluster: stopping the kubelet: %v", err)
		}
	})
	k.ContainerdSocket = filepath.Join(k.Dir, "containerd.sock")
	if err := k.prepare(); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	target, err := apiTarget(c.Host)
	if err == nil {
		k.api, err = startAPIProxy(target)
	}
	if err != nil {
		t.Fatalf("kubecluster: the apiserver's address for Pods: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	rb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "brisk-test-kubelet"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:node:" + KubeletNode}},
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubecluster: %v", err)
	}

	t0 := time.Now()
	k.start(t, "containerd", "containerd", "--config", filepath.Join(k.Dir, "containerd.toml"))
	if err := k.importPause(ctx); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	k.start(t, "kubelet", filepath.Join(c.bin, "kubelet"),
		"--config="+filepath.Join(k.Dir, "kubelet.json"),
		"--kubeconfig="+filepath.Join(k.Dir, "kubelet.kubeconfig"),
		"--root-dir="+filepath.Join(k.Dir, "kubelet"),
		"--hostname-override="+KubeletNode,
		"--v=2")
	for {
		if err := k.exited(); err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, KubeletNode, metav1.GetOptions{})
		if err == nil && nodeReady(node) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("kubecluster: node %s not Ready after %v (%v); the kubelet's log ends:\n%s", KubeletNode, startTimeout, err,
				tail(filepath.Join(k.Dir, "kubelet.log"), 30))
		}
		time.Sleep(pollEvery)
	}
	k.Ready = time.Since(t0)
	t.Logf("kubecluster: kubelet node %s Ready in %v (containerd at %s)", KubeletNode, k.Ready.Round(time.Millisecond), k.ContainerdSocket)
	return k
}

// lockHost takes the host-wide kubelet lock, waiting for a holder to
// finish (the kernel drops a dead holder's flock).
func lockHost() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(kubeletLock), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(kubeletLock, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", kubeletLock, err)
	}
	return func() { f.Close() }, nil
}

// prepare writes the configs, builds the pause image's archive, creates
// the bridge and the cgroup root.
func (k *Kubelet) prepare() error {
	d := k.Dir
	for _, sub := range []string{"cni", "cni-ipam", "pod-logs", "volume-plugins", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			return err
		}
	}
	containerdConfig := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  disable_apparmor = true
  # This VM lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's
  # oom_score_adj to -998, and every sandbox would fail.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[7]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q
`, filepath.Join(d, "containerd-root"), filepath.Join(d, "containerd-state"), k.ContainerdSocket, k.ContainerdSocket+".ttrpc",
		filepath.Join(d, "containerd-opt"), PauseImage, filepath.Join(d, "runc"), cniBinDir, filepath.Join(d, "cni"))
	// The bridge exists before CNI runs (prepare makes it, with the first
	// address), so the plugin needs no gateway mode, which would turn on
	// the host's IP forwarding; no masquerading either: Pods talk to this
	// host only.
	cni := map[string]any{
		"cniVersion": "0.4.0",
		"name":       kubeletCNINet,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": kubeletBridge, "isGateway": false, "ipMasq": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": KubeletSubnet, "rangeStart": "10.216.0.10"}}},
				"dataDir": filepath.Join(d, "cni-ipam"),
			},
		}},
	}
	kubelet := map[string]any{
		"kind":       "KubeletConfiguration",
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		// No API server of the kubelet's own (nothing here needs logs or
		// exec) and no healthz port: it listens nowhere.
		"enableServer":             false,
		"healthzPort":              0,
		"readOnlyPort":             0,
		"address":                  "127.0.0.1",
		"authentication":           map[string]any{"anonymous": map[string]any{"enabled": false}, "webhook": map[string]any{"enabled": false}},
		"authorization":            map[string]any{"mode": "AlwaysAllow"},
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               "/" + kubeletCgroupRoot,
		"failCgroupV1":             false, // this host runs hybrid cgroup v1
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + k.ContainerdSocket,
		"imageServiceEndpoint":     "unix://" + k.ContainerdSocket,
		"podLogsDir":               filepath.Join(d, "pod-logs"),
		"volumePluginDir":          filepath.Join(d, "volume-plugins"),
		// No KUBE-FIREWALL, KUBE-KUBELET-CANARY or KUBE-IPTABLES-HINT
		// chains in the host's iptables.
		"makeIPTablesUtilChains": false,
		"hairpinMode":            "none",
		// The images are imported, nothing could pull them again: never
		// collect them, and evict only on a nearly full machine.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
			"nodefs.inodesFree": "1%"},
		"maxPods": 30,
		// StartDNS serves it; ClusterFirst Pods get it as their resolver.
		"clusterDNS":    []string{KubeletGatewayIP},
		"clusterDomain": ClusterDomain,
	}
	for _, f := range []struct {
		name string
		data any
	}{
		{"containerd.toml", containerdConfig},
		{"cni/10-brisk.conflist", cni},
		{"kubelet.json", kubelet},
	} {
		var b []byte
		if s, ok := f.data.(string); ok {
			b = []byte(s)
		} else {
			var err error
			if b, err = json.MarshalIndent(f.data, "", "  "); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(d, f.name), b, 0o600); err != nil {
			return err
		}
	}
	if err := writeKubeconfig(filepath.Join(d, "kubelet.kubeconfig"), k.c.Host, k.c.pki.caPEM, k.c.pki.nodeToken); err != nil {
		return err
	}
	if err := k.buildPause(); err != nil {
		return err
	}
	if err := setupBridge(); err != nil {
		return fmt.Errorf("bridge %s: %w", kubeletBridge, err)
	}
	// The kubelet requires its cgroupRoot to exist in every hierarchy.
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, kubeletCgroupRoot), 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
	}
	return nil
}

// buildPause compiles the native runtime's testdata/pause and packs it as
// an OCI archive tagged PauseImage.
func (k *Kubelet) buildPause() error {
	_, self, _, ok := goruntime.Caller(0)
	if !ok {
		return errors.New("pause image: cannot locate the source tree")
	}
	src := filepath.Join(filepath.Dir(self), "..", "..", "worker", "runtime", "native", "testdata", "pause", "pause.c")
	bin := filepath.Join(k.Dir, "pause-image", "pause")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("cc", "-static", "-nostdlib", "-no-pie", "-s", "-o", bin, src).CombinedOutput(); err != nil {
		return fmt.Errorf("pause image: cc %s: %v\n%s", src, err, out)
	}
	img, err := image.Build(image.Options{Path: bin})
	if err != nil {
		return err
	}
	return image.WriteArchive(filepath.Join(k.Dir, "pause.tar"), img, PauseImage)
}

// importPause imports the pause image into the private containerd, once
// it answers.
func (k *Kubelet) importPause(ctx context.Context) error {
	var cl *containerd.Client
	for {
		if err := k.exited(); err != nil {
			return err
		}
		if _, err := os.Stat(k.ContainerdSocket); err == nil {
			var err error
			if cl, err = containerd.New(k.ContainerdSocket, containerd.WithTimeout(5*time.Second)); err == nil {
				if _, err = cl.Version(ctx); err == nil {
					break
				}
				cl.Close()
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("containerd did not answer on %s: %w; its log ends:\n%s", k.ContainerdSocket, ctx.Err(),
				tail(filepath.Join(k.Dir, "containerd.log"), 20))
		}
		time.Sleep(pollEvery)
	}
	defer cl.Close()
	f, err := os.Open(filepath.Join(k.Dir, "pause.tar"))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = image.Import(ctx, cl, KubeletNamespace, image.DefaultSnapshotter, f)
	return err
}

func setupBridge() error {
	// A bridge of this name is a crashed run's (the host lock is held):
	// start afresh.
	if l, err := netlink.LinkByName(kubeletBridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			return err
		}
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: kubeletBridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(kubeletGW)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(br, addr); err != nil {
		return err
	}
	return netlink.LinkSetUp(br)
}

// cgroupHierarchies are the mount points of the host's cgroup
// hierarchies, v1 and v2.
func cgroupHierarchies() []string {
	var hs []string
	for _, m := range mounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			hs = append(hs, m.point)
		}
	}
	return hs
}

type mount struct{ point, fstype string }

// mounts are this process's mounts, in mount order.
func mounts() []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var ms []mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		ms = append(ms, mount{point: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return ms
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// start runs a daemon of the kubelet, its output in Dir/name.log.
func (k *Kubelet) start(t testing.TB, name, path string, args ...string) {
	t.Helper()
	p, err := startProc(k.Dir, name, path, args...)
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	k.procs = append(k.procs, p)
}

// stop ends the process by its PID: SIGTERM, then SIGKILL after
// stopTimeout. killed says SIGKILL was needed.
func (p *proc) stop() (killed bool) {
	select {
	case <-p.done:
		return false
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return false
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return true
	}
}

func (k *Kubelet) exited() error {
	for _, p := range k.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v; its log ends:\n%s", p.name, p.err, tail(p.log, 20))
		default:
		}
	}
	return nil
}

// Stop deletes the node's Pods and waits until the kubelet has stopped
// their containers and torn down their networks, stops the kubelet and
// containerd (by PID), and removes what they wrote outside Dir: mounts,
// cgroups, the bridge, the CRI plugin's network namespaces, CNI cache
// entries, the kubelet's device-plugin socket and container-log links.
// The Node object is deleted. Then it checks that the host is as it was
// before StartKubelet (hostState) and says what differs if not. Stop runs
// once; later calls return the first one's result.
func (k *Kubelet) Stop() error {
	if k.stopped {
		return errors.Join(k.stopErrs...)
	}
	k.stopped = true
	defer k.unlock()
	var errs []error
	fail := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*startTimeout)
	defer cancel()
	if k.exited() == nil && len(k.procs) >= 2 { // containerd and the kubelet run
		fail(k.drain(ctx))
	}
	// The kubelet first, then what it left in containerd, then containerd.
	for i := len(k.procs) - 1; i >= 0; i-- {
		if k.procs[i].name == "containerd" {
			fail(k.deleteContainers(ctx))
		}
		k.procs[i].stop()
	}
	if k.api != nil {
		k.api.close()
	}
	if err := k.c.Client.CoreV1().Nodes().Delete(ctx, KubeletNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		fail(err)
	}
	fail(k.cleanHost())
	if now := hostState(); now != k.state {
		fail(fmt.Errorf("the host is not as before the kubelet started:\n%s", lineDiff(k.state, now)))
	}
	k.stopErrs = errs
	return errors.Join(errs...)
}

// drain deletes every Pod bound to the node and waits until they are gone
// from the API: the kubelet removes a Pod's object only when its
// containers have stopped and its sandbox is torn down (network, mounts).
func (k *Kubelet) drain(ctx context.Context) error {
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + KubeletNode}
	list, err := k.c.Client.CoreV1().Pods("").List(ctx, sel)
	if err != nil {
		return err
	}
	grace := int64(1)
	for _, p := range list.Items {
		err := k.c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	for {
		list, err := k.c.Client.CoreV1().Pods("").List(ctx, sel)
		if err == nil && len(list.Items) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the kubelet did not finish the node's Pods: %v (%d left)", ctx.Err(), len(list.Items))
		}
		time.Sleep(pollEvery)
	}
}

// deleteContainers kills and deletes what is left in the CRI plugin's
// namespace (a Pod the kubelet did not finish, its stopped sandboxes), so
// that no task or rootfs mount outlives containerd.
func (k *Kubelet) deleteContainers(ctx context.Context) error {
	if _, err := os.Stat(k.ContainerdSocket); err != nil {
		return nil
	}
	cl, err := containerd.New(k.ContainerdSocket, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return nil // containerd is not running: nothing of it to stop
	}
	defer cl.Close()
	ctx = namespaces.WithNamespace(ctx, KubeletNamespace)
	cs, err := cl.Containers(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range cs {
		if task, err := c.Task(ctx, nil); err == nil {
			_ = task.Kill(ctx, syscall.SIGKILL)
			if ch, err := task.Wait(ctx); err == nil {
				select {
				case <-ch:
				case <-ctx.Done():
				}
			}
			// The CRI plugin may have deleted an exited task meanwhile, or
			// its shim exited under the delete ("ttrpc: closed"): what
			// counts is that no task is left.
			if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				if _, terr := c.Task(ctx, nil); terr != nil && errdefs.IsNotFound(terr) {
					err = nil
				} else if t2, terr := c.Task(ctx, nil); terr == nil {
					_, err = t2.Delete(ctx, containerd.WithProcessKill)
					if errdefs.IsNotFound(err) {
						err = nil
					}
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("task %s: %w", c.ID(), err))
				}
			}
		}
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("container %s: %w", c.ID(), err))
		}
	}
	return errors.Join(errs...)
}

// cleanHost removes what the run left on the host outside the daemons'
// own cleanup.
func (k *Kubelet) cleanHost() error {
	var errs []error
	// Mounts under Dir (the kubelet bind-mounts its root dir onto itself,
	// emptyDirs are tmpfs, containerd's rootfs and shm mounts) and the
	// network namespaces the CRI plugin pinned, deepest first.
	ms := mounts()
	for i := len(ms) - 1; i >= 0; i-- {
		p := ms[i].point
		netns := (filepath.Dir(p) == criNetns || filepath.Dir(p) == "/run/netns") && criNetnsName(filepath.Base(p))
		ours := p == k.Dir || strings.HasPrefix(p, k.Dir+"/") ||
			netns && !k.before[filepath.Join(criNetns, filepath.Base(p))]
		if ours {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
			}
		}
	}
	after := listHostPaths()
	added := make([]string, 0, len(after))
	for p := range after {
		if !k.before[p] {
			added = append(added, p)
		}
	}
	// Deepest first, so that a directory is empty when its turn comes.
	slices.SortFunc(added, func(a, b string) int { return strings.Compare(b, a) })
	for _, p := range added {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// The cgroup tree under the cgroup root, in every hierarchy: leaves
	// first (a cgroup directory goes with rmdir once it has no children
	// and no tasks).
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, kubeletCgroupRoot)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", dirs[i], err))
			}
		}
	}
	if l, err := netlink.LinkByName(kubeletBridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("bridge %s: %w", kubeletBridge, err))
		}
	}
	return errors.Join(errs...)
}

// hostState describes what a kubelet run could leave on this host: KUBE-
// iptables chains (IPv4 and IPv6), mounts of the kubelet's and the CRI
// plugin's network namespaces, kubepods cgroups and the cgroup root, the
// bridge, the entries at the fixed paths. It is taken under the host lock,
// so no other kubelet of these tests changes it meanwhile.
func hostState() string {
	var b strings.Builder
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(cmd).Output()
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", cmd, err)
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "KUBE-") {
				fmt.Fprintf(&b, "%s: %s\n", cmd, line)
			}
		}
	}
	for _, m := range mounts() {
		netns := (filepath.Dir(m.point) == criNetns || filepath.Dir(m.point) == "/run/netns") && criNetnsName(filepath.Base(m.point))
		if netns || strings.Contains(m.point, "kubelet") {
			fmt.Fprintf(&b, "mount %s (%s)\n", m.point, m.fstype)
		}
	}
	for _, h := range cgroupHierarchies() {
		for _, name := range []string{kubeletCgroupRoot, "kubepods", "kubepods.slice"} {
			if _, err := os.Stat(filepath.Join(h, name)); err == nil {
				fmt.Fprintf(&b, "cgroup %s\n", filepath.Join(h, name))
			}
		}
	}
	if _, err := net.InterfaceByName(kubeletBridge); err == nil {
		fmt.Fprintf(&b, "link %s\n", kubeletBridge)
	}
	paths := listHostPaths()
	for _, p := range []string{"/usr/libexec/kubernetes", "/etc/kubernetes", "/opt/containerd", "/etc/cni"} {
		if _, err := os.Stat(p); err == nil {
			paths[p] = true
		}
	}
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for p := range paths {
			if !yield(p) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "path %s\n", p)
	}
	return b.String()
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	am, bm := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !bm[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !am[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

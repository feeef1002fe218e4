// Package kubecluster starts a real Kubernetes control plane for tests:
// etcd, kube-apiserver and KWOK (which plays the kubelet of fake nodes),
// from the binaries scripts/k8s-binaries.sh builds from the Go module
// proxy. Everything listens on 127.0.0.1, on free ports, keeps its state
// in the test's temporary directory and is stopped, by PID, when the test
// ends. Clients authenticate with static tokens and are authorised by RBAC,
// as on a real cluster, so a test can check what rights a component needs.
//
// KWOK fakes the status of Pods but runs nothing; nodes get a pod CIDR on
// loopback, so Pod IPs are 127.x addresses, and ServePods can stand in for
// the Pods' containers. StartKubelet adds one real node: a kubelet on a
// containerd of its own, whose Pods run in real containers.
//
// Without the binaries a test is skipped, with the command that builds
// them, unless the CI environment variable is set: CI must run these tests,
// so there it fails.
package kubecluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Where the binaries are: $BRISK_K8S_CACHE/bin, else DefaultCacheDir/bin,
// as in scripts/k8s-binaries.sh.
const (
	DefaultCacheDir = "/var/cache/brisk/k8s-v1.36.3"
	CacheEnv        = "BRISK_K8S_CACHE"
)

// WorkerUser is a user with no rights until a test grants them (a
// RoleBinding to the user or to WorkerGroup); WorkerConfig authenticates
// as it.
const (
	WorkerUser  = "brisk-worker"
	WorkerGroup = "brisk:workers"
)

// Bounds of the waits, generous: they only bound a failing start on a
// slow, shared machine.
const (
	startTimeout = 90 * time.Second
	stopTimeout  = 15 * time.Second
	pollEvery    = 25 * time.Millisecond
)

// required are the binaries Start runs; kubectl is optional (Kubectl).
var required = []string{"etcd", "kube-apiserver", "kwok"}

// BinDir is the directory the binaries are expected in.
func BinDir() string {
	dir := os.Getenv(CacheEnv)
	if dir == "" {
		dir = DefaultCacheDir
	}
	return filepath.Join(dir, "bin")
}

// RequireBinaries returns BinDir when it holds the binaries Start needs.
// Otherwise it skips the test with the command that builds them, or fails
// it when CI is set.
func RequireBinaries(t testing.TB) string {
	t.Helper()
	return requireBinaries(t, BinDir(), os.Getenv("CI"))
}

func requireBinaries(t testing.TB, bin, ci string) string {
	t.Helper()
	var missing []string
	for _, b := range required {
		if fi, err := os.Stat(filepath.Join(bin, b)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) == 0 {
		return bin
	}
	msg := fmt.Sprintf("Kubernetes binaries missing from %s (%s): build them with scripts/k8s-binaries.sh (about 5 minutes the first time)",
		bin, strings.Join(missing, ", "))
	if ci != "" {
		t.Fatal(msg + "; CI must run these tests")
	}
	t.Skip(msg)
	return ""
}

// Options configure Start.
type Options struct {
	// Nodes is how many KWOK nodes to create at once (AddNodes adds more).
	Nodes int
}

// Cluster is a running control plane.
type Cluster struct {
	// Dir holds the cluster's state, certificates and logs.
	Dir string
	// Host is the apiserver's URL.
	Host string
	// Kubeconfig is a kubeconfig file for the admin (kubectl, KWOK).
	Kubeconfig string
	// Client is an admin client.
	Client kubernetes.Interface
	// Nodes are the KWOK nodes, Ready, in the order they were added.
	Nodes []string
	// Startup is how long Start took until the apiserver was ready and
	// KWOK had made the first nodes Ready.
	Startup time.Duration

	bin     string
	pki     *pki
	apiArgs []string // kube-apiserver's, for CrashAPIServer
	procs   []*proc
	mu      sync.Mutex
	seq     int // nodes made so far: their names and pod CIDRs
	// cidrBase is the second octet of the first node's pod CIDR.
	cidrBase int
}

// proc is one process Start started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when it has exited
	err  error         // its exit, set before done closes
}

// Start starts etcd, kube-apiserver and KWOK and creates opts.Nodes KWOK
// nodes, all stopped when t ends. It skips or fails t as RequireBinaries
// does when the binaries are missing, and skips it in -short runs.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("kubecluster: starts a Kubernetes control plane, which -short runs leave out")
	}
	t0 := time.Now()
	c := &Cluster{bin: RequireBinaries(t), Dir: t.TempDir(), cidrBase: cidrBaseMin + rand.IntN(cidrBaseSpan)}
	t.Cleanup(func() { c.stop(t) })
	var err error
	if c.pki, err = writePKI(c.Dir); err != nil {
		t.Fatalf("kubecluster: certificates: %v", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.Host = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	// etcd and the apiserver start together: the apiserver retries etcd
	// until it answers, and the two starts overlap.
	c.start(t, "etcd",
		"--name=brisk-test", "--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+etcdClient, "--advertise-client-urls="+etcdClient,
		"--listen-peer-urls="+etcdPeer, "--initial-advertise-peer-urls="+etcdPeer,
		"--initial-cluster=brisk-test="+etcdPeer,
		"--unsafe-no-fsync", // test data: durability costs only time here
		"--log-level=warn")
	c.apiArgs = []string{
		"--etcd-servers=" + etcdClient,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[2]),
		"--cert-dir=" + filepath.Join(c.Dir, "apiserver-certs"),
		"--tls-cert-file=" + c.pki.certFile, "--tls-private-key-file=" + c.pki.keyFile,
		"--token-auth-file=" + c.pki.tokenFile,
		"--authorization-mode=RBAC",
		// As kubeadm's clusters do: node agents (brisk's containerd
		// worker DaemonSet) may ask for privileged containers.
		"--allow-privileged=true",
		"--service-account-key-file=" + c.pki.saKeyFile, "--service-account-signing-key-file=" + c.pki.saKeyFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		// Only a range to allocate Service IPs from; nothing routes it.
		"--service-cluster-ip-range=10.0.0.0/24",
		// The loopback advertise address stays out of the kubernetes
		// Endpoints.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000",
		"--profiling=false"}
	c.start(t, "kube-apiserver", c.apiArgs...)
	if err := c.awaitReady(t); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	rc := c.AdminConfig()
	if c.Client, err = kubernetes.NewForConfig(rc); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.Host, c.pki.caPEM, c.pki.adminToken); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	cfg := filepath.Join(c.Dir, "kwok.yaml")
	if err := os.WriteFile(cfg, []byte(stages), 0o600); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.start(t, "kwok",
		"--kubeconfig="+c.Kubeconfig, "--config="+cfg,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector="+NodeAnnotation+"=fake",
		"--node-ip=127.0.0.1",
		// Only for Pods on a node without a pod CIDR (every node here has
		// one): loopback too, so no Pod IP is ever routed off the machine.
		"--cidr=127.99.0.0/16",
		"--node-lease-duration-seconds=0")
	if opts.Nodes > 0 {
		c.AddNodes(t, opts.Nodes)
	}
	c.Startup = time.Since(t0)
	t.Logf("kubecluster: apiserver at %s, %d KWOK nodes, started in %v (state in %s)", c.Host, len(c.Nodes), c.Startup.Round(time.Millisecond), c.Dir)
	return c
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	ls := make([]net.Listener, n)
	defer func() {
		for _, l := range ls {
			if l != nil {
				_ = l.Close()
			}
		}
	}()
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls[i], ports[i] = l, l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// start runs binary name with args, its output in Dir/name.log.
func (c *Cluster) start(t testing.TB, name string, args ...string) {
	t.Helper()
	p, err := startProc(c.Dir, name, filepath.Join(c.bin, name), args...)
	if err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
}

// startProc runs path with args in dir, its output appended to
// dir/name.log (a restart appends), and reaps it.
func startProc(dir, name, path string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = dir
	// HOME in the state directory: nothing writes caches or configs into
	// the real one. Pdeathsig: a test binary that dies does not leave
	// its processes running.
	cmd.Env = append(os.Environ(), "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// CrashAPIServer kills the kube-apiserver with SIGKILL, as a crash, runs
// whileDown, then starts it again on the same address and etcd (every
// object kept) and waits until it is ready.
func (c *Cluster) CrashAPIServer(t testing.TB, whileDown func()) {
	t.Helper()
	c.mu.Lock()
	i := slices.IndexFunc(c.procs, func(p *proc) bool { return p.name == "kube-apiserver" })
	if i < 0 {
		c.mu.Unlock()
		t.Fatal("kubecluster: no kube-apiserver running")
	}
	p := c.procs[i]
	c.procs = slices.Delete(c.procs, i, i+1)
	c.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-p.done
	whileDown()
	c.start(t, "kube-apiserver", c.apiArgs...)
	if err := c.awaitReady(t); err != nil {
		t.Fatalf("kubecluster: restarted apiserver: %v", err)
	}
}

// PIDs are the processes Start started, by name.
func (c *Cluster) PIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string]int{}
	for _, p := range c.procs {
		m[p.name] = p.cmd.Process.Pid
	}
	return m
}

// stop ends the processes, the last started first: SIGTERM, then SIGKILL
// after stopTimeout. Each is signalled by its own PID. When the test failed
// the end of each log is printed.
func (c *Cluster) stop(t testing.TB) {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		select {
		case <-p.done:
			t.Logf("kubecluster: %s had exited already: %v", p.name, p.err)
		default:
			if p.stop() {
				t.Logf("kubecluster: %s (pid %d) still ran %v after SIGTERM: SIGKILL", p.name, p.cmd.Process.Pid, stopTimeout)
			}
		}
		if t.Failed() {
			t.Logf("kubecluster: the end of %s:\n%s", p.log, tail(p.log, 30))
		}
	}
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// awaitReady polls the apiserver's /readyz until it answers 200, or a
// process has exited, or startTimeout has passed.
func (c *Cluster) awaitReady(t testing.TB) error {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	last := errors.New("not asked yet")
	for {
		if err := c.exited(); err != nil {
			return err
		}
		req, _ := http.NewRequest(http.MethodGet, c.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.pki.adminToken)
		resp, err := hc.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("/readyz: %s: %s", resp.Status, bytes.TrimSpace(body))
		} else {
			last = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %v: %v; its log ends:\n%s", startTimeout, last,
				tail(filepath.Join(c.Dir, "kube-apiserver.log"), 20))
		}
		time.Sleep(pollEvery)
	}
}

// exited reports a process of the cluster that has exited, with its log.
func (c *Cluster) exited() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v; its log ends:\n%s", p.name, p.err, tail(p.log, 20))
		default:
		}
	}
	return nil
}

// AdminConfig is a REST config with every right.
func (c *Cluster) AdminConfig() *rest.Config { return c.restConfig(c.pki.adminToken) }

// WorkerConfig is a REST config of WorkerUser, who has only the rights a
// test grants.
func (c *Cluster) WorkerConfig() *rest.Config { return c.restConfig(c.pki.wkToken) }

func (c *Cluster) restConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            c.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		// Tests create Pods in bursts; client-go's default 5 QPS would
		// make them wait on the client.
		QPS: 1000, Burst: 1000,
	}
}

func writeKubeconfig(path, host string, ca []byte, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["brisk-test"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: ca}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["brisk-test"] = &clientcmdapi.Context{Cluster: "brisk-test", AuthInfo: "admin"}
	cfg.CurrentContext = "brisk-test"
	return clientcmd.WriteToFile(*cfg, path)
}

// Kubectl runs kubectl against the cluster as the admin and returns its
// output; the test is skipped when kubectl was not built (it is optional).
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	path := filepath.Join(c.bin, "kubectl")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("kubectl is not in %s", c.bin)
	}
	cmd := exec.Command(path, append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+c.Dir) // its cache goes there
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Namespace creates namespace name with its "default" ServiceAccount,
// which the ServiceAccount admission plugin requires of every Pod and
// which the controller manager (not run here) would otherwise make.
func (c *Cluster) Namespace(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubecluster: namespace %s: %v", name, err)
	}
	_, err = c.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubecluster: service account %s/default: %v", name, err)
	}
	return name
}

// nodePodCIDR is node number i's pod CIDR: a /24 of loopback, so that the
// Pod IPs KWOK hands out are reachable on this machine only (ServePods
// listens on them) and distinct across nodes. The second octet starts at
// a random base, so that clusters of tests running at once (go test runs
// packages in parallel) are unlikely to share addresses.
func (c *Cluster) nodePodCIDR(i int) string {
	return fmt.Sprintf("127.%d.%d.0/24", c.cidrBase+i/256, i%256)
}

// maxNodes is how many nodes fit between the highest base and 127.255/16.
const maxNodes = (255 - cidrBaseMin - cidrBaseSpan + 1) * 256

const (
	cidrBaseMin  = 64
	cidrBaseSpan = 128
)

// AddNodes creates n KWOK nodes and waits until KWOK has made them Ready.
// Each has a loopback pod CIDR, 32 CPUs, 256 GiB and room for 110 Pods.
func (c *Cluster) AddNodes(t testing.TB, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c.mu.Lock()
	first := c.seq
	c.seq += n
	c.mu.Unlock()
	if first+n > maxNodes {
		t.Fatalf("kubecluster: at most %d nodes", maxNodes)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("kwok-node-%d", first+i)
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        names[i],
				Annotations: map[string]string{NodeAnnotation: "fake"},
				Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": names[i]},
			},
			Spec:   corev1.NodeSpec{PodCIDR: c.nodePodCIDR(first + i), PodCIDRs: []string{c.nodePodCIDR(first + i)}},
			Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("kubecluster: node %s: %v", names[i], err)
		}
	}
	want := map[string]bool{}
	for _, name := range names {
		want[name] = true
	}
	for {
		if err := c.exited(); err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
		list, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("kubecluster: list nodes: %v", err)
		}
		ready := 0
		for _, node := range list.Items {
			if want[node.Name] && nodeReady(&node) {
				ready++
			}
		}
		if ready == n {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("kubecluster: %d of %d KWOK nodes Ready after %v; KWOK's log ends:\n%s", ready, n, startTimeout,
				tail(filepath.Join(c.Dir, "kwok.log"), 20))
		}
		time.Sleep(pollEvery)
	}
	c.mu.Lock()
	c.Nodes = append(c.Nodes, names...)
	c.mu.Unlock()
	return names
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

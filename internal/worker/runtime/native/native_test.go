package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/fakenet"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/pkg/spec"
)

const (
	netPrefix = "bn"
	probeRef  = image.LocalDomain + "/native-test-probe:latest"
	waitLong  = 60 * time.Second // only bounds failing tests
)

var (
	probeBin string // testdata/probe, static
	pauseBin string // testdata/pause: no C library, waits for a signal
	leanInit string // scripts/build-sandbox-init.sh: the init production uses (with nsinit.Subcommand)
	poolSeq  atomic.Int32
)

func TestMain(m *testing.M) {
	// The test binary doubles as the sandboxes' init: nsinit's constructor
	// takes over before this runs (cgo builds; Main says why not otherwise).
	if len(os.Args) > 1 && os.Args[1] == nsinit.Subcommand {
		nsinit.Main()
	}
	dir, err := os.MkdirTemp("", "brisk-native-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755)
	probeBin = filepath.Join(dir, "probe")
	leanInit = filepath.Join(dir, nsinit.BinaryName)
	err = testutil.GoBuild("./testdata/probe", probeBin, true)
	if err == nil { // as `make build` builds it
		var out []byte
		if out, err = exec.Command("../../../../scripts/build-sandbox-init.sh", leanInit).CombinedOutput(); err != nil {
			err = fmt.Errorf("build %s: %w\n%s", nsinit.BinaryName, err, out)
		}
	}
	if err == nil {
		pauseBin = filepath.Join(dir, "pause")
		var out []byte
		if out, err = exec.Command("cc", "-static", "-nostdlib", "-no-pie", "-s", "-o", pauseBin, "testdata/pause/pause.c").CombinedOutput(); err != nil {
			err = fmt.Errorf("build testdata/pause: %w\n%s", err, out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func poolConfig() netpool.Config {
	n := poolSeq.Add(1)
	return netpool.Config{
		Size:       4,
		Bridge:     fmt.Sprintf("%sbr%d", netPrefix, n),
		Subnet:     netip.MustParsePrefix(fmt.Sprintf("10.217.%d.0/24", n)),
		NamePrefix: fmt.Sprintf("%s%d", netPrefix, n),
	}
}

func newPool(t testing.TB, cfg netpool.Config) *netpool.Pool {
	t.Helper()
	p, err := netpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	return p
}

// newRuntime makes a started runtime on pool (started here unless started
// is set) whose sandboxes are killed, and which is closed, when the test
// ends. Its init is the standalone one production runs; the conformance
// suite and TestRestartAdopts run the test binary's (nsinit's constructor,
// as `brisk __native-init` does).
func newRuntime(t testing.TB, pool *netpool.Pool, stateDir string, startPool bool) *Runtime {
	return newRuntimeWith(t, pool, stateDir, startPool, nil)
}

// newRuntimeWith is newRuntime with mod applied to the configuration.
func newRuntimeWith(t testing.TB, pool *netpool.Pool, stateDir string, startPool bool, mod func(*Config)) *Runtime {
	t.Helper()
	testutil.RequiresRoot(t)
	cfg := Config{StateDir: stateDir, Pool: pool, Shells: 4, InitArgv: []string{leanInit, nsinit.Subcommand},
		BriskBinary: probeBin, KillGrace: 200 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if startPool {
		if err := pool.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	r.Start()
	t.Cleanup(func() { killAll(t, r); r.StopTemplates(); r.Close() })
	return r
}

func killAll(t testing.TB, r *Runtime) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	ls, _ := r.List(ctx)
	for _, l := range ls {
		if err := r.Kill(ctx, l.ID); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("Kill %s: %v", l.ID, err)
		}
	}
}

func probeFn(name string) *spec.Function {
	return &spec.Function{Name: name, Revision: 1, Command: []string{probeBin}, Port: 8080,
		Resources: spec.Resources{MilliCPU: 500, MemoryMB: 128}}
}

// importProbe pushes an image of the probe into r, as `brisk image push
// --to-workers` does.
func importProbe(t *testing.T, r *Runtime) {
	t.Helper()
	img, err := image.Build(image.Options{Path: probeBin, Env: []string{"IMAGE_ENV=from-image"}})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "probe.tar")
	if err := image.WriteArchive(archive, img, probeRef); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	refs, err := r.ImportImage(context.Background(), f)
	if err != nil || len(refs) != 1 || refs[0] != probeRef {
		t.Fatalf("ImportImage = %v, %v; want [%s]", refs, err, probeRef)
	}
}

// start creates a sandbox and waits until it serves.
func start(t *testing.T, r *Runtime, id string, f *spec.Function) *runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, runtime.Spec{ID: id, Function: f})
	if err != nil {
		t.Fatalf("Create %s: %v", id, err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		log, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", f.Name, id+".log"))
		t.Fatalf("sandbox %s not ready: %v (exit: %v); log:\n%s", id, err, inst.ExitErr(), log)
	}
	return inst
}

func probe(t *testing.T, addr string) map[string]any {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("probe reply %q: %v", b, err)
	}
	return m
}

func TestIsolation(t *testing.T) {
	// A descriptor the worker holds without close-on-exec (one it
	// inherited, say): the shells made from here on must not pass it on.
	// A high number, which the function's own descriptors do not reach.
	dir, err := syscall.Open("/", syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	const leak = 1000
	err = syscall.Dup3(dir, leak, 0)
	syscall.Close(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	f := probeFn("iso")
	f.Env = map[string]string{"PROBE_LEAK_FD": strconv.Itoa(leak)}
	inst := start(t, r, "iso-1", f)
	got := probe(t, inst.Addr)
	want := map[string]any{
		"uid": 65534.0, "gid": 65534.0, "pid": 1.0, "hostname": "iso-1", "cap_eff": "0000000000000000",
		"no_new_privs": "1", "seccomp": "2", "unshare_errno": 1.0, // EPERM from the seccomp profile
		"tmp_writable": true, "root_writable": false, "sandbox": "iso-1", "devices": true,
		"leaked_fd": false, "proc_keys": "masked",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	// Only the default capabilities stay in the bounding set.
	if bnd := got["cap_bnd"]; bnd != "00000000a00425fb" {
		t.Errorf("cap_bnd = %v, want runc's default set less CAP_MKNOD, 00000000a00425fb", bnd)
	}
	if n := got["pids"].(float64); n > 2 {
		t.Errorf("the sandbox sees %v processes, want only its own (PID namespace)", n)
	}
	if ifs := fmt.Sprint(got["interfaces"]); !strings.Contains(ifs, "eth0") || strings.Contains(ifs, netPrefix+"br") {
		t.Errorf("interfaces %s: want the pool's eth0 and not the host's", ifs)
	}
	// The sandbox's writes stay in its own layer.
	if _, err := os.Stat("/tmp/written-by-probe"); err == nil {
		t.Error("a write to the sandbox's /tmp reached the host's /tmp")
	}
}

// TestRootSandboxKernel: with no user namespace a sandbox running as uid 0
// is the host's root, so /proc/sys must be read-only (a write to
// kernel.core_pattern would run code on the host) and /proc/keys masked,
// as runc does.
func TestRootSandboxKernel(t *testing.T) {
	r := newRuntimeWith(t, newPool(t, poolConfig()), t.TempDir(), true, func(c *Config) { c.User = "0:0" })
	got := probe(t, start(t, r, "root-1", probeFn("root")).Addr)
	if got["uid"] != 0.0 || got["cap_eff"] == "0000000000000000" {
		t.Fatalf("uid %v, CapEff %v: want root with the default capabilities", got["uid"], got["cap_eff"])
	}
	if ps, _ := got["proc_sys"].(string); !strings.Contains(ps, "read-only file system") {
		t.Errorf("opening /proc/sys/kernel/core_pattern for writing: %q, want read-only file system", ps)
	}
	if got["proc_keys"] != "masked" {
		t.Errorf("/proc/keys: %v, want masked", got["proc_keys"])
	}
}

// TestKillZombieInit: a function whose main thread exits while its other
// threads serve is a zombie to /proc, yet Kill must end it.
func TestKillZombieInit(t *testing.T) {
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	f := probeFn("zombie")
	f.Env = map[string]string{"PROBE_MODE": "zombie"}
	inst := start(t, r, "z-1", f)
	probe(t, inst.Addr) // serves with its main thread gone
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := r.Kill(ctx, "z-1"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	select {
	case <-inst.Exited:
	default:
		t.Fatal("Exited still open after Kill returned")
	}
}

func TestImage(t *testing.T) {
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	importProbe(t, r)
	f := &spec.Function{Name: "img", Revision: 2, Image: probeRef, Port: 9000}
	inst := start(t, r, "img-1", f)
	got := probe(t, inst.Addr)
	if got["image_env"] != "from-image" || got["uid"] != 65534.0 || got["pid"] != 1.0 || got["tmp_writable"] != true {
		t.Errorf("probe in image = %v", got)
	}
	if !strings.HasSuffix(inst.Addr, ":9000") {
		t.Errorf("addr %s, want the function's port 9000", inst.Addr)
	}
	ctx := context.Background()
	if _, err := r.Create(ctx, runtime.Spec{ID: "img-2", Function: &spec.Function{Name: "img", Image: "brisk.local/missing:latest", Port: 8080}}); err == nil ||
		!strings.Contains(err.Error(), "not on this worker") {
		t.Errorf("Create of a missing image = %v, want 'not on this worker'", err)
	}
}

func TestKillAndCrash(t *testing.T) {
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	inst := start(t, r, "k-1", probeFn("k"))
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := r.Kill(ctx, "k-1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inst.Exited:
	case <-ctx.Done():
		t.Fatal("Exited did not close after Kill")
	}
	if err := inst.ExitErr(); !errors.Is(err, runtime.ErrKilled) {
		t.Errorf("ExitErr after Kill = %v, want ErrKilled", err)
	}
	if err := r.Kill(ctx, "k-1"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("second Kill = %v, want ErrNotFound", err)
	}
	f := probeFn("crash")
	f.Env = map[string]string{"PROBE_MODE": "exit"}
	crash, err := r.Create(ctx, runtime.Spec{ID: "c-1", Function: f})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-crash.Exited:
	case <-ctx.Done():
		t.Fatal("a crashing sandbox's Exited did not close")
	}
	if err := crash.ExitErr(); err == nil || errors.Is(err, runtime.ErrKilled) || !strings.Contains(err.Error(), "status 3") {
		t.Errorf("crash ExitErr = %v, want exit status 3", err)
	}
	// A missing command is reported by Create, from inside the sandbox.
	bad := probeFn("bad")
	bad.Command = []string{"/no/such/binary"}
	if _, err := r.Create(ctx, runtime.Spec{ID: "b-1", Function: bad}); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("Create of a missing binary = %v, want 'no such file'", err)
	}
}

// TestRestartAdopts abandons a runtime with a sandbox and parked shells, as
// kill -9 of the worker would, and starts another on the same state: the
// sandbox is adopted and still serves, the parked shells are reaped.
func TestRestartAdopts(t *testing.T) {
	testutil.RequiresRoot(t)
	state, pcfg := t.TempDir(), poolConfig()
	p1, err := netpool.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p1.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	r1, err := New(Config{StateDir: state, Pool: p1, Shells: 3, InitArgv: []string{exe, nsinit.Subcommand}})
	if err != nil {
		t.Fatal(err)
	}
	r1.Start()
	inst := start(t, r1, "a-1", probeFn("a"))
	// A recorded sandbox that ends while the worker is down.
	dead := start(t, r1, "dead-1", probeFn("a"))
	waitFor(t, "3 parked shells", func() bool { return len(r1.ready) == 3 })
	parked := []int{}
	for range 3 {
		sh := <-r1.ready
		parked = append(parked, sh.pid)
		r1.ready <- sh
	}
	r1.stop() // stop the refiller and the table writer; the shells and the sandbox stay, as after kill -9
	r1.wg.Wait()
	r1.mu.Lock()
	deadPid := r1.sandboxes["dead-1"].sh.pid
	r1.mu.Unlock()
	_ = syscall.Kill(deadPid, syscall.SIGKILL)
	<-dead.Exited
	// A sandbox started after the last table write is reaped, not adopted.
	sh := <-r1.ready
	lost, err := r1.Create(context.Background(), runtime.Spec{ID: "lost-1", Function: probeFn("a")})
	if err != nil {
		t.Fatal(err)
	}
	_ = sh

	r2 := newRuntime(t, newPool(t, pcfg), state, true)
	// Adoption tore the dead sandbox down; it kept no cgroup as a spare,
	// for it removes every cgroup it does not adopt right after.
	for range len(r2.spareCgroups) {
		sp := <-r2.spareCgroups
		for _, d := range sp.cg.Dirs() {
			if _, err := os.Stat(d); err != nil {
				t.Errorf("spare cgroup after restart: %v", err)
			}
		}
		r2.spareCgroups <- sp
	}
	ls, err := r2.List(context.Background())
	if err != nil || len(ls) != 1 || ls[0].ID != "a-1" || !ls[0].Running || ls[0].Addr != inst.Addr || ls[0].Function != "a" || ls[0].Revision != 1 {
		t.Fatalf("List after restart = %+v, %v", ls, err)
	}
	if got := probe(t, inst.Addr); got["sandbox"] != "a-1" {
		t.Errorf("adopted sandbox answers %v", got)
	}
	select {
	case <-lost.Exited:
	case <-time.After(waitLong):
		t.Fatal("an unrecorded sandbox of the earlier worker was not reaped")
	}
	for _, pid := range parked {
		waitFor(t, fmt.Sprintf("parked init %d reaped", pid), func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || strings.Contains(string(b), ") Z ")
		})
	}
	gone, _, ok := r2.Watch("a-1")
	if !ok {
		t.Fatal("Watch of an adopted sandbox: not ok")
	}
	if err := r2.Kill(context.Background(), "a-1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(waitLong):
		t.Fatal("Watch channel did not close after Kill")
	}
	if names := r2.cg.List(r2.prefix); len(names) > len(r2.ready)+len(r2.spareCgroups)+1 {
		t.Errorf("cgroups left: %v", names)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSeccompProfile(t *testing.T) {
	prog, err := defaultSeccomp()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) < 100 {
		t.Errorf("default profile compiled to %d instructions; want the whole allow list", len(prog))
	}
}

// A sandbox's network is one functions can use: /etc/resolv.conf names the
// pool's DNS forwarder and /etc/hosts the sandbox itself, names resolve,
// and connections beyond the host go out (to a fake internet the test
// makes); the host's own ports are refused at once.
func TestNetworkEgressAndDNS(t *testing.T) {
	f := fakenet.Start(t, 40)
	pcfg := poolConfig()
	pcfg.Egress, pcfg.DNS, pcfg.DNSUpstreams = true, true, []string{f.DNS}
	r := newRuntime(t, newPool(t, pcfg), t.TempDir(), true)
	inst := start(t, r, "net-1", probeFn("net"))
	gw := pcfg.Subnet.Addr().Next()
	host := netip.AddrPortFrom(gw, hostPort(t)).String() // the host's address the sandbox knows
	q := url.Values{"name": {"web." + fakenet.Zone}, "url": {"http://web.fake.test/"}, "dial": {host}}
	c := http.Client{Timeout: time.Minute}
	resp, err := c.Get("http://" + inst.Addr + "/net?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if rc := got["/etc/resolv.conf"]; !strings.Contains(rc, "nameserver "+gw.String()+"\n") {
		t.Errorf("resolv.conf %q, want the gateway %v", rc, gw)
	}
	if h := got["/etc/hosts"]; !strings.Contains(h, "localhost") || !strings.Contains(h, "\tnet-1\n") {
		t.Errorf("hosts %q, want localhost and the sandbox's name", h)
	}
	if got["lookup"] != f.Addr.String() {
		t.Errorf("lookup from the sandbox: %q, want %v", got["lookup"], f.Addr)
	}
	if got["fetch"] != "hello from the internet" {
		t.Errorf("fetch from the sandbox: %q", got["fetch"])
	}
	if d := got["dial"]; !strings.Contains(d, "connection refused") {
		t.Errorf("dial of the host's %s: %q, want refused at once", host, d)
	}
}

// hostPort listens on every address of the host (the pool's gateway
// among them) and returns the port.
func hostPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, testutil.Greet(""))
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

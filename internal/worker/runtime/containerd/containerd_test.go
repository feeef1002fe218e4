package containerd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/vishvananda/netlink"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The tests run in a namespace of their own, so that they neither see nor
// disturb a brisk worker (or the e2e tests) on the same containerd, and with
// network pools named "bc<n>" on bridges "bcbr<n>" in 10.213.<n>.0/24.
const (
	testNamespace = "brisk-test"
	echoRef       = image.LocalDomain + "/containerd-test-echo:latest"
	netPrefix     = "bc"
	waitLong      = 60 * time.Second // only bounds failing tests
)

var (
	echoBin   string // testdata/echo, static
	setupOnce sync.Once
	setupErr  error
	client    *containerd.Client
	poolSeq   atomic.Int32
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "brisk-containerd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	echoBin = filepath.Join(dir, "echo")
	if err := testutil.GoBuild("./testdata/echo", echoBin, true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if client != nil {
		if leaks := leaks(); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "LEAK CHECK FAILED after the suite:\n  %s\n", strings.Join(leaks, "\n  "))
			code = 1
		} else {
			fmt.Fprintln(os.Stderr, "leak check: no containers, tasks, active snapshots, namespaces or links left")
		}
		client.Close()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// setup connects to containerd and imports the echo image once; tests that
// need containerd call it after testutil.RequiresRoot.
func setup(t testing.TB) {
	t.Helper()
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c, err := containerd.New(image.DefaultContainerdAddress, containerd.WithTimeout(10*time.Second))
		if err != nil {
			setupErr = fmt.Errorf("containerd at %s (make test starts it: scripts/setup.sh --test): %w",
				image.DefaultContainerdAddress, err)
			return
		}
		client = c
		img, err := image.Build(image.Options{Path: echoBin, Env: []string{"IMAGE_ENV=from-image"}, ExposedPorts: []int{8080}})
		if err != nil {
			setupErr = err
			return
		}
		archive := filepath.Join(filepath.Dir(echoBin), "echo.tar")
		if setupErr = image.WriteArchive(archive, img, echoRef); setupErr != nil {
			return
		}
		f, err := os.Open(archive)
		if err != nil {
			setupErr = err
			return
		}
		defer f.Close()
		_, setupErr = image.Import(ctx, client, testNamespace, image.DefaultSnapshotter, f)
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

func poolConfig(size int) netpool.Config {
	n := poolSeq.Add(1)
	return netpool.Config{
		Size:       size,
		Bridge:     fmt.Sprintf("%sbr%d", netPrefix, n),
		Subnet:     netip.MustParsePrefix(fmt.Sprintf("10.213.%d.0/24", n)),
		NamePrefix: fmt.Sprintf("%s%d", netPrefix, n),
	}
}

// newPool starts a network pool that is closed when the test ends.
func newPool(t testing.TB, size int) *netpool.Pool {
	t.Helper()
	return newPoolFrom(t, poolConfig(size), true)
}

// newPoolFrom makes a pool of cfg, started or not, closed when the test ends.
func newPoolFrom(t testing.TB, cfg netpool.Config, start bool) *netpool.Pool {
	t.Helper()
	p, err := netpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if start {
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
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

// newRuntime returns a runtime whose sandboxes are all killed, and which is
// closed, when the test ends (before its pool closes).
func newRuntime(t testing.TB, pool *netpool.Pool, stateDir string) *Runtime {
	t.Helper()
	setup(t)
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	r, err := New(context.Background(), Config{Namespace: testNamespace, StateDir: stateDir, Pool: pool, KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { killAll(t, r); r.Close() })
	return r
}

func killAll(t testing.TB, r *Runtime) {
	if r.closed.Load() { // a test closed it to "restart"; its successor cleans up
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	list, err := r.List(ctx)
	if err != nil {
		t.Errorf("cleanup List: %v", err)
	}
	for _, l := range list {
		if err := r.Kill(ctx, l.ID); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("cleanup Kill %s: %v", l.ID, err)
		}
	}
}

func echoFn(name string, env map[string]string) *spec.Function {
	f := &spec.Function{Name: name, Image: echoRef, Env: env, Revision: 3}
	f.ApplyDefaults()
	return f
}

var idSeq atomic.Int64

// newID is unique across the runs of this package on one containerd.
func newID() string {
	return fmt.Sprintf("ctrtest-%d-%d", os.Getpid(), idSeq.Add(1))
}

func create(t testing.TB, r *Runtime, id string, f *spec.Function) *runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, runtime.Spec{ID: id, Function: f})
	if err != nil {
		t.Fatalf("Create %s: %v", id, err)
	}
	return inst
}

func createReady(t testing.TB, r *Runtime, id string, f *spec.Function) *runtime.Instance {
	t.Helper()
	inst := create(t, r, id, f)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		logs, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", f.Name, id+".log"))
		t.Fatalf("WaitReady %s: %v (ExitErr %v; log %q)", id, err, inst.ExitErr(), logs)
	}
	return inst
}

type echoReply struct {
	PID          int    `json:"pid"`
	Hostname     string `json:"hostname"`
	Port         string `json:"port"`
	Sandbox      string `json:"sandbox"`
	Function     string `json:"function"`
	EchoEnv      string `json:"echo_env"`
	ImageEnv     string `json:"image_env"`
	RootWritable bool   `json:"root_writable"`
	TmpWritable  bool   `json:"tmp_writable"`
}

var httpClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(t testing.TB, addr string) echoReply {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %s", addr, resp.Status, body)
	}
	var rep echoReply
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatalf("GET %s: %v in %q", addr, err, body)
	}
	return rep
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func nsCtx() context.Context { return namespaces.WithNamespace(context.Background(), testNamespace) }

// leftovers lists what containerd still has of a sandbox: its container,
// its task, its snapshot.
func leftovers(t testing.TB, id string) []string {
	t.Helper()
	ctx := nsCtx()
	var out []string
	if _, err := client.LoadContainer(ctx, id); err == nil {
		out = append(out, "container "+id)
	}
	if _, err := client.TaskService().Get(ctx, &tasks.GetRequest{ContainerID: id}); err == nil {
		out = append(out, "task "+id)
	}
	if _, err := client.SnapshotService(image.DefaultSnapshotter).Stat(ctx, id); err == nil {
		out = append(out, "snapshot "+id)
	}
	return out
}

func TestCreateServesThroughPooledEndpoint(t *testing.T) {
	testutil.RequiresRoot(t)
	pool := newPool(t, 2)
	r := newRuntime(t, pool, "")
	id := newID()
	f := echoFn("echo", map[string]string{"ECHO_ENV": "from-spec", "PORT": "1"}) // PORT is the runtime's
	f.Port = 9000
	f.Resources = spec.Resources{MilliCPU: 100, MemoryMB: 64}
	f.Limits = spec.Resources{MilliCPU: 250}
	inst := createReady(t, r, id, f)

	host, port, _ := net.SplitHostPort(inst.Addr)
	ip := netip.MustParseAddr(host)
	if !netip.MustParsePrefix("10.213.0.0/16").Contains(ip) || port != "9000" {
		t.Errorf("Addr = %s, want an address of the pool's subnet and port 9000", inst.Addr)
	}
	rep := get(t, inst.Addr)
	want := echoReply{PID: 1, Hostname: id, Port: "9000", Sandbox: id, Function: "echo", EchoEnv: "from-spec",
		ImageEnv: "from-image", RootWritable: false, TmpWritable: true}
	if rep != want {
		t.Errorf("sandbox sees %+v\nwant %+v", rep, want)
	}
	if st := pool.Stats(); st.InUse != 1 {
		t.Errorf("pool InUse = %d with one sandbox", st.InUse)
	}

	// Labels and limits.
	c, err := client.LoadContainer(nsCtx(), id)
	if err != nil {
		t.Fatal(err)
	}
	labels, _ := c.Labels(nsCtx())
	for k, v := range map[string]string{LabelSandbox: id, LabelFunction: "echo", LabelRevision: "3", LabelState: r.cfg.StateDir} {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
	if labels[LabelNetNS] == "" {
		t.Errorf("no %s label", LabelNetNS)
	}
	s, err := c.Spec(nsCtx())
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.Seccomp == nil || s.Process.Capabilities == nil || !s.Root.Readonly {
		t.Errorf("spec lacks the default seccomp profile, capabilities or a read-only root")
	}
	if r.v2 {
		checkFile(t, filepath.Join(cgroupRoot, sbCgroup(r, id), "memory.max"), strconv.Itoa(64<<20))
		checkFile(t, filepath.Join(cgroupRoot, sbCgroup(r, id), "cpu.max"), "25000 100000")
	} else {
		checkFile(t, filepath.Join(cgroupRoot, "memory", sbCgroup(r, id), "memory.limit_in_bytes"), strconv.Itoa(64<<20))
		checkFile(t, filepath.Join(cgroupRoot, "cpu", sbCgroup(r, id), "cpu.cfs_quota_us"), "25000")
	}

	list, err := r.List(context.Background())
	if err != nil || len(list) != 1 || list[0] != (runtime.Listed{ID: id, Function: "echo", Revision: 3, Addr: inst.Addr, Running: true}) {
		t.Errorf("List = %+v, %v", list, err)
	}

	if err := r.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if !closed(inst.Exited) || !errors.Is(inst.ExitErr(), ErrKilled) {
		t.Errorf("after Kill: Exited closed %v, ExitErr %v", closed(inst.Exited), inst.ExitErr())
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after Kill: %v", l)
	}
	testutil.Eventually(t, waitLong, func() bool { return pool.Stats().InUse == 0 }, "endpoint not released")
	if err := r.Kill(context.Background(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("second Kill = %v, want ErrNotFound", err)
	}
	if list, _ := r.List(context.Background()); len(list) != 0 {
		t.Errorf("List after Kill = %+v", list)
	}
}

func sbCgroup(r *Runtime, id string) string { return "/" + r.cfg.Namespace + "/" + id }

func checkFile(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("limit: %v", err)
		return
	}
	if got := strings.TrimSpace(string(b)); got != want {
		t.Errorf("%s = %q, want %q", path, got, want)
	}
}

func TestOOMKillIsReported(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, newPool(t, 1), "")
	f := echoFn("hog", map[string]string{"ECHO_MODE": "hog"})
	f.Resources.MemoryMB = 32
	id := newID()
	inst := create(t, r, id, f)
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "memory hog never ended")
	err := inst.ExitErr()
	t.Logf("ExitErr: %v", err)
	if !errors.Is(err, ErrOOMKilled) || !strings.Contains(err.Error(), "OOM-killed") {
		logs, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", "hog", id+".log"))
		t.Fatalf("ExitErr = %v, want ErrOOMKilled (log: %q)", err, logs)
	}
	if err := r.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill after OOM: %v", err)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after Kill: %v", l)
	}
}

func TestExitIsReported(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, newPool(t, 1), "")
	id := newID()
	inst := create(t, r, id, echoFn("crash", map[string]string{"ECHO_MODE": "exit"}))
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "exit never reported")
	if err := inst.ExitErr(); err == nil || err.Error() != "exited with status 3" {
		t.Errorf("ExitErr = %v, want exited with status 3", err)
	}
	if err := r.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill after exit: %v", err)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after Kill: %v", l)
	}
}

// A container that floods its output (256 MiB as fast as it can) puts at
// most the log pipe's burst and rate into its log (issue 36: containerd
// sandboxes' logs were not rate-limited, only capped every second), its
// writes succeed, and the log says how much was dropped.
func TestFloodingContainerIsBounded(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	r := newRuntime(t, newPool(t, 1), dir)
	id := newID()
	start := time.Now()
	inst := create(t, r, id, echoFn("flood", map[string]string{"ECHO_MODE": "flood"}))
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "the flooding container did not finish: its writes were held up")
	if err := inst.ExitErr(); err == nil || !strings.Contains(err.Error(), "status 0") {
		t.Fatalf("the flooding container ended with %v, want status 0 (its writes must succeed)", err)
	}
	logpipe.Wait()
	took := time.Since(start)
	path := filepath.Join(r.LogDir(), "flood", id+".log")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	bound := logpipe.Default.Burst + int64(took.Seconds()*float64(logpipe.Default.Rate)) + 64<<10
	if st.Size() > bound {
		t.Fatalf("%d bytes in the log after %v; bound %d", st.Size(), took, bound)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b[max(0, len(b)-4096):]), "bytes of this sandbox's output dropped") {
		t.Fatal("the log does not say what was dropped")
	}
	if err := r.Kill(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	t.Logf("256 MiB written in %v; %d bytes kept", took, st.Size())
}

func TestRestartAdoptsRunningSandboxes(t *testing.T) {
	testutil.RequiresRoot(t)
	pool := newPool(t, 1)
	dir := t.TempDir()
	r1 := newRuntime(t, pool, dir)
	id := newID()
	inst := createReady(t, r1, id, echoFn("adopted", nil))
	r1.Close() // the worker "restarts" in this process, on the same pool

	r2 := newRuntime(t, pool, dir)
	list, err := r2.List(context.Background())
	if err != nil || len(list) != 1 || list[0] != (runtime.Listed{ID: id, Function: "adopted", Revision: 3, Addr: inst.Addr, Running: true}) {
		t.Fatalf("List after restart = %+v, %v", list, err)
	}
	if rep := get(t, inst.Addr); rep.Sandbox != id {
		t.Errorf("adopted sandbox answers as %q", rep.Sandbox)
	}
	if err := r2.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill adopted: %v", err)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after Kill: %v", l)
	}
	testutil.Eventually(t, waitLong, func() bool { return pool.Stats().InUse == 0 }, "adopted endpoint not released")
}

// TestRestartInANewProcessAdopts stands for a restarted worker process: a
// new Pool, built but not started, adopts the running sandbox's network
// endpoint by name, so the new Runtime takes the sandbox over with its
// address; the Pool's Start then reaps only the other leftovers.
func TestRestartInANewProcessAdopts(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	cfg := poolConfig(1)
	old := newPoolFrom(t, cfg, true)
	r1 := newRuntime(t, old, dir)
	id := newID()
	inst := createReady(t, r1, id, echoFn("adopted", nil))
	testutil.Eventually(t, waitLong, func() bool { return old.Stats().Ready == 1 }, "old pool refilled")
	r1.Close()

	pool := newPoolFrom(t, cfg, false) // the same configuration, not started yet
	r2 := newRuntime(t, pool, dir)
	if err := pool.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	list, err := r2.List(context.Background())
	if err != nil || len(list) != 1 || list[0] != (runtime.Listed{ID: id, Function: "adopted", Revision: 3, Addr: inst.Addr, Running: true}) {
		t.Fatalf("List after restart = %+v, %v", list, err)
	}
	if rep := get(t, inst.Addr); rep.Sandbox != id {
		t.Errorf("adopted sandbox answers as %q", rep.Sandbox)
	}
	if st := pool.Stats(); st.InUse != 1 {
		t.Errorf("new pool stats %+v: want the adopted endpoint in use", st)
	}
	if err := r2.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill adopted: %v", err)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after Kill: %v", l)
	}
	testutil.Eventually(t, waitLong, func() bool { return pool.Stats().InUse == 0 }, "adopted endpoint not released")
}

// TestRestartKillsLeftoversItCannotAdopt stands for a restarted worker
// process whose new pool started before the runtime was built: the old
// sandbox's namespace is reaped, so the sandbox cannot keep its network and
// is torn down rather than leaked.
func TestRestartKillsLeftoversItCannotAdopt(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	r1 := newRuntime(t, newPool(t, 1), dir)
	id := newID()
	createReady(t, r1, id, echoFn("orphan", nil))
	r1.Close()

	r2 := newRuntime(t, newPool(t, 1), dir)
	if list, err := r2.List(context.Background()); err != nil || len(list) != 0 {
		t.Fatalf("List after restart = %+v, %v; want the leftover removed", list, err)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after restart: %v", l)
	}
}

func TestMissingImageFailsClearly(t *testing.T) {
	testutil.RequiresRoot(t)
	pool := newPool(t, 0)
	r := newRuntime(t, pool, "")
	f := echoFn("missing", nil)
	// A registry address on loopback where nothing listens: the pull is
	// attempted and fails without leaving the machine.
	f.Image = "127.0.0.1:1/brisk-test/missing:latest"
	id := newID()
	_, err := r.Create(context.Background(), runtime.Spec{ID: id, Function: f})
	if err == nil || !strings.Contains(err.Error(), f.Image) || !strings.Contains(err.Error(), "brisk image") {
		t.Fatalf("Create = %v, want an error naming the image and how to import it", err)
	}
	t.Log(err)
	if st := pool.Stats(); st.InUse != 0 {
		t.Errorf("pool InUse = %d after a failed Create", st.InUse)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after failed Create: %v", l)
	}
}

func TestConcurrentCreatesAndKills(t *testing.T) {
	testutil.RequiresRoot(t)
	pool := newPool(t, 4)
	r := newRuntime(t, pool, "")
	const n = 8 // more than the pool holds: some namespaces come on demand
	var wg sync.WaitGroup
	ids := make([]string, n)
	addrs := make([]string, n)
	for i := range n {
		ids[i] = newID()
		wg.Add(1)
		go func() {
			defer wg.Done()
			addrs[i] = createReady(t, r, ids[i], echoFn("many", nil)).Addr
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, a := range addrs {
		if rep := get(t, a); rep.Sandbox != ids[i] {
			t.Errorf("%s answers as %q", a, rep.Sandbox)
		}
		seen[a] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct addresses for %d sandboxes", len(seen), n)
	}
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Kill(context.Background(), id); err != nil {
				t.Errorf("Kill %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if l := leftovers(t, id); len(l) > 0 {
			t.Errorf("left after Kill: %v", l)
		}
	}
	testutil.Eventually(t, waitLong, func() bool { return pool.Stats().InUse == 0 }, "endpoints not released")
}

// leaks lists what the suite left in its containerd namespace and kernel.
func leaks() []string {
	ctx := nsCtx()
	var out []string
	cs, err := client.Containers(ctx)
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	for _, c := range cs {
		out = append(out, "container "+c.ID())
	}
	tasks, err := client.TaskService().List(ctx, nil)
	if err == nil {
		for _, tk := range tasks.Tasks {
			out = append(out, "task "+tk.ID)
		}
	}
	_ = client.SnapshotService(image.DefaultSnapshotter).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind != snapshots.KindCommitted { // image layers stay cached
			out = append(out, fmt.Sprintf("snapshot %s (%v)", i.Name, i.Kind))
		}
		return nil
	})
	if ents, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range ents {
			if ownName(e.Name()) {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if ownName(l.Attrs().Name) {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
	}
	return out
}

// ownName matches the names this suite's pools use: bc<n>-<i>, bcbr<n>.
func ownName(name string) bool {
	rest, ok := strings.CutPrefix(name, netPrefix)
	if !ok {
		return false
	}
	rest = strings.TrimPrefix(rest, "br")
	num, _, _ := strings.Cut(rest, "-")
	_, err := strconv.Atoi(num)
	return err == nil
}

// TestCreateCutShortLeavesNothing ends Create's ctx at various points of
// its work: each Create either succeeds or leaves no container, task,
// snapshot or leased endpoint behind.
func TestCreateCutShortLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t)
	pool := newPool(t, 2)
	r := newRuntime(t, pool, "")
	for _, d := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond, 120 * time.Millisecond} {
		id := newID()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_, err := r.Create(ctx, runtime.Spec{ID: id, Function: echoFn("cut", nil)})
		cancel()
		if err == nil {
			if err := r.Kill(context.Background(), id); err != nil {
				t.Fatalf("Kill %s: %v", id, err)
			}
		}
		t.Logf("deadline %v: %v", d, err)
		if l := leftovers(t, id); len(l) > 0 {
			t.Errorf("deadline %v: left %v", d, l)
		}
		if list, _ := r.List(context.Background()); len(list) != 0 {
			t.Errorf("deadline %v: List = %+v", d, list)
		}
		testutil.Eventually(t, waitLong, func() bool { return pool.Stats().InUse == 0 }, "endpoint of %s not released", id)
	}
}

// A function that asks for a writable root gets one (its own copy-on-write
// layer); everything else about the sandbox is unchanged.
func TestWritableRootOnRequest(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, newPool(t, 1), "")
	id := newID()
	f := echoFn("rw", nil)
	f.WritableRoot = true
	inst := createReady(t, r, id, f)
	rep := get(t, inst.Addr)
	if !rep.RootWritable || !rep.TmpWritable || rep.Sandbox != id {
		t.Fatalf("sandbox with writable_root reports %+v: want a writable root and /tmp", rep)
	}
	c, err := client.LoadContainer(nsCtx(), id)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Spec(nsCtx())
	if err != nil || s.Root.Readonly || s.Linux.Seccomp == nil {
		t.Fatalf("spec %v, %v: want a writable root and the default seccomp profile", s.Root, err)
	}
}

// A sandbox's cgroup bounds its processes (cgroups.DefaultMaxPids): a
// fork bomb fails inside it instead of taking the node's pids.
func TestPidsLimited(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, newPool(t, 1), "")
	id := newID()
	createReady(t, r, id, echoFn("pids", nil))
	t.Cleanup(func() { _ = r.Kill(context.Background(), id) })
	cg := "/" + r.cfg.Namespace + "/" + id
	path := filepath.Join("/sys/fs/cgroup", cg, "pids.max")
	if !r.v2 {
		path = filepath.Join("/sys/fs/cgroup/pids", cg, "pids.max")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the sandbox's pids limit: %v", err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(cgroups.DefaultMaxPids) {
		t.Fatalf("%s = %q, want %d", path, got, cgroups.DefaultMaxPids)
	}
}

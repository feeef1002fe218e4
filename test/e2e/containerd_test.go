package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/snapshots"
	"github.com/vishvananda/netlink"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
)

// The containerd e2e test keeps to a containerd namespace and network names
// of its own, so it runs beside a real worker or the runtime's tests.
const (
	e2eNamespace = "brisk-e2e"
	e2eNetPrefix = "be"
)

// containerdArgs run the worker of `brisk up` on containerd, in the test's
// namespace, with a small pool on a bridge and subnet of its own.
var containerdArgs = []string{"--runtime", "containerd", "--containerd-namespace", e2eNamespace,
	"--net-prefix", e2eNetPrefix, "--net-bridge", e2eNetPrefix + "br0", "--net-subnet", "10.214.0.0/24", "--net-pool", "4"}

// TestContainerdFunctionLifecycle runs the trace function as an image on
// real containerd: `brisk image build trace`, cold and warm calls, scale out
// and back to zero, an image pushed to the worker over gRPC, and a leak check
// after the cluster stops.
func TestContainerdFunctionLifecycle(t *testing.T) {
	ctr := containerdClient(t)
	c := newCluster(t)

	// The trace image, built from this brisk and imported before the worker
	// starts: a worker finds images already in its containerd.
	out := c.mustBrisk(t, "image", "build", "trace", "--data-dir", c.dataDir, "--containerd-namespace", e2eNamespace)
	t.Log(strings.TrimSpace(out))
	// A second image, written only as an archive: the push brings it to
	// the worker.
	pushed := filepath.Join(c.dataDir, "pushed.tar")
	c.mustBrisk(t, "image", "build", "trace", "--tag", "brisk.local/pushed:latest", "--out", pushed)

	p := c.up(t, containerdArgs...)
	c.mustBrisk(t, "fn", "deploy", "hello", "--image", image.TraceRef, "--memory", "64",
		"--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")

	first := c.invoke(t, "hello", `{"ms": 20}`)
	if first.status != 200 || !first.cold || first.sandbox == "" || first.reply.Sandbox != first.sandbox {
		t.Fatalf("first call: status %d cold=%v sandbox=%q body=%s", first.status, first.cold, first.sandbox, first.body)
	}
	// A second cluster on this host with the same sandbox network is
	// refused before it touches the first's namespaces or bridge.
	c2 := newCluster(t)
	second := startBrisk(t, append(append([]string{"up", "--invoke", c2.invokeAddr}, c2.cpArgs()...), containerdArgs...)...)
	select {
	case <-second.done:
	case <-time.After(time.Minute):
		t.Fatal("a second cluster with the same sandbox network kept running")
	}
	if out := second.out.String(); !strings.Contains(out, "in use by another brisk worker") || !strings.Contains(out, c.dataDir) {
		t.Fatalf("the second cluster's refusal does not say why or who holds the network:\n%s", tail(out, 2000))
	}
	if again := c.invoke(t, "hello", `{"ms": 1}`); again.status != 200 || again.sandbox != first.sandbox {
		t.Fatalf("the first cluster after the second was refused: status %d sandbox %q", again.status, again.sandbox)
	}
	for i := 0; i < 5; i++ {
		w := c.invoke(t, "hello", `{"ms": 1}`)
		if w.status != 200 || w.cold || w.sandbox != first.sandbox {
			t.Fatalf("warm call %d: status %d cold=%v sandbox %q (want %q)", i, w.status, w.cold, w.sandbox, first.sandbox)
		}
	}
	if n := containers(t, ctr); len(n) != 1 || n[0] != first.sandbox {
		t.Fatalf("containers in %s = %v, want [%s]", e2eNamespace, n, first.sandbox)
	}

	// Three concurrent clients, concurrency 1 per sandbox: three sandboxes.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var failures atomic.Int64
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400 && !stop.Load(); i++ {
				resp, err := http.Post("http://"+c.invokeAddr+"/function/hello", "application/json", strings.NewReader(`{"ms": 150}`))
				if err != nil {
					failures.Add(1)
					continue
				}
				if resp.StatusCode != 200 {
					failures.Add(1)
				}
				resp.Body.Close()
			}
		}()
	}
	// One container per ready sandbox: the autoscaler may go past 3 for
	// a moment (a sandbox being made or drained has its container too).
	var last []string
	eventually(t, 60*time.Second, "3 ready sandboxes, 3 containers, under 3 concurrent clients", func() bool {
		if c.fn(t, "hello").Status.Ready != 3 {
			return false
		}
		last = containers(t, ctr)
		return len(last) == 3
	})
	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d calls failed under load (containers %v)", n, last)
	}

	// Idle: back to zero, containers gone.
	eventually(t, 60*time.Second, "scale to zero", func() bool {
		v := c.fn(t, "hello")
		return v.Status.Desired == 0 && v.Status.Ready == 0 && len(containers(t, ctr)) == 0
	})
	cold := c.invoke(t, "hello", `{"ms": 1}`)
	if cold.status != 200 || !cold.cold {
		t.Fatalf("call after scale to zero: status %d cold=%v body=%s", cold.status, cold.cold, cold.body)
	}

	// An image the worker has never seen, pushed over its gRPC endpoint.
	out = c.mustBrisk(t, "image", "push", pushed, "--to-workers", "--data-dir", c.dataDir) // the cluster CA: workers take images from control planes only
	if !strings.Contains(out, "brisk.local/pushed:latest") {
		t.Fatalf("push output %q does not name the image", out)
	}
	c.mustBrisk(t, "fn", "deploy", "pushed", "--image", "brisk.local/pushed:latest")
	if inv := c.invoke(t, "pushed", `{"ms": 1}`); inv.status != 200 || inv.reply.Sandbox == "" {
		t.Fatalf("call to the pushed image: status %d body=%s", inv.status, inv.body)
	}

	// Stopping `brisk up` stops its sandboxes and its network pool: nothing
	// of the test may be left.
	p.stop(syscall.SIGTERM)
	if leaks := containerdLeaks(ctr); len(leaks) > 0 {
		t.Fatalf("left after the cluster stopped:\n  %s", strings.Join(leaks, "\n  "))
	}
}

// containerdClient connects to the machine's containerd, as root, closed
// with the test.
func containerdClient(t *testing.T) *containerd.Client {
	t.Helper()
	testutil.RequiresRoot(t)
	ctr, err := containerd.New(image.DefaultContainerdAddress, containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("containerd at %s (CI starts it in .ci/run): %v", image.DefaultContainerdAddress, err)
	}
	t.Cleanup(func() { ctr.Close() })
	return ctr
}

func nsCtx() context.Context { return namespaces.WithNamespace(context.Background(), e2eNamespace) }

// containers lists the container ids in the test's namespace.
func containers(t *testing.T, ctr *containerd.Client) []string {
	t.Helper()
	return containersTB(t, ctr)
}

func containersTB(tb testing.TB, ctr *containerd.Client) []string {
	cs, err := ctr.Containers(nsCtx())
	if err != nil {
		tb.Fatalf("list containers: %v", err)
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID())
	}
	sort.Strings(ids)
	return ids
}

// containerdLeaks lists the test's containers, tasks, rootfs snapshots
// (image layers stay cached), network namespaces and links.
func containerdLeaks(ctr *containerd.Client) []string {
	var out []string
	cs, err := ctr.Containers(nsCtx())
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	for _, c := range cs {
		out = append(out, "container "+c.ID())
	}
	if ts, err := ctr.TaskService().List(nsCtx(), nil); err == nil {
		for _, tk := range ts.Tasks {
			out = append(out, "task "+tk.ID)
		}
	}
	_ = ctr.SnapshotService(image.DefaultSnapshotter).Walk(nsCtx(), func(_ context.Context, i snapshots.Info) error {
		if i.Kind != snapshots.KindCommitted {
			out = append(out, "snapshot "+i.Name)
		}
		return nil
	})
	own := func(name string) bool { return strings.HasPrefix(name, e2eNetPrefix+"-") || name == e2eNetPrefix+"br0" }
	if ents, err := os.ReadDir("/var/run/netns"); err == nil {
		for _, e := range ents {
			if own(e.Name()) {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if own(l.Attrs().Name) {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
	}
	return out
}

// BenchmarkContainerdColdStart measures cold starts end to end on
// containerd: request in → response out at the client, for a call to a
// function that has no sandbox (deployed just before; deletion and teardown
// of the previous one finish, untimed, before the next call).
//
//	go test -run '^$' -bench ContainerdColdStart -benchtime 20x ./test/e2e/
func BenchmarkContainerdColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	ctr, err := containerd.New(image.DefaultContainerdAddress, containerd.WithTimeout(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer ctr.Close()
	dataDir := b.TempDir()
	admin, invoke, grpcAddr := freePort(b), freePort(b), freePort(b)
	registerAdmin(admin, dataDir)
	registerAdmin(invoke, dataDir)
	run := func(args ...string) string {
		cmd := exec.Command(briskBin, args...)
		cmd.Env = append(os.Environ(), "BRISK_ADMIN="+admin, "BRISK_INVOKE="+invoke,
			"BRISK_TOKEN_FILE="+filepath.Join(dataDir, api.AdminTokenFile))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("brisk %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("image", "build", "trace", "--data-dir", dataDir, "--containerd-namespace", e2eNamespace)
	up := exec.Command(briskBin, append([]string{"up", "--data-dir", dataDir, "--admin", admin, "--invoke", invoke, "--grpc", grpcAddr,
		"--log-level", "warn"}, containerdArgs...)...)
	var logs syncBuffer
	up.Stdout, up.Stderr = &logs, &logs
	if err := up.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = up.Process.Signal(syscall.SIGTERM)
		_ = up.Wait()
		if leaks := containerdLeaks(ctr); len(leaks) > 0 {
			b.Errorf("left after the cluster stopped: %v", leaks)
		}
	}()
	cl := client.New(admin, invoke)
	testutil.Eventually(b, 60*time.Second, func() bool {
		st, err := cl.Status(context.Background())
		return err == nil && len(st.Nodes) > 0 && st.Nodes[0].Connected && httpOK("http://"+invoke+"/healthz")
	}, "cluster healthy: %s", &logs)

	var lat, queue []time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		name := fmt.Sprintf("cold%d", i)
		run("fn", "deploy", name, "--image", image.TraceRef)
		b.StartTimer()
		t0 := time.Now()
		resp, err := http.Post("http://"+invoke+"/function/"+name, "application/json", strings.NewReader(`{"ms": 0}`))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		b.StopTimer()
		timing := resp.Header.Get("X-Brisk-Timing")
		if resp.StatusCode != 200 || !strings.Contains(timing, "cold=true") {
			b.Fatalf("call %d: %s, timing %q", i, resp.Status, timing)
		}
		lat = append(lat, d)
		if q, ok := timingField(timing, "queue_us"); ok {
			queue = append(queue, time.Duration(q)*time.Microsecond)
		}
		run("fn", "delete", name)
		testutil.Eventually(b, 60*time.Second, func() bool { return len(containersTB(b, ctr)) == 0 }, "sandbox of %s torn down", name)
		b.StartTimer()
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(queue, func(i, j int) bool { return queue[i] < queue[j] })
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
	if len(queue) > 0 {
		b.ReportMetric(float64(queue[len(queue)/2])/1e6, "p50-queue-ms")
	}
}

func timingField(h, key string) (int64, bool) {
	for _, f := range strings.Split(h, ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(f), "="); ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// TestContainerdWithNativeEmergency runs PulseNet's pairing: regular
// sandboxes in containerd, the emergency track on the native runtime's
// pooled shells (`--emergency-runtime native`). A dual-mode function's
// first calls at zero are served by one-shot native sandboxes, which never
// become containers, while its regular sandboxes do.
func TestContainerdWithNativeEmergency(t *testing.T) {
	ctr := containerdClient(t)
	c := newCluster(t)
	c.mustBrisk(t, "image", "build", "trace", "--data-dir", c.dataDir, "--containerd-namespace", e2eNamespace)
	p := c.up(t, append(slices.Clone(containerdArgs), "--emergency-runtime", "native", "--emergency-slots", "4")...)
	regular := emergencyThenRegular(t, c, 4)
	names := containers(t, ctr)
	if !slices.Contains(names, regular.sandbox) {
		t.Errorf("containers %v do not hold the regular sandbox %s", names, regular.sandbox)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "ei-") {
			t.Errorf("emergency sandbox %s became a container", n)
		}
	}
	p.stop(syscall.SIGTERM)
	if leaks := containerdLeaks(ctr); len(leaks) > 0 {
		t.Fatalf("left after the cluster stopped:\n  %s", strings.Join(leaks, "\n  "))
	}
}

// emergencyThenRegular is PulseNet's pairing as a user sees it, on a
// cluster whose worker has slots emergency slots: a dual-mode function
// "pair" at zero gets its first call served by an emergency sandbox (ei-,
// logged under the worker's emergency state, the native runtime's), and
// once a regular sandbox is ready the next call goes there, which it
// returns for the runtime's own checks.
func emergencyThenRegular(t *testing.T, c *cluster, slots int) invocation {
	t.Helper()
	// The worker's emergency track is known once its first heartbeat is in
	// (the data planes learn it with the same update); a call before that
	// would rightly go to the regular queue.
	eventually(t, 30*time.Second, "the worker's emergency slots reported", func() bool {
		st, err := c.cl.Status(context.Background())
		return err == nil && len(st.Nodes) == 1 && st.Nodes[0].Emergency != nil && st.Nodes[0].Emergency.Slots == slots
	})
	c.mustBrisk(t, "fn", "deploy", "pair", "--builtin", "trace", "--memory", "64", "--concurrency", "1",
		"--scaling-mode", "dual", "--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")

	first := c.invoke(t, "pair", `{"ms": 1}`)
	if first.status != 200 || !strings.HasPrefix(first.sandbox, "ei-") || first.reply.Sandbox != first.sandbox {
		t.Fatalf("first call at zero: status %d sandbox %q body=%s; want an emergency sandbox (ei-)", first.status, first.sandbox, first.body)
	}
	logs, _ := filepath.Glob(filepath.Join(c.dataDir, "worker", "emergency", "logs", "pair", "ei-*.log"))
	if len(logs) == 0 {
		t.Errorf("no native-runtime log of the emergency sandbox under %s", filepath.Join(c.dataDir, "worker", "emergency"))
	}
	// The metric filter counts the first call: a regular sandbox follows.
	eventually(t, 60*time.Second, "a regular sandbox after the emergency call", func() bool {
		return c.fn(t, "pair").Status.Ready >= 1
	})
	regular := c.invoke(t, "pair", `{"ms": 1}`)
	if regular.status != 200 || strings.HasPrefix(regular.sandbox, "ei-") {
		t.Fatalf("call with a regular sandbox ready: status %d sandbox %q body %q", regular.status, regular.sandbox, regular.body)
	}
	return regular
}

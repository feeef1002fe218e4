package containerd

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

var benchConcurrency = []int{1, 10, 50, 100}

// BenchmarkCreateToReady measures brisk's containerd runtime from Create to
// the sandbox's first HTTP 200 on its pooled address, conc sandboxes at a
// time, with a pool that holds conc ready namespaces and with an empty pool
// (every namespace made on demand); then, in the same run, raw containerd:
// container + task created and started from the same image with
// containerd's default spec and no brisk, in the host's network namespace
// (no network work at all) on a port of its own, timed to the same first
// HTTP 200; and the same with brisk's OCI spec (seccomp profile, read-only
// root, /tmp, limits): the difference between the two raw runs is the
// price of the hardening, the rest is brisk's. Metrics: p50/p99 latency per sandbox and creations/s
// over the timed batches; teardown is not timed.
//
//	go test -run '^$' -bench CreateToReady -benchtime 5x ./internal/worker/runtime/containerd/
func BenchmarkCreateToReady(b *testing.B) {
	testutil.RequiresRoot(b)
	setup(b)
	// Side by side per concurrency: the machine's noise drifts over minutes.
	for _, conc := range benchConcurrency {
		b.Run(fmt.Sprintf("conc=%d/pool=%d", conc, conc), func(b *testing.B) { benchBrisk(b, conc, conc) })
		b.Run(fmt.Sprintf("conc=%d/pool=0", conc), func(b *testing.B) { benchBrisk(b, 0, conc) })
		b.Run(fmt.Sprintf("conc=%d/raw", conc), func(b *testing.B) { benchRaw(b, conc, false) })
		b.Run(fmt.Sprintf("conc=%d/raw-brisk-spec", conc), func(b *testing.B) { benchRaw(b, conc, true) })
	}
}

func benchBrisk(b *testing.B, size, conc int) {
	pool := newPool(b, size)
	r := newRuntime(b, pool, "")
	f := echoFn("bench", nil)
	var lat []time.Duration
	var timed time.Duration
	var onDemand0 int64
	var createLat []time.Duration
	// One untimed batch first: it brings the pool to its steady state
	// (released namespaces recycled, so a batch's Takes trigger no refill)
	// and warms caches.
	for i := -1; i < b.N; i++ {
		b.StopTimer()
		// Steady state: the pool has refilled and finished recycling or
		// destroying the last batch's namespaces, so no network work of
		// an earlier batch competes with this one.
		released := int64(max(i, 0)+1) * int64(conc) // the warm-up batch's too
		if i < 0 {
			released = 0
		}
		testutil.Eventually(b, waitLong, func() bool {
			st := pool.Stats()
			return st.Ready >= int64(size) && st.Recycled+st.Destroyed >= released
		}, "pool refill")
		if i == 0 {
			onDemand0 = pool.Stats().CreatedOnDemand
		}
		ids := make([]string, conc)
		for i := range ids {
			ids[i] = newID()
		}
		d := make([]time.Duration, conc)
		created := make([]time.Duration, conc) // until Create returned
		errs := make([]error, conc)
		var wg sync.WaitGroup
		b.StartTimer()
		t0 := time.Now()
		for i := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				var createdAt time.Time
				createdAt, errs[i] = createToOK(r, ids[i], f)
				created[i], d[i] = createdAt.Sub(start), time.Since(start)
			}()
		}
		wg.Wait()
		timed += time.Since(t0)
		b.StopTimer()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		if i < 0 {
			timed = 0
		} else {
			lat = append(lat, d...)
			createLat = append(createLat, created...)
		}
		killIDs(b, r, ids)
		b.StartTimer()
	}
	report(b, lat, timed)
	slices.Sort(createLat)
	b.ReportMetric(float64(createLat[len(createLat)/2])/1e6, "create-p50-ms")
	st := pool.Stats()
	b.ReportMetric(float64(st.CreatedOnDemand-onDemand0)/float64(len(lat)), "ondemand-netns/sandbox")
}

// createToOK creates a sandbox and waits for its first HTTP 200. It returns
// when Create returned.
func createToOK(r *Runtime, id string, f *spec.Function) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, runtime.Spec{ID: id, Function: f})
	created := time.Now()
	if err != nil {
		return created, err
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		return created, fmt.Errorf("sandbox %s: %w", id, err)
	}
	resp, err := httpClient.Get("http://" + inst.Addr + "/")
	if err != nil {
		return created, fmt.Errorf("sandbox %s: %w", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return created, fmt.Errorf("sandbox %s: %s", id, resp.Status)
	}
	return created, nil
}

func killIDs(b *testing.B, r *Runtime, ids []string) {
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Kill(context.Background(), id); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
}

func benchRaw(b *testing.B, conc int, briskSpec bool) {
	ctx := nsCtx()
	img, err := client.GetImage(ctx, echoRef)
	if err != nil {
		b.Fatal(err)
	}
	opts := []oci.SpecOpts{oci.WithImageConfig(img)}
	if briskSpec {
		r := newRuntime(b, newPool(b, 0), "")
		opts = r.specOpts(img, runtime.Spec{ID: "raw", Function: echoFn("raw", nil)}, &sandbox{ep: &netpool.Endpoint{}, cgroup: "/" + testNamespace + "/raw"})
	}
	opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace))
	var lat []time.Duration
	var timed time.Duration
	for i := -1; i < b.N; i++ { // one untimed warm-up batch, as for brisk
		b.StopTimer()
		ids := make([]string, conc)
		for i := range ids {
			ids[i] = newID()
		}
		d := make([]time.Duration, conc)
		errs := make([]error, conc)
		tasks := make([]containerd.Task, conc)
		ports := testutil.FreePorts(b, conc)
		var wg sync.WaitGroup
		b.StartTimer()
		t0 := time.Now()
		for i := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				tasks[i], errs[i] = rawStartToOK(ctx, img, ids[i], ports[i], opts)
				d[i] = time.Since(start)
			}()
		}
		wg.Wait()
		timed += time.Since(t0)
		b.StopTimer()
		for i := range conc {
			wg.Add(1)
			go func() { defer wg.Done(); rawRemove(b, ctx, ids[i], tasks[i]) }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		if i < 0 {
			timed = 0
		} else {
			lat = append(lat, d...)
		}
		b.StartTimer()
	}
	report(b, lat, timed)
}

// rawStartToOK starts a container on the host's network listening on port
// and waits for its first HTTP 200, as createToOK does for brisk.
func rawStartToOK(ctx context.Context, img containerd.Image, id string, port int, opts []oci.SpecOpts) (containerd.Task, error) {
	t, err := rawStart(ctx, img, id, port, opts)
	if err != nil {
		return t, err
	}
	ctx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	exited := make(chan struct{}) // an exit shows up as the probe's timeout
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if err := runtime.WaitReady(ctx, addr, exited); err != nil {
		return t, fmt.Errorf("raw %s: %w", id, err)
	}
	resp, err := httpClient.Get("http://" + addr + "/")
	if err != nil {
		return t, fmt.Errorf("raw %s: %w", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return t, fmt.Errorf("raw %s: %s", id, resp.Status)
	}
	return t, nil
}

func rawStart(ctx context.Context, img containerd.Image, id string, port int, opts []oci.SpecOpts) (containerd.Task, error) {
	// A copy: concurrent callers share opts' backing array.
	opts = slices.Concat(opts, []oci.SpecOpts{oci.WithCgroup("/" + testNamespace + "/" + id), oci.WithEnv([]string{"PORT=" + strconv.Itoa(port)})})
	c, err := client.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(opts...))
	if err != nil {
		return nil, err
	}
	t, err := c.NewTask(ctx, cio.NullIO)
	if err != nil {
		return nil, err
	}
	return t, t.Start(ctx)
}

func rawRemove(b *testing.B, ctx context.Context, id string, t containerd.Task) {
	if t != nil {
		ch, err := t.Wait(ctx)
		if err == nil && t.Kill(ctx, 9) == nil {
			<-ch
		}
		if _, err := t.Delete(ctx); err != nil {
			b.Error(err)
		}
	}
	if c, err := client.LoadContainer(ctx, id); err == nil {
		if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil {
			b.Error(err)
		}
	}
}

func report(b *testing.B, lat []time.Duration, timed time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(len(lat))/timed.Seconds(), "creates/s")
}

// BenchmarkRuntimeColdStart is runtimetest.ColdStart on this runtime (echo
// image, a pool with a namespace per sandbox of a batch pre-created),
// comparable with the native and process runtimes'.
func BenchmarkRuntimeColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range runtimetest.ColdStartConcurrency {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			r := newRuntime(b, newPool(b, conc), "")
			runtimetest.ColdStart(b, r, echoFn("bench", nil), conc, runtimetest.ColdStartOptions{})
		})
	}
}

// BenchmarkPythonColdStart is runtimetest.ColdStart of the Python function
// the process and native runtimes' benchmarks start (~100 ms of imports),
// here always fresh: a new container of the worker-built base image, the
// code and runner bound in (no templates on containerd).
//
//	go test -run '^$' -bench PythonColdStart -benchtime 10x ./internal/worker/runtime/containerd/
func BenchmarkPythonColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range []int{1, 10} {
		b.Run(fmt.Sprintf("conc=%d/fresh", conc), func(b *testing.B) {
			r := newRuntime(b, newPool(b, conc), "")
			data, err := codezip.ZipFiles(map[string][]byte{"app.py": []byte(runtimetest.PythonHeavySource)})
			if err != nil {
				b.Fatal(err)
			}
			m, err := lang.New(lang.Config{Dir: b.TempDir(), Fetch: func(context.Context, string) ([]byte, error) { return data, nil }})
			if err != nil {
				b.Fatal(err)
			}
			f := &spec.Function{Name: "pyfn", Revision: 1, Concurrency: 1, Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128},
				Code: &spec.Code{Language: spec.LangPython, Handler: "app.handler", Contract: spec.ContractLambda, Digest: codezip.Digest(data)}}
			f.ApplyDefaults()
			s, err := m.Prepare(context.Background(), runtime.Spec{ID: "x", Function: f}, lang.Target{Mount: true, Import: r.ImportImage})
			if err != nil {
				b.Fatal(err)
			}
			runtimetest.ColdStart(b, r, s.Function, conc, runtimetest.ColdStartOptions{Mounts: s.Mounts})
		})
	}
}

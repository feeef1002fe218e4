package native

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/spec"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
)

// BenchmarkColdStart measures a cold start as a caller sees it — Create,
// readiness, first HTTP 200 — for batches of conc concurrent sandboxes of
// the probe function (a static Go binary). "burst" starts each batch with
// the shell pool full (conc shells parked); "sustained" keeps 16 shells and
// does not wait for the refill between batches, so its rate includes
// making shells. Teardown is outside the timer. Metrics: p50/p99 latency
// per sandbox and sandboxes created per second.
//
//	go test -run '^$' -bench ColdStart -benchtime 20x ./internal/worker/runtime/native/
func BenchmarkColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range []int{1, 10, 50, 100} {
		b.Run(fmt.Sprintf("conc=%d/burst", conc), func(b *testing.B) { benchCold(b, conc, max(conc, 4), true) })
		b.Run(fmt.Sprintf("conc=%d/sustained", conc), func(b *testing.B) { benchCold(b, conc, 16, false) })
	}
}

var benchClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func benchCold(b *testing.B, conc, shells int, refill bool) {
	cfg := poolConfig()
	cfg.Size = shells + conc
	pool := newPool(b, cfg)
	if err := pool.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	exe, _ := os.Executable()
	r, err := New(Config{StateDir: b.TempDir(), Pool: pool, Shells: shells, InitArgv: []string{exe, nsinit.Subcommand}})
	if err != nil {
		b.Fatal(err)
	}
	r.Start()
	b.Cleanup(func() { killAll(b, r); r.Close() })
	f := &spec.Function{Name: "bench", Revision: 1, Command: []string{probeBin}, Port: 8080}
	var lat []time.Duration
	var timed time.Duration
	seq := 0
	for i := -1; i < b.N; i++ { // one untimed warm-up batch
		b.StopTimer()
		if refill || i < 1 {
			testutil.Eventually(b, waitLong, func() bool { return len(r.ready) == shells }, "shell refill")
		}
		ids := make([]string, conc)
		for j := range ids {
			seq++
			ids[j] = fmt.Sprintf("b-%d", seq)
		}
		d := make([]time.Duration, conc)
		errs := make([]error, conc)
		var wg sync.WaitGroup
		b.StartTimer()
		t0 := time.Now()
		for j := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				errs[j] = coldStart(r, ids[j], f)
				d[j] = time.Since(start)
			}()
		}
		wg.Wait()
		if i >= 0 {
			timed += time.Since(t0)
			lat = append(lat, d...)
		}
		b.StopTimer()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		for _, id := range ids {
			if err := r.Kill(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		cancel()
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
	b.ReportMetric(float64(len(lat))/timed.Seconds(), "sandboxes/s")
}

func coldStart(r *Runtime, id string, f *spec.Function) error {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, runtime.Spec{ID: id, Function: f})
	if err != nil {
		return err
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	resp, err := benchClient.Get("http://" + inst.Addr + "/")
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sandbox %s: status %d", id, resp.StatusCode)
	}
	return nil
}

// BenchmarkRuntimeColdStart is runtimetest.ColdStart on this runtime, with
// the tests' 4 parked shells and the pool not waited for between batches,
// comparable with the containerd and process runtimes'.
func BenchmarkRuntimeColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range runtimetest.ColdStartConcurrency {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			cfg := poolConfig()
			cfg.Size = 16 + conc
			r := newRuntime(b, newPool(b, cfg), b.TempDir(), true)
			runtimetest.ColdStart(b, r, &spec.Function{Name: "bench", Revision: 1, Command: []string{probeBin}, Port: 8080}, conc, nil)
		})
	}
}

package runtimetest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ColdStartConcurrency are the batch sizes every runtime's cold-start
// benchmark measures, so that runtimes compare at the same points.
var ColdStartConcurrency = []int{1, 10, 50, 100}

var benchSeq atomic.Uint64

var benchClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}

// ColdStartOptions tune ColdStart for one runtime.
type ColdStartOptions struct {
	// Route prepares a request to sandbox id (nil: none needed).
	Route func(req *http.Request, id string)
	// BeforeBatch runs, untimed, before each batch (i is -1 for the
	// warm-up batch): a runtime with a pool may wait for it to refill.
	BeforeBatch func(i int)
	// Mounts are given to every sandbox (a function from source's code
	// and runner, package lang).
	Mounts []runtime.Mount
}

// ColdStart benchmarks rt the same way for every runtime: each iteration
// starts conc sandboxes of f at once and measures, per sandbox, Create →
// readiness → first HTTP 2xx (request in, response out). Teardown is
// outside the timer. It reports p50-ms, p99-ms and sandboxes/s (sandboxes
// over the timed batches' wall time).
func ColdStart(b *testing.B, rt runtime.Runtime, f *spec.Function, conc int, o ColdStartOptions) {
	var lat []time.Duration
	var timed time.Duration
	for i := -1; i < b.N; i++ { // one untimed warm-up batch
		b.StopTimer()
		if o.BeforeBatch != nil {
			o.BeforeBatch(i)
		}
		ids := make([]string, conc)
		for j := range ids {
			ids[j] = IDPrefix + "bench-" + strconv.FormatUint(benchSeq.Add(1), 10)
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
				errs[j] = coldStart(rt, runtime.Spec{ID: ids[j], Function: f, Mounts: o.Mounts}, o.Route)
				d[j] = time.Since(start)
			}()
		}
		wg.Wait()
		if i >= 0 {
			timed += time.Since(t0)
			lat = append(lat, d...)
		}
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		for j, id := range ids {
			if err := rt.Kill(ctx, id); err != nil && errs[j] == nil {
				errs[j] = err
			}
		}
		cancel()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	report(b, lat, timed)
}

// report reports the p50 and p99 of lat and the rate of len(lat)
// sandboxes in elapsed.
func report(b *testing.B, lat []time.Duration, elapsed time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "sandboxes/s")
}

func coldStart(rt runtime.Runtime, s runtime.Spec, route func(*http.Request, string)) error {
	id := s.ID
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	inst, err := rt.Create(ctx, s)
	if err != nil {
		return err
	}
	if !inst.Ready {
		if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+inst.Addr+"/", nil)
	if err != nil {
		return err
	}
	if route != nil {
		route(req, id)
	}
	resp, err := benchClient.Do(req)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("sandbox %s: status %d", id, resp.StatusCode)
	}
	return nil
}

// Churn benchmarks rt's sustained lifecycle rate: conc workers each start
// a sandbox of f, and — with serve — wait for readiness and its first HTTP
// 2xx, then kill it, and start the next, until b.N sandboxes have lived.
// Everything is timed, teardown included, and nothing waits for a pool to
// refill, so the rate is what the runtime keeps up indefinitely. It reports
// sandboxes/s and the p50 and p99 of each sandbox's start (Create, plus
// readiness and first reply with serve).
func Churn(b *testing.B, rt runtime.Runtime, f *spec.Function, conc int, serve bool, route func(*http.Request, string)) {
	var next atomic.Int64
	lat := make([]time.Duration, b.N)
	errs := make(chan error, conc)
	var wg sync.WaitGroup
	b.ResetTimer()
	t0 := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				id := IDPrefix + "churn-" + strconv.FormatUint(benchSeq.Add(1), 10)
				start := time.Now()
				err := churnOne(rt, id, f, serve, route)
				lat[i] = time.Since(start)
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				if kerr := rt.Kill(ctx, id); kerr != nil && err == nil {
					err = kerr
				}
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	report(b, lat, elapsed)
}

func churnOne(rt runtime.Runtime, id string, f *spec.Function, serve bool, route func(*http.Request, string)) error {
	if serve {
		return coldStart(rt, runtime.Spec{ID: id, Function: f}, route)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := rt.Create(ctx, runtime.Spec{ID: id, Function: f})
	return err
}

package dataplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// go test -run xxx -bench . -benchmem ./internal/dataplane/

func benchClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
}

func hello(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	_, _ = io.WriteString(w, "hello")
}

func benchGet(b *testing.B, c *http.Client, url string) {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkHotPath is a warm invocation end to end over loopback: client ->
// data plane (route, pick, proxy) -> sandbox. "direct" calls the sandbox
// with no platform in between, the physical limit to compare against;
// "dataplane" goes through the front end, "dataplane-nethttp" through the
// net/http path behind it (what the front end hands over). seq is one
// call at a time (latency), par one per core, sat 16 goroutines: with the
// cores saturated, ns/op is CPU per call and direct/dataplane the
// saturation throughput ratio.
func BenchmarkHotPath(b *testing.B) {
	sandbox := newSandbox(b, hello)
	d, srv := newTestDP(b, nil)
	slow := httptest.NewServer(d.Handler())
	b.Cleanup(slow.Close)
	var eps []*briskv1.Endpoint
	for i := range 4 {
		eps = append(eps, ep("cc1", fmt.Sprintf("sb-%d", i), sandbox))
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("unlimited", func(s *briskv1.FunctionSpec) { s.Concurrency = 0 }),
			fnSpec("cc1"),
		},
		Added: append(eps, ep("unlimited", "sb-u", sandbox)),
	})
	targets := []struct{ name, url string }{
		{"direct", "http://" + sandbox + "/"},
		{"dataplane", srv.URL + "/function/unlimited/"},
		{"dataplane-nethttp", slow.URL + "/function/unlimited/"},
		{"dataplane-cc1x4", srv.URL + "/function/cc1/"},
	}
	for _, tc := range targets {
		b.Run(tc.name+"/seq", func(b *testing.B) {
			c := benchClient()
			defer c.CloseIdleConnections()
			b.ReportAllocs()
			for b.Loop() {
				benchGet(b, c, tc.url)
			}
		})
		for _, par := range []struct {
			name string
			p    int
		}{{"par", 1}, {"sat", 16}} {
			b.Run(tc.name+"/"+par.name, func(b *testing.B) {
				c := benchClient()
				defer c.CloseIdleConnections()
				b.ReportAllocs()
				b.SetParallelism(max(par.p/runtime.GOMAXPROCS(0), 1))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						benchGet(b, c, tc.url)
					}
				})
			})
		}
	}
}

// BenchmarkRouteAndPick is the data plane's own share of the hot path with
// no network: resolve the function, reserve a sandbox slot, release it.
func BenchmarkRouteAndPick(b *testing.B) {
	for _, lb := range []string{"least-loaded", "knative", "power-of-two"} {
		for _, n := range []int{1, 16, 128} {
			d, err := New(Config{})
			if err != nil {
				b.Fatal(err)
			}
			var eps []*briskv1.Endpoint
			for i := range n {
				eps = append(eps, ep("hello", fmt.Sprintf("sb-%03d", i), "127.0.0.1:1"))
			}
			d.Apply(&briskv1.EndpointBatch{Snapshot: true,
				Functions: []*briskv1.FunctionSpec{fnSpec("hello", func(s *briskv1.FunctionSpec) {
					s.LoadBalancing = lb
					s.Concurrency = 0 // parallel goroutines never queue
				})},
				Added: eps})
			req := httptest.NewRequest(http.MethodGet, "http://hello.brisk.local/function/hello/path?q=1", nil)
			ctx := context.Background()
			routeAndPick := func() {
				rt := d.resolve(req)
				ep, _, err := rt.fn.acquire(ctx, rt.fn.set.Load(), d.markUrgent, false)
				if err != nil {
					b.Fatal(err)
				}
				rt.fn.release(ep)
			}
			name := fmt.Sprintf("%s/endpoints=%d", lb, n)
			b.Run(name+"/seq", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					routeAndPick()
				}
			})
			b.Run(name+"/par", func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						routeAndPick()
					}
				})
			})
		}
	}
}

// BenchmarkQueueHandoff is the queued path: one sandbox of concurrency 1
// and parallel callers, so most calls wait and get their slot handed over
// by the previous call's release (internal/dataplane/queue).
func BenchmarkQueueHandoff(b *testing.B) {
	d, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("hello", func(s *briskv1.FunctionSpec) {
			s.Concurrency = 1
			s.QueueDepth = 1 << 20
		})},
		Added: []*briskv1.Endpoint{ep("hello", "sb-000", "127.0.0.1:1")}})
	fn := d.lookup("hello")
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ep, _, err := fn.acquire(ctx, fn.set.Load(), d.markUrgent, false)
			if err != nil {
				b.Error(err)
				return
			}
			fn.release(ep)
		}
	})
}

// BenchmarkApplyReady is sandbox-ready propagation's share in the data
// plane: a delta that adds one endpoint to a function of n, then one that
// removes it (two Applies per op), with 100 functions in the table.
func BenchmarkApplyReady(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			d, err := New(Config{})
			if err != nil {
				b.Fatal(err)
			}
			snap := &briskv1.EndpointBatch{Snapshot: true}
			for f := range 100 {
				snap.Functions = append(snap.Functions, fnSpec(fmt.Sprintf("f%d", f)))
			}
			for i := range n {
				snap.Added = append(snap.Added, ep("f0", fmt.Sprintf("sb-%03d", i), fmt.Sprintf("127.0.0.1:%d", 2000+i)))
			}
			d.Apply(snap)
			add := &briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("f0", "sb-new", "127.0.0.1:1999")}}
			remove := &briskv1.EndpointBatch{Removed: []string{"sb-new"}}
			b.ReportAllocs()
			for b.Loop() {
				d.Apply(add)
				d.Apply(remove)
			}
			if got := len(d.lookup("f0").set.Load().Endpoints); got != n {
				b.Fatalf("%d endpoints, want %d", got, n)
			}
		})
	}
}

// BenchmarkUrgentReport is a data plane with 10,000 functions running
// calls and one whose call waits with no capacity, sending one urgent
// report after another (each waiting call rings the doorbell): the
// collection and the report's size on the wire (wire-B/op), which is also
// what the control plane then walks.
func BenchmarkUrgentReport(b *testing.B) {
	const busy = 10_000
	d, srv := newTestDP(b, nil)
	specs := []*briskv1.FunctionSpec{fnSpec("waiting")}
	for i := range busy {
		specs = append(specs, fnSpec(fmt.Sprintf("busy-%d", i)))
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: specs})
	now := d.nanotime()
	for i := range busy {
		fn := d.lookup(fmt.Sprintf("busy-%d", i))
		fn.stats.arrive(now) // a call in flight
		d.noteActive(fn)
	}
	goGet(b, srv.URL+"/function/waiting")
	waitFor(b, "the call queued", func() bool { return d.queued("waiting") == 1 })
	waiting := d.lookup("waiting")
	wire := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		d.markUrgent(waiting)
		rep := d.collectUrgent(time.Now())
		wire += proto.Size(rep)
	}
	b.ReportMetric(float64(wire)/float64(b.N), "wire-B/op")
	b.StopTimer()
	d.Apply(&briskv1.EndpointBatch{DeletedFunctions: []string{"waiting"}})
}

package emulated

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

var fn = &spec.Function{Name: "trace-func-0", Builtin: "trace", Revision: 3}

// runHost starts a host on a loopback port and stops it when the test ends.
func runHost(t *testing.T) *Host {
	t.Helper()
	h, err := NewHost("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

func mustCreate(t *testing.T, r *Runtime, id string) *runtime.Instance {
	t.Helper()
	inst, err := r.Create(context.Background(), runtime.Spec{ID: id, Function: fn})
	if err != nil {
		t.Fatalf("Create %s: %v", id, err)
	}
	return inst
}

type traceReply struct {
	MachineName, Function string
	ExecUS                int64 `json:"exec_us"`
}

// call invokes the sandbox id through the host; id "" sends no header.
func call(t *testing.T, h *Host, id, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+h.Addr()+"/", strings.NewReader(body))
	if id != "" {
		req.Header.Set(HeaderSandbox, id)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST for %s: %v", id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestCreateWaitsDelay(t *testing.T) {
	h := runHost(t)
	const delay = 30 * time.Millisecond
	r := h.Runtime("node-1", delay)
	if r.Name() != "emulated" || r.Node() != "node-1" {
		t.Errorf("Name %q Node %q", r.Name(), r.Node())
	}
	start := time.Now()
	inst := mustCreate(t, r, "sb-1")
	if elapsed := time.Since(start); elapsed < delay {
		t.Errorf("Create returned after %v, before the %v delay", elapsed, delay)
	}
	if inst.Addr != h.Addr() || inst.ID != "sb-1" || inst.Exited != nil || inst.ExitErr() != nil {
		t.Errorf("instance = %+v", inst)
	}
	if err := runtime.WaitReady(context.Background(), inst.Addr, inst.Exited); err != nil {
		t.Errorf("WaitReady: %v", err)
	}
}

func TestCreateHonoursContext(t *testing.T) {
	h := runHost(t)
	r := h.Runtime("node-1", time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := r.Create(ctx, runtime.Spec{ID: "sb-late", Function: fn})
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Create = %v, want context.Canceled", err)
	}
	if list, _ := r.List(context.Background()); len(list) != 0 {
		t.Errorf("cancelled Create registered %+v", list)
	}
	if code, _ := call(t, h, "sb-late", ""); code != http.StatusBadGateway {
		t.Errorf("cancelled sandbox answered %d", code)
	}
}

func TestRequestsRoutedByHeader(t *testing.T) {
	h := runHost(t)
	n1, n2 := h.Runtime("node-1", 0), h.Runtime("node-2", 0)
	mustCreate(t, n1, "sb-a")
	mustCreate(t, n2, "sb-b")
	for _, id := range []string{"sb-a", "sb-b"} {
		code, body := call(t, h, id, `{"ms":5}`)
		var got traceReply
		if err := json.Unmarshal([]byte(body), &got); err != nil || code != http.StatusOK {
			t.Fatalf("%s: %d %q", id, code, body)
		}
		if got.MachineName != id || got.Function != fn.Name || got.ExecUS < 5000 {
			t.Errorf("%s: reply %q", id, body)
		}
	}
	// The loader's headers work too: sleep mode runs the trace contract.
	req, _ := http.NewRequest(http.MethodPost, "http://"+h.Addr()+"/", nil)
	req.Header.Set(HeaderSandbox, "sb-a")
	req.Header.Set("requested_cpu", "2")
	req.Header.Set("requested_memory", "4096")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"requested_ms":2,"mb":4096`) {
		t.Errorf("loader-style call: %d %q", resp.StatusCode, b)
	}
}

func TestUnknownOrKilledSandboxIs502(t *testing.T) {
	h := runHost(t)
	n1, n2 := h.Runtime("node-1", 0), h.Runtime("node-2", 0)
	mustCreate(t, n1, "sb-a")
	if code, body := call(t, h, "sb-nope", ""); code != http.StatusBadGateway || !strings.Contains(body, "sb-nope") {
		t.Errorf("unknown sandbox: %d %q", code, body)
	}
	if code, _ := call(t, h, "", ""); code != http.StatusBadGateway {
		t.Errorf("no header: %d", code)
	}
	if err := n2.Kill(context.Background(), "sb-a"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Kill from another node = %v, want ErrNotFound", err)
	}
	if code, _ := call(t, h, "sb-a", ""); code != http.StatusOK {
		t.Errorf("sandbox answered %d after a foreign Kill", code)
	}
	if err := n1.Kill(context.Background(), "sb-a"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if code, _ := call(t, h, "sb-a", ""); code != http.StatusBadGateway {
		t.Errorf("killed sandbox answered %d", code)
	}
	if err := n1.Kill(context.Background(), "sb-a"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("second Kill = %v, want ErrNotFound", err)
	}
	// The id is free again.
	mustCreate(t, n2, "sb-a")
	if _, err := n1.Create(context.Background(), runtime.Spec{ID: "sb-a", Function: fn}); err == nil {
		t.Error("duplicate id accepted across nodes")
	}
}

func TestHostHealthz(t *testing.T) {
	h := runHost(t)
	resp, err := http.Get("http://" + h.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok" {
		t.Errorf("GET /healthz = %d %q", resp.StatusCode, b)
	}
}

func TestListPerNode(t *testing.T) {
	h := runHost(t)
	n1, n2 := h.Runtime("node-1", 0), h.Runtime("node-2", 0)
	for _, id := range []string{"sb-c", "sb-a", "sb-b"} {
		mustCreate(t, n1, id)
	}
	mustCreate(t, n2, "sb-z")
	list, err := n1.List(context.Background())
	if err != nil || len(list) != 3 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	for i, id := range []string{"sb-a", "sb-b", "sb-c"} {
		want := runtime.Listed{ID: id, Function: fn.Name, Revision: fn.Revision, Addr: h.Addr(), Running: true}
		if list[i] != want {
			t.Errorf("List[%d] = %+v, want %+v", i, list[i], want)
		}
	}
	if list, _ := n2.List(context.Background()); len(list) != 1 || list[0].ID != "sb-z" {
		t.Errorf("node-2 List = %+v", list)
	}
}

func TestConcurrentCreatesAcrossRuntimes(t *testing.T) {
	h := runHost(t)
	const nodes, perNode = 100, 10
	rts := make([]*Runtime, nodes)
	for i := range rts {
		rts[i] = h.Runtime(fmt.Sprintf("node-%d", i), 0)
	}
	var wg sync.WaitGroup
	errs := make(chan error, nodes*perNode)
	for i := range nodes * perNode {
		wg.Go(func() {
			if _, err := rts[i%nodes].Create(context.Background(), runtime.Spec{ID: fmt.Sprintf("sb-%d", i), Function: fn}); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, r := range rts {
		if list, _ := r.List(context.Background()); len(list) != perNode {
			t.Errorf("%s lists %d sandboxes, want %d", r.node, len(list), perNode)
		}
	}
	if code, body := call(t, h, "sb-777", ""); code != http.StatusOK || !strings.Contains(body, `"MachineName":"sb-777"`) {
		t.Errorf("sb-777: %d %q", code, body)
	}
}

// TestScale checks the shape the emulated runtime exists for: 20,000
// sandboxes over 4,000 nodes in one host, with no goroutine per sandbox.
func TestScale(t *testing.T) {
	h, err := NewHost("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	before := goruntime.NumGoroutine()
	const nodes, sandboxes = 4000, 20000
	rts := make([]*Runtime, nodes)
	for i := range rts {
		rts[i] = h.Runtime(fmt.Sprintf("node-%d", i), 0)
	}
	for i := range sandboxes {
		if _, err := rts[i%nodes].Create(context.Background(), runtime.Spec{ID: fmt.Sprintf("sb-%d", i), Function: fn}); err != nil {
			t.Fatal(err)
		}
	}
	if after := goruntime.NumGoroutine(); after > before {
		t.Errorf("goroutines grew from %d to %d with %d sandboxes", before, after, sandboxes)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set(HeaderSandbox, "sb-19999")
	h.serveHTTP(rec, req)
	if !strings.Contains(rec.Body.String(), `"MachineName":"sb-19999"`) {
		t.Errorf("dispatch among %d sandboxes: %d %q", sandboxes, rec.Code, rec.Body.String())
	}
}

func TestCreateIsAllocationLight(t *testing.T) {
	h, err := NewHost("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r := h.Runtime("node", 0)
	ctx := context.Background()
	s := runtime.Spec{ID: "sb", Function: fn}
	mustCreate(t, r, "warm") // the node's map exists from now on
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		if err := r.Kill(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	})
	// Counted, not timed: the sandbox, its trace handler and that
	// handler's pre-encoded reply, the instance, and the host table's
	// entry (6 when written), with a little slack for sync.Map internals.
	if allocs > 8 {
		t.Errorf("Create+Kill allocates %v times, want at most 8", allocs)
	}
}

func TestHostLifecycle(t *testing.T) {
	h, err := NewHost("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("Close of an unserved host: %v", err)
	}
	if err := h.Run(context.Background()); err == nil {
		t.Error("Run after Close succeeded")
	}
	if _, err := NewHost("127.0.0.1:-1", nil); err == nil {
		t.Error("NewHost on a bad address succeeded")
	}

	h = runHost(t)
	testutil.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + h.Addr() + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, "host never served")
	if err := h.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
}

func BenchmarkCreateKill(b *testing.B) {
	h, err := NewHost("127.0.0.1:0", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	ctx := context.Background()
	b.Run("sequential", func(b *testing.B) {
		r := h.Runtime("node", 0)
		s := runtime.Spec{ID: "sb-seq", Function: fn}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Create(ctx, s); err != nil {
				b.Fatal(err)
			}
			if err := r.Kill(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var next sync.Mutex
		n := 0
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			next.Lock()
			n++
			r := h.Runtime(fmt.Sprintf("node-%d", n), 0)
			s := runtime.Spec{ID: fmt.Sprintf("sb-par-%d", n), Function: fn}
			next.Unlock()
			for pb.Next() {
				if _, err := r.Create(ctx, s); err != nil {
					b.Fatal(err)
				}
				if err := r.Kill(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkDispatch is an empty call routed among sandboxes tables of
// several sizes; the whole-HTTP path is in tracefn's BenchmarkServerEmpty.
func BenchmarkDispatch(b *testing.B) {
	for _, size := range []int{1, 1000, 20000} {
		h, err := NewHost("127.0.0.1:0", nil)
		if err != nil {
			b.Fatal(err)
		}
		r := h.Runtime("node", 0)
		for i := range size {
			if _, err := r.Create(context.Background(), runtime.Spec{ID: fmt.Sprintf("sb-%d", i), Function: fn}); err != nil {
				b.Fatal(err)
			}
		}
		newReq := func(i int) *http.Request {
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Header.Set(HeaderSandbox, fmt.Sprintf("sb-%d", i%size))
			req.Header.Set("requested_cpu", "0")
			req.Header.Set("requested_memory", "0")
			return req
		}
		b.Run(fmt.Sprintf("sandboxes=%d", size), func(b *testing.B) {
			req, w := newReq(size-1), &discard{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				h.serveHTTP(w, req)
			}
		})
		b.Run(fmt.Sprintf("sandboxes=%d/parallel", size), func(b *testing.B) {
			var mu sync.Mutex
			n := 0
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				n++
				req, w := newReq(n*7919), &discard{h: http.Header{}}
				mu.Unlock()
				for pb.Next() {
					h.serveHTTP(w, req)
				}
			})
		})
		h.Close()
	}
}

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

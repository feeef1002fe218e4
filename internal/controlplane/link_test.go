package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/pkg/spec"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startCP runs a control plane in this process until the test ends or
// stop is called.
func startCP(t *testing.T, dir string) (cp *ControlPlane, stop func()) {
	t.Helper()
	return runCP(t, Config{DataDir: dir, AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", Logger: quiet,
		TickInterval: 100 * time.Millisecond, DrainDelay: time.Millisecond, StartupGrace: 5 * time.Second,
		KeepAlivePolicy: spec.KeepAliveTTL}) // scale-downs here expect victims at once
}

// runCP runs a control plane of cfg until the test ends or stop is
// called; it returns once the control plane is ready, and fails the test
// if it stops before.
func runCP(t *testing.T, cfg Config) (cp *ControlPlane, stop func()) {
	t.Helper()
	cp, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	select {
	case <-cp.Ready():
	case err := <-done:
		t.Fatalf("control plane: %v", err)
	}
	return cp, stop
}

// startWorkers runs one daemon hosting n emulated nodes (prefix-0..n-1).
func startWorkers(t *testing.T, cpAddr, prefix string, n int) (stop func()) {
	t.Helper()
	host, err := emulated.NewHost("127.0.0.1:0", quiet)
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.Config{ControlPlane: cpAddr, Logger: quiet}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		cfg.Nodes = append(cfg.Nodes, worker.NodeConfig{ID: id, Runtime: host.Runtime(id, 2*time.Millisecond),
			Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 8192}})
	}
	d, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { host.Run(ctx); done <- struct{}{} }()
	go func() { d.Run(ctx); done <- struct{}{} }()
	stop = func() {
		if ctx.Err() == nil {
			cancel()
			<-done
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

func deploy(t *testing.T, cp *ControlPlane, name string, min int) {
	t.Helper()
	f := &spec.Function{Name: name, Builtin: "trace", Scaling: spec.Scaling{Min: min}}
	f.ApplyDefaults()
	f.Revision = cp.admin.NextRevision()
	if _, err := cp.store.CreateFunction(f); err != nil {
		t.Fatal(err)
	}
	cp.cluster.UpsertFunction(f)
}

func readyIDs(cp *ControlPlane, name string) []string {
	st, _ := cp.cluster.functionStatus(name)
	var ids []string
	for _, s := range st.Sandboxes {
		if s.State == "ready" {
			ids = append(ids, s.ID)
		}
	}
	sort.Strings(ids)
	return ids
}

func connected(cp *ControlPlane, n int) bool {
	c := 0
	for _, ns := range cp.cluster.NodeStatus() {
		if ns.Connected {
			c++
		}
	}
	return c == n
}

// A worker that restarts loses its sandboxes (emulated ones live in the
// daemon process). The control plane's next handshake runs in reset mode:
// the lost ids become invalid and are replaced under new ids, never resent.
func TestResetHandshakeReplacesLostSandboxesUnderNewIDs(t *testing.T) {
	cp, _ := startCP(t, t.TempDir())
	stopW := startWorkers(t, cp.GRPCAddr(), "w", 1)
	testutil.Eventually(t, 10*time.Second, func() bool { return connected(cp, 1) })
	deploy(t, cp, "f", 3)
	testutil.Eventually(t, 10*time.Second, func() bool { return len(readyIDs(cp, "f")) == 3 })
	before := readyIDs(cp, "f")

	stopW()
	testutil.Eventually(t, 10*time.Second, func() bool { return connected(cp, 0) })
	startWorkers(t, cp.GRPCAddr(), "w", 1)
	// The disconnected node keeps its records until the grace period, so
	// wait for the handshake to have replaced them all.
	testutil.Eventually(t, 10*time.Second, func() bool {
		after := readyIDs(cp, "f")
		if len(after) != 3 {
			return false
		}
		for _, id := range after {
			for _, old := range before {
				if id == old {
					return false
				}
			}
		}
		return true
	})
	cp.cluster.mu.Lock()
	total, invalid := cp.cluster.r.NodeCounts("w-0")
	cp.cluster.mu.Unlock()
	if invalid != 3 || total != 3 {
		t.Fatalf("after reset handshake: %d invalid ids, %d sandboxes; want 3 and 3", invalid, total)
	}
}

// A restarted control plane rebuilds its table from the workers (recover
// mode) and creates nothing while the sandboxes are still there.
func TestRecoverHandshakeAdoptsWithoutDuplicates(t *testing.T) {
	dir := t.TempDir()
	cp, stopCP := startCP(t, dir)
	// The workers must find the restarted control plane at the same address.
	addr := cp.GRPCAddr()
	startWorkers(t, addr, "w", 4)
	testutil.Eventually(t, 10*time.Second, func() bool { return connected(cp, 4) })
	deploy(t, cp, "f", 10)
	testutil.Eventually(t, 10*time.Second, func() bool { return len(readyIDs(cp, "f")) == 10 })
	before := readyIDs(cp, "f")
	stopCP()

	cp2, err := New(Config{DataDir: dir, AdminAddr: "127.0.0.1:0", GRPCAddr: addr, Logger: quiet,
		TickInterval: 100 * time.Millisecond, StartupGrace: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cp2.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-cp2.Ready()
	testutil.Eventually(t, 10*time.Second, func() bool { return connected(cp2, 4) && len(readyIDs(cp2, "f")) == 10 })
	if got := readyIDs(cp2, "f"); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("adopted %v, want the same %v", got, before)
	}
	cp2.cluster.mu.Lock()
	paused := cp2.cluster.r.Paused()
	cp2.cluster.mu.Unlock()
	if paused {
		t.Fatal("scheduling still paused after every worker answered")
	}
	if n := testutilCounter(cp2); n != 0 {
		t.Fatalf("restarted control plane created %d sandboxes, want 0", n)
	}
}

func testutilCounter(cp *ControlPlane) int {
	m := &dtoCounter{}
	_ = cp.metrics.creations.Write(&m.Metric)
	return int(m.GetCounter().GetValue())
}

// Desired 10 -> 3 -> 8: tombstoned sandboxes are never counted as
// available, and the final count is exactly 8 (docs/reliability.md, case 17).
func TestRapidRescaleConverges(t *testing.T) {
	cp, _ := startCP(t, t.TempDir())
	startWorkers(t, cp.GRPCAddr(), "w", 2)
	testutil.Eventually(t, 10*time.Second, func() bool { return connected(cp, 2) })
	deploy(t, cp, "f", 10)
	testutil.Eventually(t, 10*time.Second, func() bool { return len(readyIDs(cp, "f")) == 10 })
	setMin := func(n int) {
		f := *cp.cluster.Spec("f")
		f.Scaling.Min = n // same revision: a scaling change only
		cp.cluster.UpsertFunction(&f)
	}
	setMin(3)
	setMin(8)
	testutil.Eventually(t, 10*time.Second, func() bool {
		st, _ := cp.cluster.functionStatus("f")
		return st.Ready == 8 && st.Pending == 0 && st.Terminating == 0
	})
	// Nothing beyond 8 is left at the workers either.
	total := 0
	for _, ns := range cp.cluster.NodeStatus() {
		total += ns.Sandboxes
	}
	if total != 8 {
		t.Fatalf("nodes hold %d sandboxes, want 8", total)
	}
}

package local

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtimes"
	"github.com/brisk-faas/brisk/pkg/api"
)

// startCluster runs a one-process cluster with TLS between the components
// (so the data plane's emergency calls go over mutual TLS to the worker)
// on the emulated runtime, until the test ends.
func startCluster(t *testing.T, w runtimes.Workers) *Cluster {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	w.Runtime, w.StateDir, w.StopOnExit = "emulated", filepath.Join(dir, "worker"), true
	cl, err := New(Config{
		ControlPlane: controlplane.Config{DataDir: filepath.Join(dir, "cp"), AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
			AuthDisabled: true, TickInterval: 200 * time.Millisecond},
		DataPlane: dataplane.Config{ID: "dp", Listen: "127.0.0.1:0"},
		Workers:   w,
		Logger:    log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-cl.Ready():
	case err := <-done:
		t.Fatal(err)
	case <-time.After(time.Minute):
		t.Fatal("cluster not ready")
	}
	return cl
}

func deploy(t *testing.T, cl *Cluster, specJSON string) {
	t.Helper()
	resp, err := http.Post("http://"+cl.AdminAddr()+"/v1/functions", "application/json", strings.NewReader(specJSON))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("deploy: %d %s", resp.StatusCode, b)
	}
}

func call(t *testing.T, cl *Cluster, fn string) *http.Response {
	t.Helper()
	resp, err := http.Get("http://" + cl.InvokeAddr() + "/function/" + fn)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func status(t *testing.T, cl *Cluster) api.StatusView {
	t.Helper()
	resp, err := http.Get("http://" + cl.AdminAddr() + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v api.StatusView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A dual-mode function at zero: its first call is served at once by a
// one-shot emergency sandbox on the worker, which appears in no table; the
// call counts toward regular scaling (no history yet), so a regular sandbox
// follows and takes later calls (docs/reliability.md, cases 22 and 23).
func TestDualTrackServesTheFirstCallOnTheEmergencyTrack(t *testing.T) {
	cl := startCluster(t, runtimes.Workers{NodeID: "w", EmergencySlots: 4, CreateDelay: 300 * time.Millisecond})
	// The data plane learns the emergency workers from the worker's
	// heartbeats; until then a new function's first call queues. Each try
	// is a new function, at zero.
	name, i := "", 0
	var first *http.Response
	testutil.Eventually(t, 30*time.Second, func() bool {
		i++
		name = "d" + strconv.Itoa(i)
		deploy(t, cl, `{"name":"`+name+`","builtin":"trace","scaling":{"mode":"dual"}}`)
		first = call(t, cl, name)
		return first.Header.Get("X-Brisk-Track") == "emergency"
	}, "a first call served on the emergency track")
	if first.StatusCode != 200 || !strings.HasPrefix(first.Header.Get("X-Brisk-Sandbox"), "ei-") {
		t.Errorf("emergency reply %d, sandbox %q", first.StatusCode, first.Header.Get("X-Brisk-Sandbox"))
	}
	// Regular capacity follows; later calls go to it.
	testutil.Eventually(t, 30*time.Second, func() bool {
		r := call(t, cl, name)
		return r.StatusCode == 200 && r.Header.Get("X-Brisk-Track") == ""
	}, "a regular sandbox serves later calls")
	resp, err := http.Get("http://" + cl.AdminAddr() + "/v1/functions/" + name)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"sandboxes"`) || strings.Contains(string(b), `"ei-`) {
		t.Errorf("the function's status lists an emergency sandbox (or none at all): %s", b)
	}
	v := status(t, cl)
	if n := v.Nodes[0]; n.Emergency == nil || n.Emergency.Started < 1 {
		t.Errorf("node status %+v: want the emergency starts counted", n)
	}
}

// An async function's call never takes the emergency track, even with
// slots free: it waits for its regular sandbox.
func TestAsyncFunctionWaitsForARegularSandbox(t *testing.T) {
	cl := startCluster(t, runtimes.Workers{NodeID: "w", EmergencySlots: 4, CreateDelay: 50 * time.Millisecond})
	deploy(t, cl, `{"name":"a","builtin":"trace"}`)
	r := call(t, cl, "a")
	if r.StatusCode != 200 || r.Header.Get("X-Brisk-Track") != "" || strings.HasPrefix(r.Header.Get("X-Brisk-Sandbox"), "ei-") {
		t.Errorf("async call: %d, track %q, sandbox %q", r.StatusCode, r.Header.Get("X-Brisk-Track"), r.Header.Get("X-Brisk-Sandbox"))
	}
}

// Sync mode (Lambda-like): four overlapping calls get four sandboxes, the
// peak is kept for the keep-alive (stable window + grace = 6 s) although
// no call runs any more, and then the function goes to zero.
func TestSyncModeHoldsThePeakForTheKeepAlive(t *testing.T) {
	cl := startCluster(t, runtimes.Workers{NodeID: "w", CreateDelay: 50 * time.Millisecond})
	deploy(t, cl, `{"name":"s","builtin":"trace","scaling":{"mode":"sync","stable_window":"5s","scale_to_zero_grace":"1s"}}`)
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post("http://"+cl.InvokeAddr()+"/function/s", "application/json", strings.NewReader(`{"ms":1500}`))
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for _, c := range codes {
		if c != 200 {
			t.Fatalf("calls answered %v", codes)
		}
	}
	desired := func() int {
		for _, f := range status(t, cl).Functions {
			if f.Name == "s" {
				return f.Desired
			}
		}
		return -1
	}
	if d := desired(); d != 4 {
		t.Errorf("right after the calls: desired %d, want the peak 4 held", d)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return desired() == 0 }, "zero after the keep-alive")
}

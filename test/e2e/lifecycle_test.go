package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFunctionLifecycle walks one function through its whole life on a real
// local cluster with the process runtime: scale from zero, warm reuse,
// scale out under concurrent load, scale to zero when idle, delete.
func TestFunctionLifecycle(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "hello", "--builtin", "trace", "--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")
	if v := c.fn(t, "hello"); v.Status.Desired != 0 || v.Status.Ready != 0 {
		t.Fatalf("new function should start at zero, got desired=%d ready=%d", v.Status.Desired, v.Status.Ready)
	}

	// First call: scale from zero.
	first := c.invoke(t, "hello", `{"ms": 20}`)
	if first.status != 200 || !first.cold || first.sandbox == "" {
		t.Fatalf("first call: status %d cold=%v sandbox=%q body=%s", first.status, first.cold, first.sandbox, first.body)
	}
	if first.reply.Sandbox != first.sandbox || first.reply.ExecUs < 20_000 {
		t.Fatalf("trace reply %+v does not match sandbox %s or did not run 20ms", first.reply, first.sandbox)
	}

	// Warm calls reuse that sandbox.
	for i := 0; i < 5; i++ {
		w := c.invoke(t, "hello", `{"ms": 1}`)
		if w.status != 200 || w.cold || w.sandbox != first.sandbox {
			t.Fatalf("warm call %d: status %d cold=%v sandbox %q (want %q)", i, w.status, w.cold, w.sandbox, first.sandbox)
		}
	}
	if v := c.fn(t, "hello"); v.Status.Ready != 1 {
		t.Fatalf("after sequential calls want 1 ready sandbox, got %d", v.Status.Ready)
	}

	// Four concurrent clients with concurrency 1 per sandbox: 4 sandboxes.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var failures atomic.Int64
	seen := sync.Map{}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400 && !stop.Load(); i++ {
				resp, err := http.Post("http://"+c.invokeAddr+"/function/hello", "application/json", strings.NewReader(`{"ms": 150}`))
				if err != nil {
					failures.Add(1)
					continue
				}
				seen.Store(resp.Header.Get("X-Brisk-Sandbox"), true)
				if resp.StatusCode != 200 {
					failures.Add(1)
				}
				resp.Body.Close()
			}
		}()
	}
	eventually(t, 30*time.Second, "4 ready sandboxes under 4 concurrent clients", func() bool {
		return c.fn(t, "hello").Status.Ready == 4
	})
	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d calls failed under load", n)
	}
	if v := c.fn(t, "hello"); v.Status.Desired != 4 {
		t.Fatalf("desired = %d under 4 concurrent clients, want 4", v.Status.Desired)
	}
	pids := sandboxPIDs(t, c, "hello")
	if len(pids) != 4 {
		t.Fatalf("want 4 sandbox processes, found %d", len(pids))
	}

	// Idle: back to zero after the stable window and the grace period, and
	// the processes are gone.
	eventually(t, 30*time.Second, "scale to zero when idle", func() bool {
		v := c.fn(t, "hello")
		return v.Status.Desired == 0 && len(v.Status.Sandboxes) == 0
	})
	for _, pid := range pids {
		eventually(t, 10*time.Second, fmt.Sprintf("sandbox process %d gone", pid), func() bool { return !alive(pid) })
	}

	// Called again: a cold start, on a new sandbox id.
	again := c.invoke(t, "hello", `{"ms": 1}`)
	if again.status != 200 || !again.cold || again.sandbox == first.sandbox {
		t.Fatalf("call after scale-to-zero: status %d cold=%v sandbox %q", again.status, again.cold, again.sandbox)
	}
	pids = sandboxPIDs(t, c, "hello")

	// Delete removes the function and its sandboxes.
	out := c.mustBrisk(t, "fn", "delete", "hello")
	if !strings.Contains(out, "deleted") {
		t.Fatalf("delete output: %s", out)
	}
	if inv := c.invoke(t, "hello", `{}`); inv.status != 404 {
		eventually(t, 5*time.Second, "deleted function answers 404", func() bool { return c.invoke(t, "hello", `{}`).status == 404 })
	}
	for _, pid := range pids {
		eventually(t, 10*time.Second, fmt.Sprintf("sandbox process %d gone after delete", pid), func() bool { return !alive(pid) })
	}
	st, err := c.cl.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node reports no sandboxes", func() bool {
		st, err = c.cl.Status(context.Background())
		return err == nil && st.Nodes[0].Sandboxes == 0
	})
}

// sandboxPIDs finds the processes serving a function's ready sandboxes by
// asking each for its PID through /proc (the process runtime's sandboxes
// are local processes listening on their address).
func sandboxPIDs(t *testing.T, c *cluster, name string) []int {
	t.Helper()
	var pids []int
	for _, s := range c.fn(t, name).Status.Sandboxes {
		if s.State != "ready" {
			continue
		}
		pid := pidListening(t, s.Address)
		if pid == 0 {
			t.Fatalf("no process listens on %s (sandbox %s)", s.Address, s.ID)
		}
		pids = append(pids, pid)
	}
	return pids
}

func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie is dead for our purposes.
	f := strings.Fields(string(data))
	return len(f) > 2 && f[2] != "Z"
}

// TestCallOutlivesItsFunctionsDeletion: a call running when its function
// is deleted finishes. The sandbox is withdrawn at once and killed only
// once the data plane no longer reports the call (docs/policies.md,
// "Draining"); before, it was killed at the drain delay and the call got
// 502 sandbox-failed after about a second.
func TestCallOutlivesItsFunctionsDeletion(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "long", "--builtin", "trace")
	if w := c.invoke(t, "long", `{"ms": 1}`); w.status != 200 {
		t.Fatalf("first call: %d %s", w.status, w.body)
	}
	type result struct {
		status int
		execUs int64
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := c.hc.Post(c.scheme+"://"+c.invokeAddr+"/function/long", "application/json", strings.NewReader(`{"ms": 2500}`))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var reply struct {
			ExecUs int64 `json:"exec_us"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&reply)
		done <- result{status: resp.StatusCode, execUs: reply.ExecUs}
	}()
	inv := c.scheme + "://" + c.invokeAddr
	eventually(t, 10*time.Second, "the long call in flight", func() bool {
		return metricValue(t, inv+"/metrics", `brisk_dataplane_inflight{function="long"}`) == 1
	})
	c.mustBrisk(t, "fn", "delete", "long")
	select {
	case r := <-done:
		if r.err != nil || r.status != 200 || r.execUs < 2_500_000 {
			t.Fatalf("the call running at the deletion: status %d, ran %d µs, err %v; want 200 after 2.5 s", r.status, r.execUs, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call running at the deletion never answered")
	}
}

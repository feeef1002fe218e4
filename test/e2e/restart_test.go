package e2e

import (
	"context"
	"io"
	"net/http"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestControlPlaneRestartAdoptsSandboxes kills the control plane of a
// three-process cluster and restarts it: the registry must still hold the
// function, and the new control plane must adopt the running sandboxes
// through the recover handshake instead of creating new ones.
func TestControlPlaneRestartAdoptsSandboxes(t *testing.T) {
	c := newCluster(t)
	cp := startBrisk(t, append([]string{"controlplane"}, c.cpArgs()...)...)
	// The worker and the data plane join with the control plane's join
	// token, checking it against its CA.
	join := joinArgs(t, c.dataDir)
	startBrisk(t, append([]string{"dataplane", "--invoke", c.invokeAddr, "--controlplane", c.grpc, "--id", "dp-1",
		"--state-dir", t.TempDir()}, join...)...)
	startBrisk(t, append([]string{"worker", "--controlplane", c.grpc, "--node-id", "w-1", "--state-dir", t.TempDir(), "--stop-on-exit"}, join...)...)
	c.waitHealthy(t, cp)

	c.mustBrisk(t, "fn", "deploy", "steady", "--builtin", "trace", "--min", "2")
	eventually(t, 30*time.Second, "2 ready sandboxes", func() bool { return c.fn(t, "steady").Status.Ready == 2 })
	before := sandboxIDs(t, c, "steady")
	pids := sandboxPIDs(t, c, "steady")

	cp.stop(syscall.SIGKILL)
	cp2 := startBrisk(t, append([]string{"controlplane"}, c.cpArgs()...)...)
	c.waitHealthy(t, cp2)

	v := c.fn(t, "steady")
	if v.Scaling.Min != 2 || v.Builtin != "trace" {
		t.Fatalf("registry lost the function's spec across the restart: %+v", v.Function)
	}
	eventually(t, 30*time.Second, "restarted control plane adopts both sandboxes", func() bool {
		return c.fn(t, "steady").Status.Ready == 2
	})
	after := sandboxIDs(t, c, "steady")
	if strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("sandboxes changed across the restart: before %v after %v", before, after)
	}
	if n := metricValue(t, "http://"+c.admin+"/metrics", "brisk_controlplane_sandbox_creations_total"); n != 0 {
		t.Fatalf("restarted control plane created %v sandboxes; want 0 (adopt, not duplicate)", n)
	}
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("sandbox process %d died across the control-plane restart", pid)
		}
	}
	// The data plane resynchronised and routes to an adopted sandbox.
	eventually(t, 10*time.Second, "invocation served by an adopted sandbox", func() bool {
		inv := c.invoke(t, "steady", `{"ms": 1}`)
		return inv.status == 200 && (inv.sandbox == before[0] || inv.sandbox == before[1])
	})
	if n := metricValue(t, "http://"+c.admin+"/metrics", "brisk_controlplane_sandbox_creations_total"); n != 0 {
		t.Fatalf("control plane created %v sandboxes after adoption; want 0", n)
	}
	_ = context.Background
}

func sandboxIDs(t *testing.T, c *cluster, name string) []string {
	t.Helper()
	var ids []string
	for _, s := range c.fn(t, name).Status.Sandboxes {
		ids = append(ids, s.ID)
	}
	sort.Strings(ids)
	return ids
}

// metricValue reads one sample from a Prometheus text endpoint: name is
// the metric's name with its labels as the endpoint writes them.
func metricValue(t testing.TB, url, name string) float64 {
	t.Helper()
	v, ok := metricSample(t, url, name)
	if !ok {
		t.Fatalf("metric %s not found at %s", name, url)
	}
	return v
}

// metricSample is metricValue's sample, and false when there is none (a
// counter no event has made yet).
func metricSample(t testing.TB, url, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			if _, err := fmtSscan(rest, &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/fakenet"
)

// A namespace's egress policy, set with `brisk ns set`, holds its
// functions' sandboxes on the native runtime: an allow list lets them reach
// only what it names, another namespace's functions are unrestricted, and
// a change reaches the running sandbox without a redeploy.
func TestNamespaceEgressPolicy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the native runtime needs root (CI runs as root)")
	}
	f, g := fakenet.Start(t, 60), fakenet.Start(t, 61)
	f81 := f.Listen(t, 81)
	// Where the sandbox's user (nobody) may execute it.
	dir, err := os.MkdirTemp("", "brisk-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(dir, "probe")
	if err := testutil.GoBuild("../../internal/worker/runtime/native/testdata/probe", probe, true); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t)
	c.up(t, "--runtime", "native")
	out := c.mustBrisk(t, "ns", "create", "team-a", "--egress-allow", f.Addr.String()+":80/tcp")
	if !strings.Contains(out, "allow "+f.Addr.String()+":80/tcp, deny the rest") {
		t.Fatalf("ns create said %q", out)
	}
	if out, code := c.brisk(t, "ns", "set", "team-a", "--egress-allow", "10.0.0.0/33"); code != 2 || !strings.Contains(out, "--egress-allow") {
		t.Fatalf("a bad rule: exit %d, %q; want a usage error", code, out)
	}
	for fn, ns := range map[string]string{"probe-a": "team-a", "probe-d": "default"} {
		c.mustBrisk(t, "fn", "deploy", fn, "--namespace", ns, "--command", probe, "--port", "8080", "--public", "--min", "1", "--wait")
	}
	netQ := func(fn string, q url.Values) map[string]string {
		t.Helper()
		resp, err := c.hc.Get("http://" + c.invokeAddr + "/function/" + fn + "/net?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got map[string]string
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d, %v", fn, resp.StatusCode, err)
		}
		return got
	}
	net := func(fn string) map[string]string {
		return netQ(fn, url.Values{"url": {"http://" + f.HTTP + "/"}, "dial": {g.HTTP}})
	}
	if got := net("probe-a.team-a"); got["fetch"] != "hello from the internet" || !strings.Contains(got["dial"], "connection refused") {
		t.Fatalf("team-a's sandbox: fetch %q, dial %q; want the allowed fetch and the other network refused at once", got["fetch"], got["dial"])
	}
	if got := net("probe-d"); got["fetch"] != "hello from the internet" || got["dial"] != "connected" {
		t.Fatalf("default's sandbox: fetch %q, dial %q; want both", got["fetch"], got["dial"])
	}
	// Tightened while the sandbox runs: f's port 80 is refused now, g
	// allowed; f's port 81 was never allowed.
	c.mustBrisk(t, "ns", "set", "team-a", "--egress-allow", g.Addr.String())
	testutil.Eventually(t, 30*time.Second, func() bool {
		got := net("probe-a.team-a")
		return strings.Contains(got["fetch"], "connection refused") && got["dial"] == "connected"
	}, "the new policy reaches the running sandbox")
	if got := netQ("probe-a.team-a", url.Values{"dial": {f81}}); !strings.Contains(got["dial"], "connection refused") {
		t.Fatalf("dial of a port never allowed: %q", got["dial"])
	}
	if out := c.mustBrisk(t, "ns", "list"); !strings.Contains(out, "allow "+g.Addr.String()+", deny the rest") {
		t.Fatalf("ns list:\n%s", out)
	}
	// Without egress flags, set keeps the policy; --egress-clear drops it.
	c.mustBrisk(t, "ns", "set", "team-a", "--max-functions", "5")
	if out := c.mustBrisk(t, "ns", "list"); !strings.Contains(out, "allow "+g.Addr.String()) {
		t.Fatalf("ns set without egress flags dropped the policy:\n%s", out)
	}
	c.mustBrisk(t, "ns", "set", "team-a", "--egress-clear")
	if out := c.mustBrisk(t, "ns", "list"); !strings.Contains(out, "functions 5,") || !strings.Contains(out, "unrestricted") {
		t.Fatalf("after --egress-clear the quota stays and the policy goes:\n%s", out)
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return net("probe-a.team-a")["fetch"] == "hello from the internet" },
		"the cleared policy reaches the running sandbox")
}

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Policies are chosen per cluster (flags or a --config file) and per
// function (brisk fn deploy), and fn get shows the ones in effect.
func TestPoliciesSelectable(t *testing.T) {
	c := newCluster(t)
	cfg := filepath.Join(t.TempDir(), "brisk.yaml")
	if err := os.WriteFile(cfg, []byte("placement: ch-bl\nkeep-alive-policy: gd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.up(t, "--config", cfg)
	c.mustBrisk(t, "fn", "deploy", "own", "--builtin", "trace", "--lb", "ch-rlu", "--keep-alive", "ttl:10m")
	c.mustBrisk(t, "fn", "deploy", "cluster", "--builtin", "trace")
	for _, tc := range []struct{ fn, placement, keepAlivePolicy, keepAlive string }{
		{"own", "ch-rlu", "ttl", "11m30s"}, // 10m scale-down delay after the 60s window and the 30s grace
		{"cluster", "ch-bl", "gd", "15m0s"},
	} {
		v := c.fn(t, tc.fn)
		p := v.Status.Policies
		if p == nil || p.Placement != tc.placement || p.KeepAlivePolicy != tc.keepAlivePolicy || p.KeepAlive != tc.keepAlive ||
			p.ScalingMode != "async" || p.Autoscaler != "kpa" || p.LoadBalancing != "least-loaded" {
			t.Fatalf("%s: policies %+v, want placement %s, keep-alive %s %s", tc.fn, p, tc.placement, tc.keepAlivePolicy, tc.keepAlive)
		}
		if r := c.invoke(t, tc.fn, `{"ms": 1}`); r.status != 200 {
			t.Fatalf("%s: call answered %d: %s", tc.fn, r.status, r.body)
		}
	}
	// Bad choices are refused with the allowed values.
	out, code := c.brisk(t, "fn", "deploy", "bad", "--builtin", "trace", "--keep-alive", "lru")
	if code != 2 || !strings.Contains(out, "gd") {
		t.Fatalf("--keep-alive lru: exit %d, %s", code, out)
	}
	out, code = c.brisk(t, "fn", "deploy", "bad", "--builtin", "trace", "--placement", "nearest")
	if code == 0 || !strings.Contains(out, "ch-rlu") {
		t.Fatalf("--placement nearest: exit %d, %s", code, out)
	}
}

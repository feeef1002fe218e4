package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// A full node behaves like a FaaS platform's: on a node with room for 8
// sandboxes by CPU (2 cores, no overcommit, 250m each), 12 functions called
// once each in order all answer 200, the later ones in idle sandboxes'
// room (each evicted at once, although its function's autoscaler window
// still wants it), and a second round does the same: nothing waits for a
// queue timeout. On the process and native runtimes.
func TestFullNodeYieldsIdleSandboxes(t *testing.T) {
	for _, rt := range []string{"process", "native"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "native" && os.Geteuid() != 0 {
				t.Skip("the native runtime needs root (CI runs as root)")
			}
			c := newCluster(t)
			c.up(t, "--runtime", rt, "--cpu", "2", "--cpu-overcommit", "1")
			const n = 12
			for i := 1; i <= n; i++ {
				c.mustBrisk(t, "fn", "deploy", fmt.Sprintf("f%d", i), "--builtin", "trace", "--queue-timeout", "2m")
			}
			var took []string
			for round := 1; round <= 2; round++ {
				for i := 1; i <= n; i++ {
					name := fmt.Sprintf("f%d", i)
					start := time.Now()
					inv := c.invoke(t, name, `{"ms": 5}`)
					took = append(took, fmt.Sprintf("%s:%d:%s", name, inv.status, time.Since(start).Round(time.Millisecond)))
					if inv.status != http.StatusOK {
						t.Fatalf("round %d: %s answered %d %s, want 200 (calls so far: %v)", round, name, inv.status, inv.body, took)
					}
				}
			}
			t.Logf("calls (function:status:latency): %v", took)
			st, err := c.cl.Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			node := st.Nodes[0]
			if node.Sandboxes > 8 || node.Capacity.MilliCPU != 2000 {
				t.Fatalf("node %+v: want at most 8 sandboxes on 2000m", node)
			}
			if ev := metricValue(t, "http://"+c.admin+"/metrics", "brisk_controlplane_keepalive_evictions_total"); ev < n-8 {
				t.Fatalf("%v evictions, want at least %d (every call beyond the 8th found the node full)", ev, n-8)
			}
			if out := c.mustBrisk(t, "fn", "list"); strings.Contains(out, "no-capacity") {
				t.Fatalf("a no-capacity condition with idle sandboxes to take:\n%s", out)
			}
		})
	}
}

// When a call truly finds no room (the node's room held by another
// function's min sandboxes: none can come by itself), it gets 503
// no-capacity at once, naming the node and the resource, and fn list and
// status show the condition; CPU requests are overcommitted 4 times by
// default.
func TestNoRoomAnswersAtOnce(t *testing.T) {
	c := newCluster(t)
	c.up(t, "--cpu", "1")
	st, err := c.cl.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Nodes[0].Capacity.MilliCPU; got != 4000 {
		t.Fatalf("node CPU for requests %dm with --cpu 1, want 4000m (the default overcommit of 4)", got)
	}
	// A min of 4 whole cores fills it: nothing is idle beyond the min.
	c.mustBrisk(t, "fn", "deploy", "hog", "--builtin", "trace", "--cpu", "1", "--min", "4", "--wait")
	c.mustBrisk(t, "fn", "deploy", "late", "--builtin", "trace", "--queue-timeout", "2m")
	resp, err := c.hc.Post("http://"+c.invokeAddr+"/function/late", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Brisk-Error") != "no-capacity" ||
		!strings.Contains(string(body), "CPU 4000m of 4000m requested") || !strings.Contains(string(body), "node ") {
		t.Fatalf("call with no room: %d %q %s, want 503 no-capacity naming the node and its CPU", resp.StatusCode, resp.Header.Get("X-Brisk-Error"), body)
	}
	for _, cmd := range [][]string{{"fn", "list"}, {"status"}} {
		if out := c.mustBrisk(t, cmd...); !strings.Contains(out, "no-capacity") {
			t.Fatalf("brisk %s does not show the condition:\n%s", strings.Join(cmd, " "), out)
		}
	}
	// Room again (the min lowered): the same call is served.
	c.mustBrisk(t, "fn", "update", "hog", "--min", "1")
	eventually(t, time.Minute, "late served once hog's surplus is gone", func() bool {
		return c.invoke(t, "late", `{}`).status == http.StatusOK
	})
}

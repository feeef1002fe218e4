package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

var fmtSscan = fmt.Sscan

type answer struct {
	status int
	msg    string
}

func request(t *testing.T, method, url, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var e struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	return answer{resp.StatusCode, e.Error}
}

// TestBadInput checks every bad-input case gets a clear error and the
// cluster keeps serving.
func TestBadInput(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	admin := "http://" + c.admin + "/v1/functions"
	inv := "http://" + c.invokeAddr

	cases := []struct {
		name, method, url, body string
		status                  int
		mention                 string
	}{
		{"malformed JSON", "POST", admin, `{"name": "x",`, 400, "malformed JSON"},
		{"unknown field", "POST", admin, `{"name": "x", "builtin": "trace", "colour": 1}`, 400, "colour"},
		{"invalid name", "POST", admin, `{"name": "Bad_Name", "builtin": "trace"}`, 400, "name"},
		{"port out of range", "POST", admin, `{"name": "p", "builtin": "trace", "port": 70000}`, 400, "port"},
		{"no artifact", "POST", admin, `{"name": "p"}`, 400, "builtin/command/image"},
		{"bad duration", "POST", admin, `{"name": "p", "builtin": "trace", "timeout": 5}`, 400, "duration"},
		{"min above max", "POST", admin, `{"name": "p", "builtin": "trace", "scaling": {"min": 3, "max": 1}}`, 400, "scaling.min"},
		{"unknown builtin", "POST", admin, `{"name": "p", "builtin": "nope"}`, 400, "builtin"},
		{"get unknown", "GET", admin + "/nope", "", 404, "not found"},
		{"delete unknown", "DELETE", admin + "/nope", "", 404, "not found"},
		{"update unknown", "PUT", admin + "/nope", `{"builtin": "trace"}`, 404, "not found"},
		{"update name mismatch", "PUT", admin + "/a", `{"name": "b", "builtin": "trace"}`, 400, "does not match"},
		{"oversized spec", "POST", admin, `{"name": "big", "builtin": "trace", "env": {"A": "` + strings.Repeat("x", 2<<20) + `"}}`, 413, "1 MiB"},
		{"unknown admin path", "GET", "http://" + c.admin + "/v2/things", "", 404, "no such endpoint"},
		// The operator's limits, and bytes no argv or environment may carry.
		{"scale above the cap", "POST", admin, `{"name": "p", "builtin": "trace", "scaling": {"max": 1000000000}}`, 400, "scaling.max: 1000000000 is above this cluster's limit 10000"},
		{"queue timeout above the cap", "POST", admin, `{"name": "p", "builtin": "trace", "queue": {"timeout": "1000000h"}}`, 400, "queue.timeout"},
		{"NUL in a command", "POST", admin, `{"name": "p", "command": ["/bin/echo", "a\u0000b"]}`, 400, "command[1]: control byte 0x00"},
		{"control byte in the program", "POST", admin, `{"name": "p", "command": ["/bin/ech\no"]}`, 400, "command[0]"},
		{"NUL in an env value", "POST", admin, `{"name": "p", "builtin": "trace", "env": {"A": "x\u0000"}}`, 400, "env.A"},
		{"space in an image", "POST", admin, `{"name": "p", "image": "brisk.local/a b"}`, 400, "image"},
		{"duplicate key", "POST", admin, `{"name": "p", "builtin": "trace", "timeout": "1s", "timeout": "50m"}`, 400, `key "timeout" appears twice`},
		{"duplicate nested key", "POST", admin, `{"name": "p", "builtin": "trace", "env": {"A": "1", "A": "2"}}`, 400, `key "A" appears twice`},
		{"invoke unknown function", "POST", inv + "/function/nope", "{}", 404, "not found"},
		{"invoke unknown host", "GET", inv + "/", "", 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := request(t, tc.method, tc.url, tc.body)
			if a.status != tc.status || !strings.Contains(a.msg, tc.mention) {
				t.Fatalf("got %d %q, want %d mentioning %q", a.status, a.msg, tc.status, tc.mention)
			}
		})
	}

	good := `{"name": "dup", "builtin": "trace"}`
	if a := request(t, "POST", admin, good); a.status != 201 {
		t.Fatalf("create: %d %s", a.status, a.msg)
	}
	if a := request(t, "POST", admin, good); a.status != 409 || !strings.Contains(a.msg, "already exists") {
		t.Fatalf("duplicate: got %d %q, want 409", a.status, a.msg)
	}

	// Oversized invocation body: rejected by the data plane with 413.
	big := bytes.Repeat([]byte("x"), 7<<20)
	resp, err := http.Post(inv+"/function/dup", "application/octet-stream", bytes.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("oversized body: got %d, want 413", resp.StatusCode)
	}

	// Queue full (503) and queue timeout (504) on a one-sandbox function.
	c.mustBrisk(t, "fn", "deploy", "narrow", "--builtin", "trace", "--min", "1", "--max", "1",
		"--queue-depth", "1", "--queue-timeout", "20s")
	eventually(t, 20*time.Second, "narrow ready", func() bool { return c.fn(t, "narrow").Status.Ready == 1 })
	// One call holds the only slot, a second waits in the queue of one; a
	// third is refused at once. Each step is awaited on the data plane's
	// own gauges, so the order does not depend on scheduling.
	url := inv + "/function/narrow"
	holder := asyncCall(url, `{"ms": 3000}`)
	eventually(t, 10*time.Second, "first call in flight", func() bool {
		return sandboxBusy(t, c, inv)
	})
	queued := asyncCall(url, `{"ms": 1}`)
	eventually(t, 10*time.Second, "second call queued", func() bool {
		return metricValue(t, inv+"/metrics", `brisk_dataplane_queued{function="narrow"}`) == 1
	})
	if a := request(t, "POST", url, `{"ms": 1}`); a.status != 503 || !strings.Contains(a.msg, "queue full") {
		t.Fatalf("call beyond the queue: got %d %q, want 503 queue full", a.status, a.msg)
	}
	if code := <-holder; code != 200 {
		t.Fatalf("slot holder: %d", code)
	}
	if code := <-queued; code != 200 {
		t.Fatalf("queued call: %d", code)
	}

	// With a 300ms queue timeout the waiting call gives up with 504.
	c.mustBrisk(t, "fn", "update", "narrow", "--queue-timeout", "300ms")
	eventually(t, 20*time.Second, "narrow updated and ready", func() bool {
		v := c.fn(t, "narrow")
		return v.Status.Ready == 1 && time.Duration(v.Queue.Timeout) == 300*time.Millisecond && len(v.Status.Sandboxes) == 1
	})
	holder = asyncCall(url, `{"ms": 2000}`)
	eventually(t, 10*time.Second, "call in flight on the new revision", func() bool { return sandboxBusy(t, c, inv) })
	if a := request(t, "POST", url, `{"ms": 1}`); a.status != 504 || !strings.Contains(a.msg, "timed out") {
		t.Fatalf("call waiting past the queue timeout: got %d %q, want 504", a.status, a.msg)
	}
	if code := <-holder; code != 200 {
		t.Fatalf("slot holder: %d", code)
	}

	// CLI usage errors exit 2 with a usage line; server errors exit 1.
	out, code := c.brisk(t, "fn", "deploy")
	if code != 2 || !strings.Contains(out, "Usage:") {
		t.Fatalf("deploy without a name: exit %d, output %q", code, out)
	}
	out, code = c.brisk(t, "invoke", "dup", "--no-such-flag")
	if code != 2 || !strings.Contains(out, "unknown flag") {
		t.Fatalf("unknown flag: exit %d, output %q", code, out)
	}
	out, code = c.brisk(t, "fn", "deploy", "x", "--builtin", "trace", "--port", "0", "--command", "/bin/true")
	if code != 2 || !strings.Contains(out, "exactly one") {
		t.Fatalf("two artifacts: exit %d, output %q", code, out)
	}
	out, code = c.brisk(t, "fn", "get", "nope")
	if code != 1 || !strings.Contains(out, "not found") {
		t.Fatalf("get unknown: exit %d, output %q", code, out)
	}

	// The cluster still serves after all of that.
	if r := c.invoke(t, "dup", `{"ms": 1}`); r.status != 200 {
		t.Fatalf("cluster stopped serving after bad input: %d %s", r.status, r.body)
	}
}

// asyncCall posts in the background; the channel yields the status.
func asyncCall(url, body string) <-chan int {
	ch := make(chan int, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- 0
			return
		}
		resp.Body.Close()
		ch <- resp.StatusCode
	}()
	return ch
}

// sandboxBusy reports whether the data plane counts a request of "narrow"
// as in flight (its time-weighted load gauge is the queue plus in-flight).
func sandboxBusy(t *testing.T, c *cluster, inv string) bool {
	return metricValue(t, inv+"/metrics", `brisk_dataplane_inflight{function="narrow"}`) == 1
}

// TestCrashLoopingFunction deploys a command that exits at once: the worker
// must survive, report the failure, back off, and keep serving others.
func TestCrashLoopingFunction(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "crashy", "--command", "/bin/sh -c 'echo dying; exit 3'", "--min", "1", "--queue-timeout", "500ms")
	c.mustBrisk(t, "fn", "deploy", "fine", "--builtin", "trace")
	eventually(t, 20*time.Second, "the failure is reported", func() bool {
		return c.fn(t, "crashy").Status.LastFailure != ""
	})
	if msg := c.fn(t, "crashy").Status.LastFailure; !strings.Contains(msg, "exit") {
		t.Fatalf("failure message %q does not say the command exited", msg)
	}
	if r := c.invoke(t, "fine", `{"ms": 1}`); r.status != 200 {
		t.Fatalf("another function failed while one crash-loops: %d %s", r.status, r.body)
	}
	// Its condition explains it: in fn list, and on the calls that time out.
	eventually(t, 20*time.Second, "the function-failing condition", func() bool {
		return c.fn(t, "crashy").Status.Condition == "function-failing"
	})
	if out := c.mustBrisk(t, "fn", "list"); !strings.Contains(out, "function-failing: ") {
		t.Fatalf("fn list does not show the condition:\n%s", out)
	}
	resp, err := http.Post("http://"+c.invokeAddr+"/function/crashy", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// 504 when its queue timeout ends while starts fail, or 503 at once
	// once reconciler.FailFastAfter starts failed in a row (which of the
	// two depends on how far the back-off has got: the third failure comes
	// ~0.6 s after the first).
	if (resp.StatusCode != 504 && resp.StatusCode != 503) || resp.Header.Get("X-Brisk-Error") != "function-failing" || !strings.Contains(string(body), "exit") {
		t.Fatalf("call of a crash-looping function: %d X-Brisk-Error %q %s; want 504 or 503 function-failing with the exit", resp.StatusCode, resp.Header.Get("X-Brisk-Error"), body)
	}
	// Backoff: creations stay few even though min=1 keeps asking.
	start := metricValue(t, "http://"+c.admin+"/metrics", "brisk_controlplane_sandbox_creations_total")
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r := c.invoke(t, "fine", `{"ms": 50}`); r.status != 200 {
			t.Fatalf("fine: %d", r.status)
		}
	}
	if n := metricValue(t, "http://"+c.admin+"/metrics", "brisk_controlplane_sandbox_creations_total") - start; n > 10 {
		t.Fatalf("%v sandboxes created in 3s for a crash-looping function; backoff should keep it under 10", n)
	}
	st, err := c.cl.Status(t.Context())
	if err != nil || !st.Nodes[0].Connected {
		t.Fatalf("worker not connected after crash loop: %v %+v", err, st)
	}
}

package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Knative Service file round trip: brisk apply deploys it, Host routing
// calls it as Knative would, brisk get -o yaml gives it back, and applying
// that again changes nothing.
func TestKnativeServiceRoundTrip(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	file := filepath.Join(t.TempDir(), "svc.yaml")
	yaml := `apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: hello
  annotations:
    brisk.dev/builtin: trace
    brisk.dev/public: "true"
spec:
  template:
    metadata:
      annotations:
        autoscaling.knative.dev/min-scale: "1"
        autoscaling.knative.dev/max-scale: "3"
        autoscaling.knative.dev/window: "30s"
    spec:
      containerConcurrency: 2
      timeoutSeconds: 60
      containers:
        - image: ignored/by-the-builtin
          env:
            - name: GREETING
              value: hi
          resources:
            requests: {cpu: 100m, memory: 64Mi}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: second
  annotations:
    brisk.dev/builtin: trace
spec:
  template:
    spec:
      containers:
        - image: x
`
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	out := c.mustBrisk(t, "apply", "-f", file)
	if !strings.Contains(out, "service.serving.knative.dev/hello created") || !strings.Contains(out, "service.serving.knative.dev/second created") {
		t.Fatalf("apply: %s", out)
	}
	v := c.fn(t, "hello")
	if v.Scaling.Min != 1 || v.Scaling.Max != 3 || v.Concurrency != 2 || v.Env["GREETING"] != "hi" || v.Resources.MilliCPU != 100 || v.Auth != "public" {
		t.Fatalf("applied spec %+v", v.Function)
	}
	// Knative's routing: Host NAME.NAMESPACE.DOMAIN, any path, no token
	// (the Service is public).
	req, _ := http.NewRequest("POST", "http://"+c.invokeAddr+"/any/path", strings.NewReader(`{"ms": 1}`))
	req.Host = "hello.default.brisk.local"
	resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"requested_ms":1`) {
		t.Fatalf("Host-routed call: %d %s", resp.StatusCode, body)
	}

	got := c.mustBrisk(t, "get", "hello", "-o", "yaml")
	for _, want := range []string{"kind: Service", "name: hello", "autoscaling.knative.dev/max-scale: \"3\"", "containerConcurrency: 2", "url: http://hello.default.brisk.local"} {
		if !strings.Contains(got, want) {
			t.Fatalf("brisk get -o yaml lacks %q:\n%s", want, got)
		}
	}
	back := filepath.Join(t.TempDir(), "back.yaml")
	if err := os.WriteFile(back, []byte(got), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := c.mustBrisk(t, "apply", "-f", back); !strings.Contains(out, "hello configured") {
		t.Fatalf("re-apply: %s", out)
	}
	w := c.fn(t, "hello")
	if w.Scaling != v.Scaling || w.Concurrency != v.Concurrency || w.Env["GREETING"] != "hi" || w.Resources != v.Resources || w.Timeout != v.Timeout || w.Auth != v.Auth || w.Builtin != "trace" {
		t.Fatalf("the round trip changed the spec:\nbefore %+v\nafter  %+v", v.Function, w.Function)
	}
	if out, code := c.brisk(t, "apply", "-f", "/nonexistent.yaml"); code == 0 || !strings.Contains(out, "no such file") {
		t.Fatalf("apply of a missing file: exit %d %s", code, out)
	}
}

package knative

import (
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

const twoServices = `
# a comment
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: hello
  namespace: team-a
  annotations:
    brisk.dev/public: "true"
spec:
  template:
    metadata:
      annotations:
        autoscaling.knative.dev/min-scale: "1"
        autoscaling.knative.dev/max-scale: "10"
        autoscaling.knative.dev/target: "5"
        autoscaling.knative.dev/window: "90s"
        autoscaling.knative.dev/metric: concurrency
        autoscaling.knative.dev/target-utilization-percentage: "70"
    spec:
      containerConcurrency: 4
      timeoutSeconds: 120
      containers:
        - image: registry.example/hello:1
          env:
            - name: TARGET
              value: World
          ports:
            - containerPort: 9000
          resources:
            requests: {cpu: 100m, memory: 64Mi}
            limits: {cpu: "1", memory: 1Gi}
---
apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: tracer
  annotations:
    brisk.dev/builtin: trace
spec:
  template:
    spec:
      containers:
        - image: ignored
`

func TestParseAndBack(t *testing.T) {
	fs, err := Parse([]byte(twoServices))
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 2 {
		t.Fatalf("%d specs", len(fs))
	}
	h := fs[0]
	want := spec.Function{Name: "hello", Namespace: "team-a", Image: "registry.example/hello:1", Port: 9000, Env: map[string]string{"TARGET": "World"},
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 64}, Limits: spec.Resources{MilliCPU: 1000, MemoryMB: 1024}, Concurrency: 4,
		Timeout: spec.Duration(2 * time.Minute), Auth: spec.AuthPublic,
		Scaling: spec.Scaling{Min: 1, Max: 10, Target: 5, TargetUtilization: 0.7, StableWindow: spec.Duration(90 * time.Second),
			KeepAlivePolicy: spec.KeepAliveTTL}}
	if h.Name != want.Name || h.Namespace != want.Namespace || h.Image != want.Image || h.Port != want.Port || h.Env["TARGET"] != "World" ||
		h.Resources != want.Resources || h.Limits != want.Limits || h.Concurrency != 4 || h.Timeout != want.Timeout || h.Auth != want.Auth || h.Scaling != want.Scaling {
		t.Fatalf("parsed %+v\nwant   %+v", *h, want)
	}
	if fs[1].Builtin != "trace" || fs[1].Image != "" {
		t.Fatalf("builtin annotation: %+v", *fs[1])
	}
	// Round trip: the YAML brisk gives back parses to the same spec.
	y, err := YAML(FromSpec(h, "http://hello.team-a.example.com", true, ""))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(y), "url: http://hello.team-a.example.com") {
		t.Fatalf("no status url in\n%s", y)
	}
	back, err := Parse(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	b := back[0]
	if b.Image != h.Image || b.Port != h.Port || b.Resources != h.Resources || b.Limits != h.Limits || b.Scaling != h.Scaling || b.Concurrency != h.Concurrency || b.Timeout != h.Timeout || b.Auth != h.Auth {
		t.Fatalf("round trip\n got %+v\nwant %+v\n%s", *b, *h, y)
	}
}

func TestParseRefusals(t *testing.T) {
	base := func(extra string) string {
		return "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata:\n  name: x\n" + extra
	}
	for what, doc := range map[string]string{
		"wrong kind":    "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\n",
		"no container":  base("spec:\n  template:\n    spec:\n      containers: []\n"),
		"unknown field": base("spec:\n  template:\n    spec:\n      bogus: 1\n      containers:\n        - image: i\n"),
		"rps metric":    base("spec:\n  template:\n    metadata:\n      annotations:\n        autoscaling.knative.dev/metric: rps\n    spec:\n      containers:\n        - image: i\n"),
		"bad quantity":  base("spec:\n  template:\n    spec:\n      containers:\n        - image: i\n          resources:\n            requests: {memory: lots}\n"),
		"bad min":       base("spec:\n  template:\n    metadata:\n      annotations:\n        autoscaling.knative.dev/min-scale: \"-1\"\n    spec:\n      containers:\n        - image: i\n"),
		"valueFrom":     base("spec:\n  template:\n    spec:\n      containers:\n        - image: i\n          env:\n            - name: A\n              valueFrom: {secretKeyRef: {name: s, key: k}}\n"),
		"nothing":       "# only a comment\n",
		"unlimited cc":  base("spec:\n  template:\n    spec:\n      containerConcurrency: 0\n      containers:\n        - image: i\n"),
	} {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
}

func TestQuantities(t *testing.T) {
	for q, want := range map[string]int64{"250m": 250, "0.5": 500, "2": 2000, "": 0} {
		if got, err := spec.ParseMilliCPU(q); err != nil || got != want {
			t.Errorf("cpu %q: %d %v, want %d", q, got, err, want)
		}
	}
	for q, want := range map[string]int64{"128Mi": 128, "1Gi": 1024, "500M": 477, "1048576": 1, "1": 1, "": 0} {
		if got, err := spec.ParseMemoryMB(q); err != nil || got != want {
			t.Errorf("memory %q: %d %v, want %d", q, got, err, want)
		}
	}
}

const pingSource = `
apiVersion: sources.knative.dev/v1
kind: PingSource
metadata:
  name: ping
  namespace: team-a
spec:
  schedule: "*/2 * * * *"
  timezone: Europe/Madrid
  data: '{"message": "Hello world!"}'
  ceOverrides:
    extensions:
      extra: x
  sink:
    ref:
      apiVersion: serving.knative.dev/v1
      kind: Service
      name: event-display
---
apiVersion: sources.knative.dev/v1
kind: PingSource
metadata:
  name: b64
spec:
  schedule: "@hourly"
  contentType: text/plain
  dataBase64: aGVsbG8=
  sink:
    ref:
      kind: Service
      name: hello
      namespace: team-b
`

// A PingSource becomes a cron trigger of the Service its sink names,
// whose calls are CloudEvents as PingSource's.
func TestPingSourceToTrigger(t *testing.T) {
	objs, err := ParseAll([]byte(twoServices + "---\n" + pingSource))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Functions) != 2 || len(objs.Triggers) != 2 {
		t.Fatalf("%d functions, %d triggers", len(objs.Functions), len(objs.Triggers))
	}
	p := objs.Triggers[0]
	if p.Name != "ping" || p.Namespace != "team-a" || p.Function != "event-display" || p.Cron.Schedule != "*/2 * * * *" ||
		p.Cron.TimeZone != "Europe/Madrid" || p.Cron.Payload != `{"message": "Hello world!"}` || p.Cron.ContentType != "application/json" {
		t.Errorf("ping: %+v %+v", p, p.Cron)
	}
	if p.Headers["Ce-Type"] != "dev.knative.sources.ping" || p.Headers["Ce-Source"] != "/apis/v1/namespaces/team-a/pingsources/ping" ||
		p.Headers["Ce-Specversion"] != "1.0" || p.Headers["Ce-extra"] != "x" {
		t.Errorf("ping headers: %v", p.Headers)
	}
	b := objs.Triggers[1]
	if b.Namespace != "team-b" || b.Function != "hello" || b.Cron.Payload != "hello" || b.Cron.ContentType != "text/plain" {
		t.Errorf("b64: %+v %+v", b, b.Cron)
	}
	if _, err := Parse([]byte(pingSource)); err == nil {
		t.Error("Parse took PingSources")
	}
}

func TestPingSourceRefusals(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{strings.Replace(pingSource[:strings.Index(pingSource, "---")], `"*/2 * * * *"`, `"61 * * * *"`, 1), "above maximum"},
		{`{"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "metadata": {"name": "u"}, "spec": {"schedule": "@hourly", "sink": {"uri": "http://x"}}}`, "not a URI"},
		{`{"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "metadata": {"name": "u"}, "spec": {"schedule": "@hourly", "sink": {"ref": {"kind": "Broker", "name": "default"}}}}`, "Broker"},
		{`{"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "metadata": {"name": "u", "namespace": "a"}, "spec": {"schedule": "@hourly", "sink": {"ref": {"kind": "Service", "name": "f", "namespace": "b"}}}}`, "its own namespace"},
		{`{"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "metadata": {"name": "u"}, "spec": {"schedule": "@hourly", "data": "x", "dataBase64": "eA==", "sink": {"ref": {"kind": "Service", "name": "f"}}}}`, "exclusive"},
		{`{"apiVersion": "sources.knative.dev/v1", "kind": "PingSource", "metadata": {"name": "u"}, "spec": {"schedule": "@hourly", "jsonData": "x", "sink": {"ref": {"kind": "Service", "name": "f"}}}}`, "unknown field"},
	} {
		_, err := ParseAll([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.doc, err, c.want)
		}
	}
}

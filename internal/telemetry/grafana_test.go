package telemetry

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

var metricName = regexp.MustCompile(`brisk_[a-z_]+`)

// The Grafana dashboard in deploy/grafana is valid JSON whose every query
// names metrics brisk exports: a metric renamed or removed in the code
// fails here, not on an operator's screen.
func TestGrafanaDashboardQueriesExistingMetrics(t *testing.T) {
	data, err := os.ReadFile("../../deploy/grafana/brisk.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	exported := exportedMetrics(t)
	queries := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			names := metricName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no brisk metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				base := n
				for _, suf := range []string{"_bucket", "_count", "_sum"} {
					base = strings.TrimSuffix(base, suf)
				}
				if !exported[n] && !exported[base] {
					t.Errorf("panel %q: %s is not a metric brisk exports", p.Title, n)
				}
			}
		}
	}
	if queries < 20 {
		t.Fatalf("%d queries: the dashboard lost its panels", queries)
	}
}

// exportedMetrics collects the metric names the code registers (the
// string literals given as metric names in internal/).
func exportedMetrics(t *testing.T) map[string]bool {
	decl := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(brisk_[a-z_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 30 {
		t.Fatalf("found only %d metric declarations under internal/: the scan is broken", len(out))
	}
	return out
}

// A caller's sampled flag does not decide: at a low ratio, calls that all
// say "sampled" are mostly not recorded, and a local child follows its
// parent.
func TestSamplingIgnoresCallersFlag(t *testing.T) {
	tp, shutdown, err := Setup(t.Context(), Config{Endpoint: "http://127.0.0.1:1", SampleRatio: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t.Context())
	tr := tp.Tracer("test")
	recorded := 0
	for i := range 1000 {
		var tid trace.TraceID
		binary.BigEndian.PutUint64(tid[8:], uint64(i+1)*0x9E3779B97F4A7C15) // spread over the ids the ratio sampler reads
		remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true})
		ctx, span := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "call")
		if span.IsRecording() {
			recorded++
			_, child := tr.Start(ctx, "child")
			if !child.IsRecording() {
				t.Fatal("a local child of a recorded span is not recorded")
			}
			child.End()
		}
		span.End()
	}
	if recorded > 100 {
		t.Fatalf("%d of 1000 calls with a sampled traceparent recorded at ratio 0.01", recorded)
	}
}

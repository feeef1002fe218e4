package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/sim"
)

const azure100 = "../../traces/azure_100"

// brisk sim writes replay's summary.json with the simulated cluster's
// settings, from the real trace sample.
func TestSimWritesReplayOutputs(t *testing.T) {
	dir := t.TempDir()
	cfg := ReplayConfig{TraceDir: azure100, Minutes: 3, Warmup: 1, TimeScale: 1, Seed: 42, IAT: "exponential", Granularity: "minute", SkipMinutes: -1}
	out, _, err := Sim(cfg, sim.Config{Nodes: 20, Placement: "ch-rlu"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if out.Completed != out.Requested || out.Requested == 0 || out.SandboxesCreated == 0 {
		t.Fatalf("completed %d of %d requested, %d sandboxes", out.Completed, out.Requested, out.SandboxesCreated)
	}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Command string `json:"command"`
		Sim     struct {
			Nodes     int    `json:"nodes"`
			Placement string `json:"placement"`
		} `json:"sim"`
	}
	if err := json.Unmarshal(b, &got); err != nil || got.Command != "sim" || got.Sim.Nodes != 20 || got.Sim.Placement != "ch-rlu" {
		t.Fatalf("summary.json: %+v %v", got, err)
	}
	for _, f := range []string{"invocations.csv", "slowdown_cdf.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkSimAzure500 is the first scale target: azure_500, 30
// minutes (10 warm-up + 20 measured), on 1,000 nodes.
func BenchmarkSimAzure500(b *testing.B) {
	cfg := ReplayConfig{TraceDir: "../../traces/azure_500", Minutes: 20, Warmup: 10, TimeScale: 1, Seed: 42, IAT: "exponential", Granularity: "minute"}
	for b.Loop() {
		out, _, err := Sim(cfg, sim.Config{Nodes: 1000}, "")
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(out.Sim.Events), "events")
		b.ReportMetric(out.Sim.HeapMiB, "heap-MiB")
	}
}

// SimCompare runs each policy on the same schedule and writes one CDF and a
// table with a row per policy.
func TestSimCompare(t *testing.T) {
	dir := t.TempDir()
	cfg := ReplayConfig{TraceDir: azure100, Minutes: 2, Warmup: 1, TimeScale: 1, Seed: 42, IAT: "exponential", Granularity: "minute", SkipMinutes: -1}
	table, err := SimCompare(cfg, sim.Config{Nodes: 10}, []string{"kubernetes", "bin-packing"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(table), "\n")
	if len(rows) != 4 || !strings.HasPrefix(rows[2], "| kubernetes |") || !strings.HasPrefix(rows[3], "| bin-packing |") {
		t.Fatalf("table:\n%s", table)
	}
	for _, f := range []string{"compare.md", "slowdown_cdf.png", "kubernetes/summary.json", "bin-packing/summary.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

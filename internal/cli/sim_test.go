package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// simRoot is a command tree with brisk sim alone.
func simRoot(args ...string) (*cobra.Command, *bytes.Buffer, *bytes.Buffer) {
	return cmdRoot(args, newSim())
}

// repoTrace is traces/name of this repository.
func repoTrace(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(moduleRoot(t), "traces", name)
}

type simSummaryJSON struct {
	SandboxesCreated int64 `json:"sandboxes_created"`
	Slowdown         struct {
		GeomeanP99 float64 `json:"geomean_p99"`
	} `json:"slowdown"`
	Templates *templateSummary `json:"templates"`
}

func readSimSummary(t *testing.T, path string) simSummaryJSON {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s simSummaryJSON
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s
}

var simSample = []string{"--minutes", "3", "--warmup", "1", "--nodes", "50", "--cold-start", "150ms", "--cached-cold-start", "150ms"}

// --template-fraction with several values: a run each under
// template-<F>/ with its templates in summary.json, and the comparison.
func TestSimTemplateSweep(t *testing.T) {
	dir := t.TempDir()
	root, out, _ := simRoot(append([]string{"sim", repoTrace(t, "azure_100"), "--template-fraction", "0,0.1,1", "--out", dir}, simSample...)...)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "compare.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(md) != out.String() {
		t.Errorf("printed table differs from compare.md:\n%s\n%s", out, md)
	}
	lines := strings.Split(strings.TrimSpace(string(md)), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[2], "| 0 | 0 |") || !strings.HasPrefix(lines[3], "| 0.1 | 5 |") || !strings.HasPrefix(lines[4], "| 1 | 50 |") {
		t.Fatalf("compare.md:\n%s", md)
	}
	if st, err := os.Stat(filepath.Join(dir, "slowdown_cdf.png")); err != nil || st.Size() == 0 {
		t.Errorf("slowdown_cdf.png: %v", err)
	}
	none := readSimSummary(t, filepath.Join(dir, "template-0", "summary.json"))
	tenth := readSimSummary(t, filepath.Join(dir, "template-0.1", "summary.json"))
	all := readSimSummary(t, filepath.Join(dir, "template-1", "summary.json"))
	for _, s := range []simSummaryJSON{none, tenth, all} {
		if s.Templates == nil || s.Templates.SandboxesCreated != s.SandboxesCreated || s.Templates.StartMs != 5 || s.Templates.PlacementAware {
			t.Fatalf("templates block %+v (sandboxes %d)", s.Templates, s.SandboxesCreated)
		}
	}
	if none.Templates.Starts != 0 || none.Templates.NodesPerFunction != 0 {
		t.Errorf("fraction 0: %+v", none.Templates)
	}
	if tp := tenth.Templates; tp.Fraction != 0.1 || tp.NodesPerFunction != 5 || tp.Starts <= 0 || tp.Starts >= tp.SandboxesCreated {
		t.Errorf("fraction 0.1: %+v", tp)
	}
	if tp := all.Templates; tp.Starts != tp.SandboxesCreated || tp.HitRate != 1 {
		t.Errorf("fraction 1: %+v", tp)
	}
	if !(all.Slowdown.GeomeanP99 < tenth.Slowdown.GeomeanP99 && tenth.Slowdown.GeomeanP99 <= none.Slowdown.GeomeanP99) {
		t.Errorf("slowdown %.3f, %.3f, %.3f: want it to fall with the fraction", none.Slowdown.GeomeanP99, tenth.Slowdown.GeomeanP99, all.Slowdown.GeomeanP99)
	}
}

// With the locality placement the reconciler learns from the nodes'
// heartbeats where templates are and places sandboxes there: at a tenth
// of the nodes nearly every sandbox starts from a template, where the
// kubernetes policy hits about a tenth.
func TestSimTemplateAwarePlacement(t *testing.T) {
	dir := t.TempDir()
	root, _, _ := simRoot(append([]string{"sim", repoTrace(t, "azure_100"), "--template-fraction", "0.1", "--placement", "locality", "--out", dir}, simSample...)...)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	s := readSimSummary(t, filepath.Join(dir, "summary.json"))
	if tp := s.Templates; tp == nil || !tp.PlacementAware || tp.NodesPerFunction != 5 || tp.HitRate < 0.9 {
		t.Fatalf("templates block %+v: want placement-aware and a hit rate near 1 on 5 of 50 nodes", tp)
	}
}

// Without --template-fraction a run is as before: no templates block; with
// --template-fraction 0 the calls are the same, and the block says so.
func TestSimTemplateFractionZero(t *testing.T) {
	plain, zero := t.TempDir(), t.TempDir()
	root, _, _ := simRoot(append([]string{"sim", repoTrace(t, "azure_100"), "--out", plain}, simSample...)...)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	root, out, _ := simRoot(append([]string{"sim", repoTrace(t, "azure_100"), "--out", zero, "--template-fraction", "0"}, simSample...)...)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if s := readSimSummary(t, filepath.Join(plain, "summary.json")); s.Templates != nil {
		t.Errorf("a run without --template-fraction has a templates block: %+v", s.Templates)
	}
	if s := readSimSummary(t, filepath.Join(zero, "summary.json")); s.Templates == nil || s.Templates.Starts != 0 {
		t.Errorf("--template-fraction 0: templates block %+v", s.Templates)
	}
	a, _ := os.ReadFile(filepath.Join(plain, "invocations.csv"))
	b, _ := os.ReadFile(filepath.Join(zero, "invocations.csv"))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("--template-fraction 0 changed the calls (%d and %d bytes)", len(a), len(b))
	}
	if !strings.Contains(out.String(), "templates: none (fraction 0)") {
		t.Errorf("text summary:\n%s", out)
	}
}

func TestSimTemplateFlagsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--template-fraction", "0.1,2"},
		{"--template-fraction", "-0.1"},
		{"--template-fraction", "half"},
		{"--template-fraction", "0.1,0.2", "--placement", "kubernetes,ch-bl"},
		{"--template-fraction", "0.1,0.2", "--modes", "async,dual"},
		{"--template-fraction", "0.1", "--template-start", "0s"},
	} {
		root, _, _ := simRoot(append([]string{"sim", repoTrace(t, "azure_100"), "--minutes", "1"}, args...)...)
		var ue usageError
		if err := root.Execute(); !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// The templates block goes at the end of bench's summary.json, which keeps
// every byte it had.
func TestTemplateRunAddToSummary(t *testing.T) {
	dir := t.TempDir()
	orig := "{\n  \"command\": \"sim\",\n  \"sim\": {\n    \"nodes\": 50\n  }\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &templateRun{fraction: 0.1, start: 5e6, nodes: 5, starts: 3, created: 12}
	if err := r.addToSummary(dir); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "summary.json"))
	if !strings.HasPrefix(string(b), orig[:len(orig)-3]+",\n  \"templates\": {\n    \"fraction\": 0.1,") ||
		!strings.HasSuffix(string(b), "  }\n}\n") || !json.Valid(b) {
		t.Fatalf("summary.json:\n%s", b)
	}
	var got struct{ Templates templateSummary }
	if err := json.Unmarshal(b, &got); err != nil || got.Templates.HitRate != 0.25 || got.Templates.NodesPerFunction != 5 {
		t.Fatalf("%+v %v", got, err)
	}
}

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

// benchRoot builds a command tree with only the benchmark commands, as the
// root command will once it registers them.
func benchRoot(args ...string) (*cobra.Command, *bytes.Buffer, *bytes.Buffer) {
	g := &globals{admin: "127.0.0.1:1", invoke: "127.0.0.1:1", logLevel: "info"}
	return cmdRoot(args, newBench(g), newReplay(g))
}

// cmdRoot is a command tree with cmds alone, given args, its output
// captured.
func cmdRoot(args []string, cmds ...*cobra.Command) (*cobra.Command, *bytes.Buffer, *bytes.Buffer) {
	root := &cobra.Command{Use: "brisk", SilenceUsage: true, SilenceErrors: true}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(cmds...)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	return root, &out, &errOut
}

// moduleRoot is the directory of the go.mod above the test.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = filepath.Dir(dir)
	}
}

func traces(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(moduleRoot(t), "..", "shared", "traces", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("trace %s not available: %v", p, err)
	}
	return p
}

func TestReplayDryRunPrintsTheSchedule(t *testing.T) {
	dir := traces(t, "azure_100")
	root, out, _ := benchRoot("replay", dir, "--minutes", "30", "--dry-run")
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != "function,offset_us,runtime_ms,memory_mb" || len(lines)-1 != 19_058 {
		t.Fatalf("dry run: header %q and %d rows, want 19058", lines[0], len(lines)-1)
	}
	// Same seed, same bytes.
	root2, out2, _ := benchRoot("replay", dir, "--minutes", "30", "--dry-run", "--seed", "42")
	if err := root2.Execute(); err != nil || out2.String() != out.String() {
		t.Fatalf("second dry run differs (err %v)", err)
	}
	root3, out3, _ := benchRoot("replay", dir, "--minutes", "2", "--functions", "3", "--iat", "equidistant_shift", "--time-scale", "0.5", "--dry-run")
	if err := root3.Execute(); err != nil {
		t.Fatal(err)
	}
	fns := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out3.String()), "\n")[1:] {
		fns[strings.Split(l, ",")[0]] = true
	}
	if len(fns) != 3 {
		t.Fatalf("--functions 3 scheduled %d functions: %v", len(fns), fns)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	dir := traces(t, "azure_100")
	for _, args := range [][]string{
		{"bench", "warm", "--duration", "1s"},
		{"bench", "warm", "--rate", "10", "--duration", "1s", "--direct", "--compare-direct"},
		{"bench", "cold", "--rate", "10"},
		{"bench", "register"},
		{"bench", "scale", "--functions", "5", "--sandboxes", "2"},
		{"bench", "warm", "--rate", "10", "--duration", "1s", "--local", "--runtime", "process", "--workers", "3"},
		{"bench", "warm", "--rate", "x"},
		{"bench", "warm", "--rate", "10", "--closed", "4", "--duration", "1s"},
		{"bench", "warm", "--closed", "4", "--duration", "1s", "--rounds", "0"},
		{"bench", "warm", "--closed", "4", "--duration", "1s", "--rounds", "20"},
		{"bench", "http", "--url", "http://127.0.0.1:1/", "--rate", "10", "--closed", "4", "--duration", "1s"},
		{"replay", dir, "--iat", "poisson", "--dry-run"},
		{"replay", dir, "--minutes", "100000", "--dry-run"},
		{"replay"},
	} {
		root, _, _ := benchRoot(args...)
		err := root.Execute()
		var ue usageError
		if !errors.As(err, &ue) && !isFlagError(err) {
			t.Errorf("brisk %s: error %v, want a usage error", strings.Join(args, " "), err)
		}
	}
}

func TestBenchWarmLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster")
	}
	out := t.TempDir()
	root, stdout, stderr := benchRoot("bench", "warm", "--local", "--rate", "50", "--duration", "1s", "--warmup", "200ms",
		"--compare-direct", "--out", out, "--max-late-fraction", "1")
	if err := root.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var s struct {
		Valid     bool `json:"valid"`
		Issued    int  `json:"issued"`
		Completed int  `json:"completed"`
		LatencyMs struct {
			P50 float64 `json:"p50"`
		} `json:"latency_ms"`
		Direct *struct {
			Completed int `json:"completed"`
		} `json:"direct"`
		Compare *struct {
			ThroughputRatio float64 `json:"throughput_ratio"`
		} `json:"compare"`
	}
	data, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	if !s.Valid || s.Issued != 50 || s.Completed != 50 || s.LatencyMs.P50 <= 0 || s.Direct == nil || s.Direct.Completed != 50 || s.Compare == nil {
		t.Fatalf("summary.json: %s", data)
	}
	for _, f := range []string{"invocations.csv", "direct.csv", "latency_cdf.png", "cluster.log"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
	if !strings.Contains(stdout.String(), "brisk over direct") {
		t.Errorf("human summary:\n%s", stdout)
	}
}

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// The comparison's table: memory normalized to the cheapest run, one CSV
// row per replay, and the plot written.
func TestWriteModes(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	c := &cobra.Command{}
	c.SetOut(&out)
	c.SetErr(&bytes.Buffer{})
	points := []modePoint{
		{mode: "async", window: 6 * time.Second, slowdown: 3, gbs: 20},
		{mode: "dual", window: 6 * time.Second, slowdown: 2, gbs: 10, emergency: 7},
	}
	if err := writeModes(c, dir, points, []string{"async", "dual"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "modes.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want := "mode,stable_window_s,keep_alive_s,slowdown_geomean_p99,memory_gb_s,memory_normalized,emergency_sandboxes,failed\n" +
		"async,6,36,3.0000,20.00,2.000,0,0\n" +
		"dual,6,36,2.0000,10.00,1.000,7,0\n"
	if string(b) != want {
		t.Errorf("modes.csv:\n%s\nwant:\n%s", b, want)
	}
	if st, err := os.Stat(filepath.Join(dir, "modes.png")); err != nil || st.Size() == 0 {
		t.Errorf("modes.png: %v", err)
	}
	if !strings.Contains(out.String(), "dual   6s") {
		t.Errorf("table:\n%s", out.String())
	}
}

// --merge compares runs already on disk, and refuses a directory holding
// another mode's run.
func TestModesMerge(t *testing.T) {
	dir := t.TempDir()
	write := func(sub, mode string, window, slowdown, gbs float64) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		s := `{"slowdown":{"geomean_p99":` + strconv.FormatFloat(slowdown, 'f', -1, 64) + `},"total_gb_s":` + strconv.FormatFloat(gbs, 'f', -1, 64) +
			`,"emergency":{"sandboxes":3},"config":{"scaling_mode":"` + mode + `","stable_window_s":` + strconv.FormatFloat(window, 'f', -1, 64) + `}}`
		if err := os.WriteFile(filepath.Join(dir, sub, "summary.json"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("async-6s", "async", 6, 4, 30)
	write("dual-6s", "dual", 6, 2, 15)
	root, out, errOut := benchRoot("bench", "modes", "traces", "--out", dir, "--merge", "--modes", "async,dual", "--stable-windows", "6s")
	if err := root.Execute(); err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	b, err := os.ReadFile(filepath.Join(dir, "modes.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "async,6,36,4.0000,30.00,2.000,3,0\ndual,6,36,2.0000,15.00,1.000,3,0\n"; !strings.HasSuffix(string(b), want) {
		t.Errorf("modes.csv:\n%s\nwant rows:\n%s", b, want)
	}
	write("dual-6s", "sync", 6, 2, 15)
	root, _, _ = benchRoot("bench", "modes", "traces", "--out", dir, "--merge", "--modes", "async,dual", "--stable-windows", "6s")
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "holds a sync run") {
		t.Errorf("merging a directory of another mode's run: %v", err)
	}
}

package cli

import (
	"bytes"
	"os"
	"path/filepath"
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

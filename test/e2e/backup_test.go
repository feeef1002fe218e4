package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
)

// TestBackupAndRestore saves the registry of a running control plane with
// `brisk backup`, and starts a new control plane from the saved file alone:
// it holds the functions registered before the backup and none after.
func TestBackupAndRestore(t *testing.T) {
	c := newCluster(t)
	cp := startBrisk(t, append([]string{"controlplane"}, c.cpArgs()...)...)
	eventually(t, 30*time.Second, "control plane up", func() bool { return httpOK("http://" + c.admin + "/healthz") })
	for _, name := range []string{"alpha", "beta"} {
		c.mustBrisk(t, "fn", "deploy", name, "--builtin", "trace")
	}
	file := filepath.Join(t.TempDir(), "registry-backup.db")
	if out := c.mustBrisk(t, "backup", file); !strings.Contains(out, "registry saved to "+file) {
		t.Fatalf("brisk backup said %q", out)
	}
	c.mustBrisk(t, "fn", "deploy", "gamma", "--builtin", "trace") // after the backup

	// Bad input: a directory that does not exist, a missing argument.
	if out, code := c.brisk(t, "backup", filepath.Join(t.TempDir(), "no", "such", "dir", "x.db")); code == 0 || !strings.Contains(out, "no such file or directory") {
		t.Fatalf("backup into a missing directory: exit %d %q", code, out)
	}
	if out, code := c.brisk(t, "backup"); code != 2 || !strings.Contains(out, "Usage:") {
		t.Fatalf("backup without a file: exit %d %q", code, out)
	}
	cp.stop(syscall.SIGTERM)

	restored := newCluster(t)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(restored.dataDir, "registry.db"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	// The restored registry keeps its tokens: the original admin token
	// works, and no new one is made.
	registerAdmin(restored.admin, c.dataDir)
	startBrisk(t, append([]string{"controlplane"}, restored.cpArgs()...)...)
	eventually(t, 30*time.Second, "restored control plane up", func() bool { return httpOK("http://" + restored.admin + "/healthz") })
	fns, err := restored.cl.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fns {
		names = append(names, f.Name)
	}
	sort.Strings(names)
	if got := strings.Join(names, ","); got != "alpha,beta" {
		t.Fatalf("restored registry holds %q, want alpha,beta", got)
	}
	if _, err := os.Stat(filepath.Join(restored.dataDir, api.AdminTokenFile)); !os.IsNotExist(err) {
		t.Fatalf("the restored control plane made a new admin token (%v): it has the registry's", err)
	}
}

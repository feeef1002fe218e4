package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestREADMECommands runs scripts/check-readme.sh (make readme-check):
// every shell command of README.md's fenced blocks, in order, against a
// local cluster the script starts and stops, except those the README's
// readme-check markers skip. `brisk` in the README is the binary TestMain
// built (BRISK, and its directory first on PATH).
func TestREADMECommands(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (scripts/setup.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../../scripts/check-readme.sh")
	// On the timeout, SIGTERM lets the script stop the cluster it started;
	// SIGKILL follows if it does not end.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = append(os.Environ(),
		"BRISK="+briskBin,
		"PATH="+filepath.Dir(briskBin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"CMD_TIMEOUT=60")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the README check did not finish within 3 minutes:\n%s", out)
	}
	if err != nil {
		t.Fatalf("the README check failed (%v):\n%s", err, out)
	}
	t.Logf("%s", out)
}

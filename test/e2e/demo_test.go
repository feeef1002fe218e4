package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDemoScript runs the README's run command path (scripts/demo.sh, what
// `make demo` runs) on free ports and checks it served real calls.
func TestDemoScript(t *testing.T) {
	c := newCluster(t)
	cmd := exec.Command("../../scripts/demo.sh")
	cmd.Env = append(os.Environ(), "DEMO_EXIT=1", "BRISK="+briskBin, "BRISK_ADMIN="+c.admin,
		"BRISK_INVOKE="+c.invokeAddr, "BRISK_GRPC="+c.grpc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{"function hello created", "start: cold", "start: warm", `"Status":"OK"`, "hello  default", "builtin:trace"} {
		if !strings.Contains(s, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, s)
		}
	}
	if strings.Count(s, `"Status":"OK"`) != 4 {
		t.Fatalf("want 4 successful calls in the demo output:\n%s", s)
	}
}

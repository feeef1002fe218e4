package runtime_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The interface package every runtime and the worker import stays light:
// it links none of containerd's client (it used to pull 86 of its
// packages through internal/image for two image names, now in
// internal/image/ref).
func TestInterfaceLinksNoContainerd(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "containerd") {
			t.Errorf("internal/worker/runtime depends on %s", p)
		}
	}
}

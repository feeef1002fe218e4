package reconciler_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The reconciler is a pure value stepped with now: it links no storage,
// consensus or messaging (neither does the simulator, which steps it), so
// no I/O can creep into it by an import. Its events are the wire's
// protobuf messages, which still bring gRPC's package.
func TestReconcilerLinksNoStorage(t *testing.T) {
	for _, pkg := range []string{".", "../../sim"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, p := range strings.Fields(string(out)) {
			for _, banned := range []string{"bbolt", "hashicorp/raft", "nats-io", "containerd", "/controlplane/store"} {
				if strings.Contains(p, banned) {
					t.Errorf("%s depends on %s", pkg, p)
				}
			}
		}
	}
}

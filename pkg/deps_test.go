package pkg_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The packages under pkg/ are for other modules, which cannot import
// brisk's internal/ packages: neither may pkg/ (a type reached through an
// internal package would make the SDK unusable outside this module).
func TestNoInternalImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "/brisk/internal/") {
			t.Errorf("pkg/ depends on %s", p)
		}
		// The JSON SDK needs neither (they were 17 MB of a program using
		// it): the wire conversions live in internal/specpb.
		if strings.Contains(p, "google.golang.org/grpc") || strings.Contains(p, "google.golang.org/protobuf") {
			t.Errorf("pkg/ links %s", p)
		}
	}
}

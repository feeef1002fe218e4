package kube

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// A warning the apiserver repeats for every Pod (a Pod Security "warn"
// level) is logged once; another is logged too; non-299 codes are not.
func TestWarningsLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	w := &onceWarnings{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for range 3 {
		w.HandleWarningHeader(299, "-", `would violate PodSecurity "restricted:latest"`)
	}
	w.HandleWarningHeader(299, "-", "another")
	w.HandleWarningHeader(199, "-", "not a warning of the apiserver's")
	if n := strings.Count(buf.String(), "logged once"); n != 2 {
		t.Errorf("%d lines logged, want 2:\n%s", n, buf.String())
	}
}

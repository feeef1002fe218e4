package cli

import (
	"testing"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// fn deploy over an existing name says what the new spec replaced: fields,
// and the keys of maps and objects, never their values.
func TestSpecChanges(t *testing.T) {
	old := &spec.Function{Name: "f", Builtin: "trace", Env: map[string]string{"A": "1", "B": "2"}, Scaling: spec.Scaling{Max: 5}, Revision: 1}
	neu := &spec.Function{Name: "f", Image: "img:1", Env: map[string]string{"A": "9", "C": "3"}, Scaling: spec.Scaling{Max: 5}, Revision: 2}
	if got, want := specChanges(old, neu), "builtin, env (~A -B +C), image"; got != want {
		t.Fatalf("changes %q, want %q", got, want)
	}
	gone := *old
	gone.Env, gone.Revision = nil, 3
	if got, want := specChanges(old, &gone), "env (-A -B)"; got != want {
		t.Fatalf("env removed: %q, want %q", got, want)
	}
	same := *old
	same.Revision = 4
	if got := specChanges(old, &same); got != "" {
		t.Fatalf("only the revision differs: %q", got)
	}
}

package runtime

import (
	"slices"
	"testing"
)

func TestExpandArgs(t *testing.T) {
	env := []string{"PATH=/bin", "PORT=1", "NAME=fn", "PORT=8123"}
	got := ExpandArgs([]string{
		"server", "--port", "$PORT", "--addr=:${PORT}", "$(PORT)", "$(NAME)-$NAME.log",
		"$UNKNOWN", "${UNKNOWN}", "$$PORT", "cost$", "${PORT", "$(PORT", "$1", "plain",
	}, env)
	want := []string{
		"server", "--port", "8123", "--addr=:8123", "8123", "fn-fn.log",
		"$UNKNOWN", "${UNKNOWN}", "$$PORT", "cost$", "${PORT", "$(PORT", "$1", "plain",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ExpandArgs:\n got %q\nwant %q", got, want)
	}
}

package cli

import (
	"reflect"
	"testing"
)

func TestSplitCommand(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"/bin/srv --flag", []string{"/bin/srv", "--flag"}},
		{`/bin/sh -c 'echo a b; exit 3'`, []string{"/bin/sh", "-c", "echo a b; exit 3"}},
		{`prog "two words" x\ y`, []string{"prog", "two words", "x y"}},
		{`  spaced   out  `, []string{"spaced", "out"}},
		{`a ""`, []string{"a", ""}},
	}
	for _, tc := range tests {
		got, err := splitCommand(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitCommand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "   ", `"open`, `trailing\`} {
		if _, err := splitCommand(bad); err == nil {
			t.Errorf("splitCommand(%q) should fail", bad)
		}
	}
}

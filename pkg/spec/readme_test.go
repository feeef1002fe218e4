package spec

import (
	"os"
	"regexp"
	"testing"
)

// The README's spec example is what users paste first: it must be a spec
// the admin API takes.
func TestREADMESpecParses(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)### Function spec[^\n]*\n\n```json\n(.*?)```").FindSubmatch(b)
	if blocks == nil {
		t.Fatal("README.md has no ```json block under \"### Function spec\"")
	}
	f, err := Decode(blocks[1])
	if err != nil {
		t.Fatalf("README's spec example: %v", err)
	}
	f.ApplyDefaults()
	if err := f.Validate(); err != nil {
		t.Fatalf("README's spec example: %v", err)
	}
	if f.Name != "hello" || len(f.Secrets) != 1 {
		t.Fatalf("README's spec example decoded as %+v", f)
	}
}

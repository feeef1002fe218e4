package statefile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func open(t *testing.T, dir string) (*File, string) {
	t.Helper()
	f, b, err := Open(dir, "table")
	if err != nil {
		t.Fatal(err)
	}
	return f, string(b)
}

func write(t *testing.T, f *File, s string) {
	t.Helper()
	if err := f.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func TestNewestWholeSlotWins(t *testing.T) {
	dir := t.TempDir()
	f, got := open(t, dir)
	if got != "" {
		t.Fatalf("a new file reads %q, want nothing", got)
	}
	write(t, f, "one")
	write(t, f, "two")
	write(t, f, "three")
	if _, got := open(t, dir); got != "three" {
		t.Fatalf("read %q, want the last write", got)
	}
	// A write cut short (truncated, then killed) leaves the change before.
	if err := os.Truncate(filepath.Join(dir, "table.0"), 5); err != nil {
		t.Fatal(err)
	}
	f, got = open(t, dir)
	if got != "two" {
		t.Fatalf("with the newest slot cut short read %q, want the one before", got)
	}
	// Writing goes on over the spoiled slot, with a higher sequence.
	write(t, f, "four")
	if _, got := open(t, dir); got != "four" {
		t.Fatalf("read %q, want four", got)
	}
}

func TestRewritesReuseTheSlots(t *testing.T) {
	dir := t.TempDir()
	f, _ := open(t, dir)
	write(t, f, "a")
	write(t, f, "b")
	inodes := map[uint64]bool{}
	for i := range 10 {
		write(t, f, strings.Repeat("x", i))
		for _, slot := range []string{"table.0", "table.1"} {
			st, err := os.Stat(filepath.Join(dir, slot))
			if err != nil {
				t.Fatal(err)
			}
			inodes[st.Sys().(*syscall.Stat_t).Ino] = true
		}
	}
	if len(inodes) != 2 {
		t.Errorf("12 writes used %d inodes, want the two slots'", len(inodes))
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("%d files in the directory, want the two slots", len(ents))
	}
}

func TestNoWholeSlotIsAnError(t *testing.T) {
	dir := t.TempDir()
	for _, s := range []string{"table.0", "table.1"} {
		if err := os.WriteFile(filepath.Join(dir, s), []byte("brisk-state 1 0\nnot this"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := Open(dir, "table"); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("Open of two spoiled slots = %v, want a checksum error", err)
	}
}

func TestReadsAndRetiresThePlainFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "table"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, got := open(t, dir)
	if got != "old" {
		t.Fatalf("read %q, want the plain file's content", got)
	}
	write(t, f, "new")
	if _, err := os.Stat(filepath.Join(dir, "table")); !os.IsNotExist(err) {
		t.Errorf("the plain file is still there after a write (%v)", err)
	}
	if _, got := open(t, dir); got != "new" {
		t.Fatalf("read %q, want new", got)
	}
}

// The first write ever, cut short, leaves the state from before it.
func TestFirstWriteCutShort(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "table"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "table.0"), nil, 0o600); err != nil { // truncated, then killed
		t.Fatal(err)
	}
	f, got := open(t, dir)
	if got != "old" {
		t.Fatalf("read %q, want the plain file's content", got)
	}
	write(t, f, "new")
	if _, got := open(t, dir); got != "new" {
		t.Fatalf("read %q after a write, want new", got)
	}
}

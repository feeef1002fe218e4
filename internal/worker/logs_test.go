package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogHelpers(t *testing.T) {
	dir := t.TempDir()
	fdir := filepath.Join(dir, "fn")
	if err := os.MkdirAll(fdir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(fdir, "sb-1.log")
	write := func(s string) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write("one\ntwo\nthree\n")
	if got := lastLines(p, 2); strings.Join(got, ",") != "two,three" {
		t.Fatalf("tail 2: %v", got)
	}
	if got := lastLines(p, 0); len(got) != 3 {
		t.Fatalf("all: %v", got)
	}
	if fs := logFiles(fdir, ""); len(fs) != 1 || fs[0].sandbox != "sb-1" {
		t.Fatalf("files %v", fs)
	}
	offsets := map[string]int64{p: int64(len("one\ntwo\nthree\n"))}
	var got []string
	emit := func(s string) error { got = append(got, s); return nil }
	write("four\npart")
	if err := followFile(p, offsets, emit); err != nil || strings.Join(got, ",") != "four" {
		t.Fatalf("follow: %v %v", got, err)
	}
	write("ial\n")
	got = nil
	if err := followFile(p, offsets, emit); err != nil || strings.Join(got, ",") != "partial" {
		t.Fatalf("follow a line finished later: %v", got)
	}
	// Rotation: the log moves to .1 and starts again; history reads both.
	rotateOnce(dir, 8)
	if st, _ := os.Stat(p); st.Size() != 0 {
		t.Fatalf("rotated log has %d bytes", st.Size())
	}
	write("five\n")
	if got := lastLines(p, 3); strings.Join(got, ",") != "four,partial,five" {
		t.Fatalf("tail across the rotation: %v", got)
	}
	got = nil
	if err := followFile(p, offsets, emit); err != nil || strings.Join(got, ",") != "five" {
		t.Fatalf("follow across the rotation: %v", got)
	}
}

package worker

import (
	"bufio"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"
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
	// Rotation: the log's last 13 bytes (whole lines) move to .1, the log
	// starts again with a line saying what was dropped; history reads both.
	if dropped := capLog(p, 13); dropped != int64(len("one\ntwo\nthree\n")) {
		t.Fatalf("dropped %d bytes", dropped)
	}
	if b, _ := os.ReadFile(p + ".1"); string(b) != "four\npartial\n" {
		t.Fatalf("rotated: %q", b)
	}
	write("five\n")
	got = lastLines(p, 4)
	if len(got) != 4 || got[0] != "four" || got[1] != "partial" || !strings.HasPrefix(got[2], "[brisk] 14 bytes of this sandbox's output dropped") || got[3] != "five" {
		t.Fatalf("tail across the rotation: %q", got)
	}
	got = nil
	if err := followFile(p, offsets, emit); err != nil || len(got) != 2 || got[1] != "five" {
		t.Fatalf("follow across the rotation: %v", got)
	}
	if capLog(p, 1<<20) != 0 {
		t.Fatal("a log under its cap rotated")
	}
}

// A flood is rotated without reading it into memory (issue 36: rotating a
// 2 GB log took brisk's RSS from 192 to 2,061 MiB): 64 MiB of output with
// a 1 MiB cap keeps its last MiB, and the rotation allocates less than 1 MiB.
func TestCapLogStreams(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sb.log")
	line := strings.Repeat("x", 1023) + "\n"
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for range 64 << 10 {
		w.WriteString(line)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	dropped := capLog(p, 1<<20)
	goruntime.ReadMemStats(&after)
	if dropped != 63<<20 {
		t.Fatalf("dropped %d bytes, want 63 MiB", dropped)
	}
	if st, err := os.Stat(p + ".1"); err != nil || st.Size() != 1<<20 {
		t.Fatalf("rotated: %v %v, want 1 MiB", st, err)
	}
	if a := after.TotalAlloc - before.TotalAlloc; a > 1<<20 {
		t.Fatalf("the rotation allocated %d bytes", a)
	}
}

// The sweep: a finished sandbox's logs go after the retention; a function
// past its cap loses its oldest finished logs; the node past its budget
// loses finished logs across functions, then the largest live log is
// truncated; a live log is never deleted.
func TestSweepLogs(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	mk := func(fn, name string, size int, age time.Duration) string {
		t.Helper()
		p := filepath.Join(dir, fn, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	lim := logLimits{file: 100, function: 250, node: 350, retention: time.Hour}
	log := slog.New(slog.DiscardHandler)
	expired := mk("a", "old.log", 10, 2*time.Hour)
	liveOld := mk("a", "live.log", 10, 2*time.Hour) // idle, but running
	a1 := mk("a", "d1.log", 100, 30*time.Minute)
	a2 := mk("a", "d2.log", 100, 20*time.Minute)
	a3 := mk("a", "d3.log", 100, 10*time.Minute)
	b1 := mk("b", "d1.log", 100, 25*time.Minute)
	bLive := mk("b", "live2.log", 90, time.Minute)
	running := map[string]string{"live": "a", "live2": "b"}
	sweepLogs(dir, lim, running, now, log)
	switch {
	case exists(expired):
		t.Error("a finished sandbox's log past the retention kept")
	case !exists(liveOld) || !exists(bLive):
		t.Error("a running sandbox's log deleted")
	case exists(a1):
		t.Error("function a past its cap (310 > 250) kept its oldest finished log")
	case !exists(a2) || !exists(a3):
		t.Error("function a lost more than it had to")
	case exists(b1):
		t.Error("the node past its budget (a's 210 and b's 190 > 350) kept the oldest finished log, b's")
	}
	// Only live logs left above the budget: the largest is truncated.
	big := mk("c", "live3.log", 500, time.Minute)
	running["live3"] = "c"
	sweepLogs(dir, lim, running, now, log)
	if st, err := os.Stat(big); err != nil || st.Size() != 0 {
		t.Errorf("the largest live log past the node's budget: %v %v, want truncated", st, err)
	}
}

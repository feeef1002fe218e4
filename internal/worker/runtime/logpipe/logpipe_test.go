package logpipe

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// A sandbox's output reaches its log whole, the FIFO goes when the
// sandbox has, and the sandbox's writes never fail for want of a reader.
func TestOutputReachesTheLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sb.log")
	w, err := Open(path, Default, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", "for i in 1 2 3; do echo line$i; echo err$i >&2; done")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close() // the sandbox holds it now
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	Wait()
	b, _ := os.ReadFile(path)
	for _, want := range []string{"line1\nerr1\n", "line3\nerr3\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("log %q lacks %q", b, want)
		}
	}
	if _, err := os.Lstat(path + Suffix); !os.IsNotExist(err) {
		t.Errorf("the FIFO outlived its sandbox: %v", err)
	}
}

// A flood (16 MiB as fast as the sandbox can write) puts at most the
// burst and the rate's worth into the log, says how much it dropped, and
// never blocks the writer for long: the pipe is drained, not left full.
func TestFloodIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sb.log")
	lim := Limits{Rate: 64 << 10, Burst: 256 << 10}
	w, err := Open(path, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	line := bytes.Repeat([]byte("x"), 1023)
	line = append(line, '\n')
	for range 16 << 10 { // 16 MiB
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	Wait()
	took := time.Since(start)
	b, _ := os.ReadFile(path)
	bound := lim.Burst + int64(took.Seconds()*float64(lim.Rate)) + 4<<10 // and the notes
	if int64(len(b)) > bound {
		t.Fatalf("%d bytes in the log after %v, bound %d", len(b), took, bound)
	}
	if !strings.Contains(string(b), "bytes of this sandbox's output dropped") {
		t.Fatalf("the log does not say output was dropped (%d bytes)", len(b))
	}
	t.Logf("16 MiB written in %v; %d bytes kept", took, len(b))
}

// What a sandbox writes while no worker drains its pipe (the worker
// restarting) waits in the pipe, and the next worker's Adopt puts it into
// the log; a sandbox that has gone leaves a FIFO that Adopt clears.
func TestAdoptDrainsWhatWaited(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sb.log")
	if err := syscall.Mkfifo(path+Suffix, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(path+Suffix, os.O_RDWR, 0) // the sandbox's end, from an earlier worker
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("written while the worker was away\n"); err != nil {
		t.Fatal(err)
	}
	if err := Adopt(path, Default, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("after\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	Wait()
	b, _ := os.ReadFile(path)
	if string(b) != "written while the worker was away\nafter\n" {
		t.Fatalf("log %q", b)
	}

	gone := filepath.Join(dir, "gone.log")
	if err := syscall.Mkfifo(gone+Suffix, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Adopt(gone, Default, nil); err != nil {
		t.Fatal(err)
	}
	Wait()
	if _, err := os.Lstat(gone + Suffix); !os.IsNotExist(err) {
		t.Errorf("a gone sandbox's FIFO is left: %v", err)
	}
	if err := Adopt(filepath.Join(dir, "none.log"), Default, nil); err != nil {
		t.Errorf("Adopt without a FIFO: %v", err)
	}
}

// A sandbox that floods and then goes quiet, still running, gets the
// whole count of what was dropped into its log within about a second,
// not only when it writes again.
func TestDropIsReportedWhenQuiet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sb.log")
	lim := Limits{Rate: 1 << 10, Burst: 4 << 10}
	w, err := Open(path, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(bytes.Repeat([]byte("y"), 1<<20)); err != nil {
		t.Fatal(err)
	}
	var kept, total int64
	var b []byte
	testutil.Eventually(t, 10*time.Second, func() bool {
		b, _ = os.ReadFile(path)
		kept, total = 0, 0
		for _, line := range strings.Split(string(b), "\n") {
			var n int64
			if _, err := fmt.Sscanf(line, "[brisk] %d bytes of this sandbox's output dropped", &n); err == nil {
				total += n
			} else {
				kept += int64(strings.Count(line, "y"))
			}
		}
		return kept+total == 1<<20
	}, "kept and reported dropped adding up to the 1 MiB written")
}

// A log moved while its writer runs (a standby becoming a sandbox) keeps
// everything under its new name: what came before the move and after, and
// its FIFO goes from the new name when the writer has gone.
func TestMoveKeepsTheOutput(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "tpl.log"), filepath.Join(dir, "sb.log")
	w, err := Open(from, Default, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("before\n"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		b, _ := os.ReadFile(from)
		return string(b) == "before\n"
	}, "the first line is drained")
	if err := Move(from, to); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("after\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	Wait()
	if b, err := os.ReadFile(to); err != nil || string(b) != "before\nafter\n" {
		t.Fatalf("moved log: %q, %v", b, err)
	}
	for _, p := range []string{from, from + Suffix, to + Suffix} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", p, err)
		}
	}
}

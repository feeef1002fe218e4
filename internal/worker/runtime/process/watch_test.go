package process

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
)

// A sandbox an earlier worker started (here: r1, which plays the worker
// that was killed) is watched for exit by the runtime that finds it in the
// table: issue 21's adopted sandbox that died unnoticed.
func TestWatchAdoptedSandbox(t *testing.T) {
	dir := t.TempDir()
	r1, err := New(Config{StateDir: dir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	inst := createReady(t, r1, "sb-adopted", echoFn("adopted", nil))
	pid := get(t, inst.Addr).PID

	r2 := newRuntime(t, Config{StateDir: dir})
	if list, err := r2.List(context.Background()); err != nil || len(list) != 1 || !list[0].Running {
		t.Fatalf("restarted List = %+v, %v; want sb-adopted running", list, err)
	}
	exited, why, ok := r2.Watch("sb-adopted")
	if !ok {
		t.Fatal("Watch of an adopted sandbox: not watchable")
	}
	if closed(exited) || why() != nil {
		t.Fatalf("a running adopted sandbox is reported ended: %v", why())
	}
	if again, _, _ := r2.Watch("sb-adopted"); again != exited {
		t.Error("a second Watch started a second watch")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLong, func() bool { return closed(exited) }, "the adopted sandbox's death was not seen")
	if err := why(); err == nil || !strings.Contains(err.Error(), "earlier worker") {
		t.Errorf("ExitErr = %v, want the exit of a sandbox an earlier worker started", err)
	}
	if errors.Is(why(), ErrKilled) {
		t.Error("a crash reported as stopped by Kill")
	}
	// The worker then cleans up what is left, which ends with the entry.
	if err := r2.Kill(context.Background(), "sb-adopted"); err != nil {
		t.Fatalf("Kill after the exit: %v", err)
	}
	if _, _, ok := r2.Watch("sb-adopted"); ok {
		t.Error("Watch after Kill: still known")
	}
}

// Kill of an adopted sandbox ends its watch too, as ErrKilled.
func TestWatchAdoptedSandboxKilled(t *testing.T) {
	dir := t.TempDir()
	r1, err := New(Config{StateDir: dir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	createReady(t, r1, "sb-killed", echoFn("killed", nil))
	r2 := newRuntime(t, Config{StateDir: dir})
	exited, why, ok := r2.Watch("sb-killed")
	if !ok {
		t.Fatal("not watchable")
	}
	if err := r2.Kill(context.Background(), "sb-killed"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLong, func() bool { return closed(exited) }, "the watch did not end with Kill")
	if !errors.Is(why(), ErrKilled) {
		t.Errorf("ExitErr = %v, want ErrKilled", why())
	}
}

// A sandbox this runtime started is watched through its own wait.
func TestWatchOwnSandbox(t *testing.T) {
	r := newRuntime(t, Config{})
	inst := createReady(t, r, "sb-own", echoFn("own", nil))
	exited, _, ok := r.Watch("sb-own")
	if !ok || exited != inst.Exited {
		t.Fatalf("Watch = %v, %v; want the Instance's Exited", exited, ok)
	}
	if _, _, ok := r.Watch("sb-unknown"); ok {
		t.Error("Watch of an unknown id: ok")
	}
}

// A table entry whose pid another process holds now (pid reuse) is ended
// at once, and that process is not mistaken for the sandbox.
func TestWatchAdoptedReusedPID(t *testing.T) {
	other := exec.Command("sleep", "1000")
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = other.Process.Kill()
		_ = other.Wait()
	})
	pid := other.Process.Pid
	_, start, err := procs.Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := writeTableAt(t, dir, []record{{ID: "sb-old", Function: "old", PID: pid, PGID: pid, StartTime: start + 1, Addr: "127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	r := newRuntime(t, Config{StateDir: dir})
	exited, _, ok := r.Watch("sb-old")
	if !ok {
		t.Fatal("not watchable")
	}
	testutil.Eventually(t, waitLong, func() bool { return closed(exited) }, "a reused pid was taken for the sandbox's process")
	if !procs.Alive(pid, start) {
		t.Fatal("the watch harmed the process that reused the pid")
	}
}

var _ runtime.Watcher = (*Runtime)(nil)

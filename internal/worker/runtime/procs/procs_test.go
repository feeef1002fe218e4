package procs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStatParsesHostileNames(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields.
	dir := t.TempDir()
	name := filepath.Join(dir, "a) b (c")
	if err := os.Symlink("/bin/sleep", name); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	_, self, err := Stat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	state, start, err := Stat(cmd.Process.Pid)
	if err != nil || state == 0 || start < self {
		t.Fatalf("Stat = %c %d %v; want a start time after this test's (%d)", state, start, err, self)
	}
}

// Alive tells the process from a zombie, from a process that reused its
// pid (another start time) and from no process at all.
func TestAlive(t *testing.T) {
	p := startSleep(t)
	_, start, err := Stat(p.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !Alive(p.Process.Pid, start) {
		t.Fatal("a running process is not alive")
	}
	if Alive(p.Process.Pid, start+1) {
		t.Error("another start time is alive: a reused pid taken for the process")
	}
	_ = p.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for state, _, _ := Stat(p.Process.Pid); state != 'Z'; state, _, _ = Stat(p.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatalf("killed process never became a zombie (state %c)", state)
		}
		time.Sleep(time.Millisecond)
	}
	if Alive(p.Process.Pid, start) {
		t.Error("a zombie is alive")
	}
	_ = p.Wait()
	if Alive(p.Process.Pid, start) {
		t.Error("a reaped process is alive")
	}
}

// WaitPidfd waits through the netpoller (no fallback to polling): it
// returns nil once the process ends, which need not be its child's reaping.
func TestWaitPidfd(t *testing.T) {
	p := exec.Command("sleep", "1000")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(p.Process.Pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ENOSYS) {
		_ = p.Process.Kill()
		_ = p.Wait()
		t.Skip("no pidfd_open on this kernel: exits are polled")
	}
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	done := make(chan error, 1)
	go func() { done <- WaitPidfd(f) }()
	select {
	case err := <-done:
		t.Fatalf("WaitPidfd returned while the process runs: %v", err)
	default:
	}
	_ = p.Process.Kill() // the wait below reaps it; WaitPidfd must not need that
	if err := <-done; err != nil {
		t.Fatalf("WaitPidfd: %v", err)
	}
	_ = p.Wait()
}

// WaitExit returns once the process ends, at once for one that is gone or
// whose pid another process holds now, and leaves that process alone.
func TestWaitExit(t *testing.T) {
	p := startSleep(t)
	pid := p.Process.Pid
	_, start, err := Stat(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Reused pid: the recorded start time is not the running process's.
	waitReturns(t, "a reused pid", func() { WaitExit(pid, start+1, time.Millisecond) })
	if !Alive(pid, start) {
		t.Fatal("WaitExit harmed the process that reused the pid")
	}

	done := make(chan bool, 1)
	var fellBack error
	go func() {
		done <- WaitExitNotify(pid, start, time.Millisecond, func(err error) { fellBack = err })
	}()
	select {
	case <-done:
		t.Fatal("WaitExit returned while the process runs")
	case <-time.After(20 * time.Millisecond):
	}
	_ = p.Process.Kill()
	select {
	case usedPidfd := <-done:
		if !usedPidfd {
			t.Logf("no pidfd (%v): the exit was polled", fellBack)
		} else if fellBack != nil {
			t.Errorf("WaitExit used a pidfd but reported a fallback: %v", fellBack)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitExit did not return after the process ended")
	}
	_ = p.Wait()
	waitReturns(t, "a reaped process", func() { WaitExit(pid, start, time.Millisecond) })
}

// SpawnThread's thread is the caller's own: no_new_privs set there reaches
// a child forked there, and no other thread.
func TestSpawnThreadSetNoNewPrivs(t *testing.T) {
	if noNewPrivs(t, "/proc/thread-self/status") {
		t.Skip("no_new_privs is set on the test already")
	}
	var (
		child    []byte
		err      error
		threadNN bool
	)
	SpawnThread(func() {
		if err = SetNoNewPrivs(); err != nil {
			return
		}
		threadNN = noNewPrivs(t, "/proc/thread-self/status")
		child, err = exec.Command("grep", "^NoNewPrivs:", "/proc/self/status").Output()
	})
	if err != nil {
		t.Fatal(err)
	}
	if !threadNN {
		t.Error("SetNoNewPrivs did not set no_new_privs on the spawned thread")
	}
	if f := strings.Fields(string(child)); len(f) != 2 || f[1] != "1" {
		t.Errorf("child forked on the spawned thread: %q, want NoNewPrivs 1", child)
	}
	if noNewPrivs(t, "/proc/thread-self/status") {
		t.Error("no_new_privs leaked to another thread")
	}
	if noNewPrivs(t, "/proc/self/status") {
		t.Error("no_new_privs leaked to the main thread")
	}
}

func noNewPrivs(t *testing.T, status string) bool {
	t.Helper()
	b, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == "NoNewPrivs" {
			return strings.TrimSpace(v) == "1"
		}
	}
	t.Fatalf("%s has no NoNewPrivs line", status)
	return false
}

func startSleep(t *testing.T) *exec.Cmd {
	t.Helper()
	p := exec.Command("sleep", "1000")
	p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Process.Kill()
		_ = p.Wait()
	})
	return p
}

func waitReturns(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("WaitExit on %s did not return at once", what)
	}
}

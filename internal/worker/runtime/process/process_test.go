package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// helper is testdata/echoserver, built once for the package.
var helper string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "brisk-process-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// As root, sandboxes run as nobody, who must be able to run the helper.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	helper = filepath.Join(dir, "echoserver")
	if err := testutil.GoBuild("./testdata/echoserver", helper, false); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const waitLong = 30 * time.Second // only bounds failing tests

// newRuntime returns a runtime on a fresh StateDir whose sandboxes are all
// killed when the test ends.
func newRuntime(t testing.TB, cfg Config) *Runtime {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.BriskBinary == "" {
		cfg.BriskBinary = helper
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		killAll(t, r)
		if err := r.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return r
}

func killAll(t testing.TB, r *Runtime) {
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	r.StopTemplates()
	list, err := r.List(ctx)
	if err != nil {
		t.Errorf("cleanup List: %v", err)
	}
	for _, l := range list {
		if err := r.Kill(ctx, l.ID); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("cleanup Kill %s: %v", l.ID, err)
		}
	}
}

func echoFn(name string, env map[string]string, args ...string) *spec.Function {
	return &spec.Function{Name: name, Revision: 7, Command: append([]string{helper}, args...), Env: env}
}

func create(t *testing.T, r *Runtime, id string, f *spec.Function) *runtime.Instance {
	t.Helper()
	inst, err := r.Create(context.Background(), runtime.Spec{ID: id, Function: f})
	if err != nil {
		t.Fatalf("Create %s: %v", id, err)
	}
	return inst
}

func createReady(t *testing.T, r *Runtime, id string, f *spec.Function) *runtime.Instance {
	t.Helper()
	inst := create(t, r, id, f)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		t.Fatalf("WaitReady %s: %v (exit: %v)", id, err, inst.ExitErr())
	}
	return inst
}

type echoReply struct {
	PID      int    `json:"pid"`
	PGID     int    `json:"pgid"`
	Child    int    `json:"child"`
	Sandbox  string `json:"sandbox"`
	Function string `json:"function"`
	EchoEnv  string `json:"echo_env"`
	Port     string `json:"port"`
}

func get(t *testing.T, addr string) echoReply {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	var r echoReply
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	return r
}

// gone reports whether pid no longer runs a program: absent, or a zombie
// (an orphan's zombie waits for init, which is not ours to hurry).
func gone(pid int) bool {
	state, _, err := procs.Stat(pid)
	return err != nil || state == 'Z'
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestCreateServesAndPassesEnv(t *testing.T) {
	r := newRuntime(t, Config{})
	if r.Name() != "process" {
		t.Errorf("Name() = %q", r.Name())
	}
	f := echoFn("echo", map[string]string{"ECHO_ENV": "hello", "PORT": "1"})
	inst := createReady(t, r, "sb-echo", f)
	if !strings.HasPrefix(inst.Addr, "127.0.0.1:") || inst.ID != "sb-echo" {
		t.Errorf("instance = %+v", inst)
	}
	got := get(t, inst.Addr)
	_, port, _ := strings.Cut(inst.Addr, ":")
	if got.Sandbox != "sb-echo" || got.Function != "echo" || got.EchoEnv != "hello" || got.Port != port {
		t.Errorf("sandbox saw %+v, want sandbox sb-echo, function echo, ECHO_ENV hello, PORT %s", got, port)
	}
	if !slices.Contains(running(helper), got.PID) {
		t.Errorf("running(%s) does not find the live server %d", helper, got.PID)
	}
	if got.PGID != got.PID {
		t.Errorf("pgid %d != pid %d: the sandbox must lead its own process group", got.PGID, got.PID)
	}
	if err := inst.ExitErr(); err != nil {
		t.Errorf("ExitErr while running = %v", err)
	}

	list, err := r.List(context.Background())
	want := []runtime.Listed{{ID: "sb-echo", Function: "echo", Revision: 7, Addr: inst.Addr, Running: true}}
	if err != nil || len(list) != 1 || list[0] != want[0] {
		t.Errorf("List = %+v, %v; want %+v", list, err, want)
	}
	logs, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", "echo", "sb-echo.log"))
	if !strings.Contains(string(logs), "echoserver listening") {
		t.Errorf("sandbox log %q lacks the server's output", logs)
	}

	if err := r.Kill(context.Background(), "sb-echo"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if !closed(inst.Exited) {
		t.Error("Exited still open after Kill returned")
	}
	if err := inst.ExitErr(); !errors.Is(err, ErrKilled) {
		t.Errorf("ExitErr after Kill = %v, want ErrKilled", err)
	}
	if err := r.Kill(context.Background(), "sb-echo"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("second Kill = %v, want ErrNotFound", err)
	}
	if list, _ := r.List(context.Background()); len(list) != 0 {
		t.Errorf("List after Kill = %+v", list)
	}
	if _, recs, err := readTable(r.cfg.StateDir); err != nil || len(recs) != 0 {
		t.Errorf("table after Kill = %+v, %v", recs, err)
	}
}

func TestKillKillsWholeProcessGroup(t *testing.T) {
	r := newRuntime(t, Config{})
	inst := createReady(t, r, "sb-group", echoFn("group", map[string]string{"ECHO_SPAWN_CHILD": "1"}))
	got := get(t, inst.Addr)
	if got.Child == 0 || gone(got.Child) {
		t.Fatalf("server reports child %d, which is not running", got.Child)
	}
	if err := r.Kill(context.Background(), "sb-group"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	testutil.Eventually(t, waitLong, func() bool { return gone(got.Child) && gone(got.PID) },
		"child %d or server %d survived Kill", got.Child, got.PID)
}

func TestKillEscalatesToSIGKILL(t *testing.T) {
	r := newRuntime(t, Config{KillGrace: 20 * time.Millisecond})
	inst := createReady(t, r, "sb-stubborn", echoFn("stubborn", map[string]string{"ECHO_IGNORE_TERM": "1"}))
	if err := r.Kill(context.Background(), "sb-stubborn"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := inst.ExitErr(); !errors.Is(err, ErrKilled) || !strings.Contains(err.Error(), "signal 9") {
		t.Errorf("ExitErr = %v, want ErrKilled by signal 9", err)
	}
}

func TestKillHonoursContext(t *testing.T) {
	r := newRuntime(t, Config{KillGrace: time.Hour})
	inst := createReady(t, r, "sb-slow", echoFn("slow", map[string]string{"ECHO_IGNORE_TERM": "1"}))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.Kill(ctx, "sb-slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Kill with a short ctx and an hour's grace = %v, want DeadlineExceeded", err)
	}
	// Giving up on the grace still SIGKILLs; the entry stays for a retry.
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "sandbox survived the cut-short Kill")
	if err := r.Kill(context.Background(), "sb-slow"); err != nil {
		t.Fatalf("retried Kill: %v", err)
	}
}

func TestCrashLoopingCommand(t *testing.T) {
	r := newRuntime(t, Config{})
	base := goruntime.NumGoroutine()
	const n = 20
	insts := make([]*runtime.Instance, n)
	pids := make([]int, n)
	for i := range n {
		id := fmt.Sprintf("sb-crash-%d", i)
		insts[i] = create(t, r, id, &spec.Function{Name: "crash", Command: []string{"/bin/false"}})
		r.mu.Lock()
		pids[i] = r.sandboxes[id].rec.PID
		r.mu.Unlock()
	}
	for i, inst := range insts {
		testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "Exited of %s never closed", inst.ID)
		if err := inst.ExitErr(); err == nil || err.Error() != "exited with status 1" {
			t.Errorf("ExitErr = %v, want exited with status 1", err)
		}
		if _, _, err := procs.Stat(pids[i]); err == nil {
			t.Errorf("pid %d of %s still in /proc after Exited: not reaped", pids[i], inst.ID)
		}
		if err := runtime.WaitReady(context.Background(), inst.Addr, inst.Exited); !errors.Is(err, runtime.ErrExited) {
			t.Errorf("WaitReady on a crashed sandbox = %v, want ErrExited", err)
		}
	}
	testutil.Eventually(t, waitLong, func() bool { return goruntime.NumGoroutine() <= base },
		"goroutines: %d, %d before the crashes", goruntime.NumGoroutine(), base)

	// List reports the dead once, then forgets them.
	list, err := r.List(context.Background())
	if err != nil || len(list) != n {
		t.Fatalf("List = %d entries, %v; want %d", len(list), err, n)
	}
	for _, l := range list {
		if l.Running {
			t.Errorf("crashed sandbox %s listed as running", l.ID)
		}
	}
	if list, _ := r.List(context.Background()); len(list) != 0 {
		t.Errorf("second List = %+v, want the dead dropped", list)
	}
	if err := r.Kill(context.Background(), "sb-crash-0"); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Kill of a dropped sandbox = %v, want ErrNotFound", err)
	}
}

func TestCrashedSandboxCanBeKilled(t *testing.T) {
	r := newRuntime(t, Config{})
	inst := create(t, r, "sb-crashed", &spec.Function{Name: "crash", Command: []string{"/bin/sh", "-c", "exit 3"}})
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "Exited never closed")
	if err := inst.ExitErr(); err == nil || err.Error() != "exited with status 3" {
		t.Errorf("ExitErr = %v", err)
	}
	if err := r.Kill(context.Background(), "sb-crashed"); err != nil {
		t.Fatalf("Kill of a crashed sandbox: %v", err)
	}
	if err := inst.ExitErr(); err.Error() != "exited with status 3" {
		t.Errorf("Kill after the crash rewrote ExitErr to %v", err)
	}
}

func TestCreateFailsWithoutLeftovers(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRuntime(t, Config{})
	for _, argv := range [][]string{{"/nonexistent/brisk-fn"}, {"brisk-no-such-command"}, {notExec}} {
		t.Run(argv[0], func(t *testing.T) {
			_, err := r.Create(context.Background(), runtime.Spec{ID: "sb-fail", Function: &spec.Function{Name: "fail", Command: argv}})
			if err == nil {
				t.Fatal("Create succeeded")
			}
			if list, _ := r.List(context.Background()); len(list) != 0 {
				t.Errorf("List after a failed Create = %+v", list)
			}
			if _, err := os.Stat(filepath.Join(r.cfg.StateDir, "logs", "fail", "sb-fail.log")); !os.IsNotExist(err) {
				t.Errorf("failed Create left its log file (stat: %v)", err)
			}
			if r.cg != nil {
				for _, d := range r.cg.Open(cgroupParent + "/sb-fail").Dirs() {
					if _, err := os.Stat(d); !os.IsNotExist(err) {
						t.Errorf("failed Create left cgroup %s", d)
					}
				}
			}
		})
	}
}

func TestCreateRejectsBadSpecs(t *testing.T) {
	r := newRuntime(t, Config{})
	createReady(t, r, "sb-dup", echoFn("dup", nil))
	for name, s := range map[string]runtime.Spec{
		"duplicate id":     {ID: "sb-dup", Function: echoFn("dup", nil)},
		"path in id":       {ID: "../etc", Function: echoFn("x", nil)},
		"empty id":         {ID: "", Function: echoFn("x", nil)},
		"no function":      {ID: "sb-x"},
		"image":            {ID: "sb-x", Function: &spec.Function{Name: "img", Image: "docker.io/x"}},
		"unknown builtin":  {ID: "sb-x", Function: &spec.Function{Name: "b", Builtin: "nope"}},
		"path in function": {ID: "sb-x", Function: &spec.Function{Name: "a/b", Command: []string{"/bin/true"}}},
	} {
		if _, err := r.Create(context.Background(), s); err == nil {
			t.Errorf("%s: Create succeeded", name)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Create(ctx, runtime.Spec{ID: "sb-ctx", Function: echoFn("x", nil)}); !errors.Is(err, context.Canceled) {
		t.Errorf("Create with a cancelled ctx = %v", err)
	}
	if list, _ := r.List(context.Background()); len(list) != 1 {
		t.Errorf("List = %+v, want only sb-dup", list)
	}
}

func TestBuiltinTrace(t *testing.T) {
	r := newRuntime(t, Config{})
	inst := createReady(t, r, "sb-trace", &spec.Function{Name: "trace-func-1", Builtin: "trace"})
	resp, err := http.Post("http://"+inst.Addr+"/", "application/json", strings.NewReader(`{"ms":5}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var got struct {
		MachineName, Function string
		ExecUS                int64 `json:"exec_us"`
	}
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("trace reply %d %q: %v", resp.StatusCode, body, err)
	}
	if got.MachineName != "sb-trace" || got.Function != "trace-func-1" || got.ExecUS < 5000 {
		t.Errorf("trace reply %s", body)
	}
	if err := r.Kill(context.Background(), "sb-trace"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	// The trace server shuts down cleanly on SIGTERM, well within the grace.
	if err := inst.ExitErr(); !errors.Is(err, ErrKilled) || !strings.Contains(err.Error(), "status 0") {
		t.Errorf("ExitErr = %v, want a clean exit on SIGTERM", err)
	}
}

func TestRestartAdoptsRunningSandbox(t *testing.T) {
	dir := t.TempDir()
	// r1 plays the worker that "crashed": the test never touches it again,
	// though its goroutine still reaps the process, as init would.
	r1, err := New(Config{StateDir: dir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	inst := createReady(t, r1, "sb-survivor", echoFn("survivor", map[string]string{"ECHO_SPAWN_CHILD": "1"}))
	pids := get(t, inst.Addr)

	r2 := newRuntime(t, Config{StateDir: dir})
	list, err := r2.List(context.Background())
	want := runtime.Listed{ID: "sb-survivor", Function: "survivor", Revision: 7, Addr: inst.Addr, Running: true}
	if err != nil || len(list) != 1 || list[0] != want {
		t.Fatalf("restarted List = %+v, %v; want [%+v]", list, err, want)
	}
	if got := get(t, list[0].Addr); got.PID != pids.PID {
		t.Errorf("listed address serves pid %d, want %d", got.PID, pids.PID)
	}
	if err := r2.Kill(context.Background(), "sb-survivor"); err != nil {
		t.Fatalf("Kill by the restarted runtime: %v", err)
	}
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) && gone(pids.Child) },
		"adopted sandbox %d or its child %d survived Kill", pids.PID, pids.Child)
	if r1.cg != nil {
		for _, d := range r1.cg.Open(cgroupParent + "/sb-survivor").Dirs() {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("cgroup %s left behind", d)
			}
		}
	}
	r3, err := New(Config{StateDir: dir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := r3.List(context.Background()); len(list) != 0 {
		t.Errorf("third runtime lists %+v", list)
	}
}

func TestRestartReportsDeadSandboxOnce(t *testing.T) {
	dir := t.TempDir()
	r1, err := New(Config{StateDir: dir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	inst := createReady(t, r1, "sb-dead", echoFn("dead", nil))
	pid := get(t, inst.Addr).PID
	// It dies while no worker watches.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-inst.Exited

	r2 := newRuntime(t, Config{StateDir: dir})
	list, err := r2.List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != "sb-dead" || list[0].Running {
		t.Fatalf("List = %+v, %v; want sb-dead not running", list, err)
	}
	if list, _ := r2.List(context.Background()); len(list) != 0 {
		t.Errorf("second List = %+v, want it dropped", list)
	}
}

func TestRestartIgnoresReusedPID(t *testing.T) {
	// A process that is not the sandbox holds the recorded pid: same pid,
	// different start time. It must be neither listed as running nor
	// signalled.
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
	if err := r.Kill(context.Background(), "sb-old"); err != nil {
		t.Fatalf("Kill of a sandbox whose pid was reused: %v", err)
	}
	if !procs.Alive(pid, start) {
		t.Fatal("Kill signalled the process that reused the sandbox's pid")
	}

	if err := writeTableAt(t, dir, []record{{ID: "sb-old", Function: "old", PID: pid, PGID: pid, StartTime: start + 1, Addr: "127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	r = newRuntime(t, Config{StateDir: dir})
	list, err := r.List(context.Background())
	if err != nil || len(list) != 1 || list[0].Running {
		t.Fatalf("List = %+v, %v; want sb-old not running", list, err)
	}
	if !procs.Alive(pid, start) {
		t.Fatal("List signalled the process that reused the sandbox's pid")
	}
}

func TestNewRejectsBadState(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without StateDir succeeded")
	}
	if _, err := New(Config{StateDir: t.TempDir(), KillGrace: -time.Second}); err == nil {
		t.Error("New with a negative KillGrace succeeded")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, tableFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{StateDir: dir}); err == nil || !strings.Contains(err.Error(), tableFile) {
		t.Errorf("New on a corrupt table = %v, want an error naming %s", err, tableFile)
	}
	if _, err := New(Config{StateDir: t.TempDir(), CgroupRoot: t.TempDir()}); err == nil {
		t.Error("New with an explicit CgroupRoot holding no cgroups succeeded")
	}
}

func TestConcurrentCreateKill(t *testing.T) {
	r := newRuntime(t, Config{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 8 {
		wg.Go(func() {
			id := "sb-conc-" + strconv.Itoa(i)
			inst, err := r.Create(context.Background(), runtime.Spec{ID: id, Function: echoFn("conc", nil)})
			if err != nil {
				errs <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
				errs <- err
			}
			if _, err := r.List(ctx); err != nil {
				errs <- err
			}
			if err := r.Kill(ctx, id); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, recs, err := readTable(r.cfg.StateDir); err != nil || len(recs) != 0 {
		t.Errorf("table after all Kills = %+v, %v", recs, err)
	}
}

func TestCreateFailsWhenTableCannotBeWritten(t *testing.T) {
	r := newRuntime(t, Config{})
	// Directories where the table's slots go make every write fail.
	for _, slot := range []string{".0", ".1"} {
		if err := os.MkdirAll(filepath.Join(r.cfg.StateDir, tableFile+slot, "blocker"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, err := r.Create(context.Background(), runtime.Spec{ID: "sb-unrecorded", Function: echoFn("unrecorded", nil)})
	if err == nil {
		t.Fatal("Create succeeded without recording the sandbox")
	}
	// The started process must not outlive the failure: nothing else
	// could ever find and stop it.
	r.mu.Lock()
	n := len(r.sandboxes)
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("%d sandboxes in the table after a failed Create", n)
	}
	if r.cg != nil {
		for _, d := range r.cg.Open(cgroupParent + "/sb-unrecorded").Dirs() {
			if exists(d) {
				t.Errorf("failed Create left cgroup %s", d)
			}
		}
	}
	if pids := running(helper); len(pids) != 0 {
		t.Errorf("helper processes %v still running after a failed Create", pids)
	}
}

// running lists the live (non-zombie) processes whose argv[0] is path.
func running(path string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(cmdline), "\x00")
		if argv0 == path && !gone(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// BenchmarkColdStart is one sandbox's whole life on this runtime: Create,
// WaitReady, Kill, with and (as root) without a cgroup, and as root with
// and without the loopback guard (guard.go: with a sandbox of another
// function running, so that the table exists throughout).
func BenchmarkColdStart(b *testing.B) {
	for _, c := range []struct{ cgroups, guard bool }{{false, true}, {true, false}, {true, true}} {
		b.Run(fmt.Sprintf("cgroups=%v/guard=%v", c.cgroups, c.guard), func(b *testing.B) {
			cgroups := c.cgroups
			r, err := New(Config{StateDir: b.TempDir(), BriskBinary: helper, DisableCgroups: !cgroups, NoLoopbackGuard: !c.guard})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = r.Shutdown() })
			if cgroups && r.cg == nil {
				b.Skip("no cgroups (not root?)")
			}
			ctx := context.Background()
			if _, err := r.Create(ctx, runtime.Spec{ID: "sb-bench-other", Function: echoFn("other", nil)}); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = r.Kill(context.Background(), "sb-bench-other") })
			f := echoFn("bench", nil)
			f.Resources = spec.Resources{MilliCPU: 1000, MemoryMB: 128}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				id := "sb-bench-" + strconv.Itoa(i)
				inst, err := r.Create(ctx, runtime.Spec{ID: id, Function: f})
				if err != nil {
					b.Fatal(err)
				}
				if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
					b.Fatal(err)
				}
				if err := r.Kill(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRuntimeColdStart is runtimetest.ColdStart on this runtime (as
// root with cgroups), comparable with the native and containerd runtimes',
// with the loopback guard (the default as root) and without.
func BenchmarkRuntimeColdStart(b *testing.B) {
	for _, guard := range []bool{true, false} {
		r, err := New(Config{StateDir: b.TempDir(), NoLoopbackGuard: !guard})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = r.Shutdown() })
		for _, conc := range runtimetest.ColdStartConcurrency {
			b.Run(fmt.Sprintf("guard=%v/conc=%d", guard, conc), func(b *testing.B) {
				runtimetest.ColdStart(b, r, echoFn("bench", nil), conc, runtimetest.ColdStartOptions{})
			})
		}
	}
}

// BenchmarkRuntimeChurn is runtimetest.Churn on this runtime (served:
// readiness and first reply included), to compare with the native runtime's.
func BenchmarkRuntimeChurn(b *testing.B) {
	r, err := New(Config{StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Shutdown() })
	for _, conc := range []int{1, 10, 50} {
		b.Run(fmt.Sprintf("conc=%d/served", conc), func(b *testing.B) {
			runtimetest.Churn(b, r, echoFn("bench", nil), conc, true, nil)
		})
	}
}

// Two sandboxes never get one port: the kernel may hand a just-closed port
// out again before its sandbox binds it (found at 50 concurrent starts,
// where sandboxes died failing to bind).
func TestReservedPortsAreDistinct(t *testing.T) {
	r := newRuntime(t, Config{})
	seen := map[int]bool{}
	for range 300 {
		p, err := r.reservePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}

// A command's $PORT, ${NAME} and $(NAME) are the sandbox's variables,
// without a shell.
func TestCommandExpandsVariables(t *testing.T) {
	r := newRuntime(t, Config{})
	f := &spec.Function{Name: "expand", Command: []string{"/bin/echo", "port=$PORT", "${ECHO_ENV}-$(ECHO_ENV)", "$MISSING", "$$PORT"}, Env: map[string]string{"ECHO_ENV": "hello"}}
	inst := create(t, r, "sb-expand", f)
	select {
	case <-inst.Exited:
	case <-time.After(30 * time.Second):
		t.Fatal("echo did not exit")
	}
	// The worker drains the sandbox's output into its log, also after the
	// process has gone.
	_, port, _ := strings.Cut(inst.Addr, ":")
	want := "port=" + port + " hello-hello $MISSING $$PORT\n"
	var logs []byte
	testutil.Eventually(t, waitLong, func() bool {
		logs, _ = os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", "expand", "sb-expand.log"))
		return strings.Contains(string(logs), want)
	}, "the command's output %q in its log (%q so far)", want, logs)
}

// writeTableAt writes recs as the table in dir, as an earlier worker would
// have left it.
func writeTableAt(t *testing.T, dir string, recs []record) error {
	t.Helper()
	f, _, err := readTable(dir)
	if err != nil {
		return err
	}
	return writeTable(f, recs)
}

// With ListenHost the sandboxes listen on that address, not loopback's
// 127.0.0.1: a data plane on another host dials it (the partition lab's
// process workers). 127.0.0.2 stands for a host address here.
func TestSandboxesListenOnTheListenHost(t *testing.T) {
	r := newRuntime(t, Config{ListenHost: "127.0.0.2"})
	inst := createReady(t, r, "sb-host", &spec.Function{Name: "trace-host", Builtin: "trace"})
	host, port, err := net.SplitHostPort(inst.Addr)
	if err != nil || host != "127.0.0.2" {
		t.Fatalf("sandbox address %q: want one on 127.0.0.2", inst.Addr)
	}
	resp, err := http.Post("http://"+inst.Addr+"/", "application/json", strings.NewReader(`{"ms":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call on the listen host: %d", resp.StatusCode)
	}
	if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", port)); err == nil {
		c.Close()
		t.Errorf("the sandbox answers on 127.0.0.1:%s too: want its listen host only", port)
	}
	if _, err := New(Config{StateDir: t.TempDir(), ListenHost: "0.0.0.0"}); err == nil {
		t.Error("New took the unspecified address as a listen host")
	}
}

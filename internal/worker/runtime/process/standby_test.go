package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// nodeLang is a manager serving src as a Node function's app.js.
func nodeLang(t testing.TB, src string) (*lang.Manager, string) {
	return runtimetest.LangManager(t, spec.LangNode, map[string]string{"app.js": src})
}

func nodeSpec(t testing.TB, m *lang.Manager, digest, id string, mount bool) runtime.Spec {
	t.Helper()
	f := &spec.Function{Name: "nodefn", Revision: 1, Port: 8080, Concurrency: 1,
		Code: &spec.Code{Language: spec.LangNode, Handler: "app.handler", Contract: spec.ContractLambda, Digest: digest}}
	f.ApplyDefaults()
	s, err := m.Prepare(context.Background(), runtime.Spec{ID: id, Function: f}, lang.Target{Mount: mount})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type nodeWhoami struct {
	PID              int
	Port, LoadedPort string
	Tpl              string
}

func nodeCall(t *testing.T, addr string) nodeWhoami {
	t.Helper()
	var w nodeWhoami
	runtimetest.PostJSON(t, addr, `{"n":1}`, &w)
	return w
}

// A Node function's sandbox is its standby, taken whole: the process that
// loaded the module serves, on the sandbox's port and with its
// environment, from the sandbox's cgroup, writing into the sandbox's log;
// the next standby starts for the next sandbox. A killed sandbox is
// reported killed, a crashed one with its status, and a restarted worker
// adopts the sandbox and kills the standby it did not start.
func TestNodeSandboxesStartFromStandbys(t *testing.T) {
	m, digest := nodeLang(t, runtimetest.NodeStandbySource)
	stateDir := t.TempDir()
	r := newRuntime(t, Config{StateDir: stateDir})
	mount := r.CanMount()
	first := templateReady(t, r, nodeSpec(t, m, digest, "x", mount))
	standbyPID := procOf(first).pid

	inst := startSandbox(t, r, nodeSpec(t, m, digest, "sb-0", mount))
	w := nodeCall(t, inst.Addr)
	if w.PID != standbyPID {
		t.Fatalf("sandbox pid %d, want the standby's %d", w.PID, standbyPID)
	}
	if w.Port != strconv.Itoa(portOf(inst.Addr)) || w.LoadedPort != "0" {
		t.Fatalf("PORT %q (loaded with %q); want the sandbox's %d, and the standby's 0 while loading", w.Port, w.LoadedPort, portOf(inst.Addr))
	}
	if w.Tpl != "" {
		t.Fatalf("the function sees the control socket's variable: %q", w.Tpl)
	}
	if r.cg != nil {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", w.PID))
		if err != nil || !strings.Contains(string(b), "/sb-0\n") {
			t.Fatalf("the sandbox's process is in %q (%v), want its own cgroup sb-0", b, err)
		}
	}
	// Its log holds what it printed as a standby and as the sandbox.
	logPath := r.logPath("nodefn", "sb-0")
	testutil.Eventually(t, waitLong, func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "loading") && strings.Contains(string(b), `called {"n":1}`)
	}, "the sandbox's log holds the standby's and the sandbox's output")
	if _, err := os.Stat(r.logPath("nodefn", procOf(first).id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the standby's log is still there: %v", err)
	}

	// The next standby starts; the next sandbox is another process.
	next := templateReady(t, r, nodeSpec(t, m, digest, "x", mount))
	if procOf(next).pid == standbyPID {
		t.Fatal("the taken standby is still the set's")
	}
	inst1 := startSandbox(t, r, nodeSpec(t, m, digest, "sb-1", mount))
	if w1 := nodeCall(t, inst1.Addr); w1.PID != procOf(next).pid {
		t.Fatalf("second sandbox pid %d, want the second standby's %d", w1.PID, procOf(next).pid)
	}
	// Without a ready standby (taken just now), a sandbox starts fresh.
	fresh := startSandbox(t, r, nodeSpec(t, m, digest, "sb-2", mount))
	if w2 := nodeCall(t, fresh.Addr); w2.LoadedPort == "0" {
		t.Fatalf("a sandbox started while no standby was ready came from one: %+v", w2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := r.Kill(ctx, "sb-0"); err != nil {
		t.Fatal(err)
	}
	<-inst.Exited
	if err := inst.ExitErr(); !errors.Is(err, ErrKilled) {
		t.Fatalf("killed sandbox: %v", err)
	}
	if err := syscall.Kill(procOf(next).pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-inst1.Exited
	if err := inst1.ExitErr(); err == nil || !strings.Contains(err.Error(), "signal") {
		t.Fatalf("crashed sandbox: %v", err)
	}

	// A restarted runtime kills the standby it did not start and adopts
	// the sandbox.
	third := templateReady(t, r, nodeSpec(t, m, digest, "x", mount))
	r2, err := New(Config{StateDir: stateDir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLong, func() bool { return !alive(procOf(third).pid) }, "the earlier worker's standby is killed")
	list, err := r2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var running []string
	for _, l := range list {
		if l.Running {
			running = append(running, l.ID)
		}
	}
	if len(running) != 1 || running[0] != "sb-2" {
		t.Fatalf("after a restart, running %v; want sb-2 adopted", running)
	}
	killAll(t, r2)
	if err := r2.Shutdown(); err != nil {
		t.Error(err)
	}
}

// A standby runs the function's code, which may answer the hand-over with
// another pid; the worker must not take that process for the sandbox.
func TestStandbyCannotHandOverAnotherProcess(t *testing.T) {
	victim := exec.Command("sleep", "300")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	src := fmt.Sprintf("Object.defineProperty(process, 'pid', {value: %d});\nexports.handler = async () => ({});\n", victim.Process.Pid)
	m, digest := nodeLang(t, src)
	r := newRuntime(t, Config{})
	mount := r.CanMount()
	templateReady(t, r, nodeSpec(t, m, digest, "x", mount))
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, nodeSpec(t, m, digest, "hostile", mount))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(victim.Process.Pid, 0); err != nil {
		t.Fatalf("the victim is gone: %v", err)
	}
	list, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list {
		if l.ID == "hostile" && l.Running {
			if pid := r.sandboxes["hostile"].rec.PID; pid == victim.Process.Pid {
				t.Fatal("the victim became the sandbox")
			}
		}
	}
	killAll(t, r)
	if err := syscall.Kill(victim.Process.Pid, 0); err != nil {
		t.Fatalf("killing the sandbox killed the victim: %v", err)
	}
}

// BenchmarkNodeColdStart is runtimetest.ColdStart of a Node function,
// started fresh and from its standby (the next standby is waited for
// between batches, untimed: one standby a function):
//
//	go test -run '^$' -bench NodeColdStart -benchtime 20x ./internal/worker/runtime/process/
func BenchmarkNodeColdStart(b *testing.B) {
	for _, conc := range []int{1, 10, 50} {
		for _, mode := range []string{"fresh", "standby"} {
			b.Run(fmt.Sprintf("conc=%d/%s", conc, mode), func(b *testing.B) {
				m, digest := nodeLang(b, runtimetest.NodeStandbySource)
				r := newRuntime(b, Config{NoTemplates: mode == "fresh"})
				s := nodeSpec(b, m, digest, "x", false)
				o := runtimetest.ColdStartOptions{}
				if mode == "standby" {
					o.BeforeBatch = func(int) { templateReady(b, r, s) }
				}
				runtimetest.ColdStart(b, r, s.Function, conc, o)
			})
		}
	}
}

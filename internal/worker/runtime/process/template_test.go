package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// templateSource is a Python function whose sandboxes say who they are:
// their pid and parent, a random number, and a module global that a call
// may set (a child's memory writes must stay its own).
const templateSource = `import os, random
STATE = {"written": None}
def handler(event, context):
    if "write" in event:
        STATE["written"] = event["write"]
    return {"pid": os.getpid(), "ppid": os.getppid(), "random": random.random(), "written": STATE["written"], "port": os.environ.get("PORT")}
`

// codeSpec prepares sandbox id of a Python function deployed from src.
func codeSpec(t testing.TB, r *Runtime, m *lang.Manager, id, src string) runtime.Spec {
	return codeSpecMount(t, m, id, src, r.CanMount())
}

// codeSpecMount is codeSpec with the code bound at lang.TaskDir (mount) or
// run from the manager's directory.
func codeSpecMount(t testing.TB, m *lang.Manager, id, src string, mount bool) runtime.Spec {
	t.Helper()
	f := &spec.Function{Name: "pyfn", Revision: 1, Port: 8080, Concurrency: 1,
		Code: &spec.Code{Language: spec.LangPython, Handler: "app.handler", Contract: spec.ContractLambda}}
	data, err := codezip.ZipFile(writeFile(t, "app.py", src))
	if err != nil {
		t.Fatal(err)
	}
	f.Code.Digest = codezip.Digest(data)
	f.ApplyDefaults()
	s, err := m.Prepare(context.Background(), runtime.Spec{ID: id, Function: f}, lang.Target{Mount: mount})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeFile(t testing.TB, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// newLang returns a language manager that serves src's archive (app.py)
// as the control plane would.
func newLang(t testing.TB, src string) *lang.Manager {
	m, _ := runtimetest.LangManager(t, spec.LangPython, map[string]string{"app.py": src})
	return m
}

type whoami struct {
	PID, PPID int
	Random    float64
	Written   *string
	Port      string
}

func call(t *testing.T, addr, body string) whoami {
	t.Helper()
	var w whoami
	runtimetest.PostJSON(t, addr, body, &w)
	return w
}

func startSandbox(t *testing.T, r *Runtime, s runtime.Spec) *runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, s)
	if err != nil {
		t.Fatalf("Create %s: %v", s.ID, err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		t.Fatalf("sandbox %s: %v", s.ID, err)
	}
	return inst
}

// templateReady waits until the function's template has loaded it.
func templateReady(t testing.TB, r *Runtime, s runtime.Spec) *forkserver.Template {
	t.Helper()
	r.Prewarm(s)
	var tpl *forkserver.Template
	testutil.Eventually(t, waitLong, func() bool {
		tpl = r.tpls.Get(s)
		return tpl != nil
	}, "the template loads the function")
	return tpl
}

// Sandboxes of a Python function are forked from its template: children
// of the template, each on its own port, with its own random numbers and
// memory; a child killed is reported as any sandbox; a restarted runtime
// kills the templates it did not start and adopts their children.
func TestTemplateForksSandboxes(t *testing.T) {
	m := newLang(t, templateSource)
	stateDir := t.TempDir()
	r := newRuntime(t, Config{StateDir: stateDir})
	tpl := templateReady(t, r, codeSpec(t, r, m, "x", templateSource))

	var kids []whoami
	insts := map[string]*runtime.Instance{}
	for i := range 3 {
		id := "sb-" + strconv.Itoa(i)
		insts[id] = startSandbox(t, r, codeSpec(t, r, m, id, templateSource))
		kids = append(kids, call(t, insts[id].Addr, `{}`))
	}
	seen := map[float64]bool{}
	for i, k := range kids {
		if k.PPID != procOf(tpl).pid {
			t.Fatalf("sandbox %d: parent %d, want the template %d", i, k.PPID, procOf(tpl).pid)
		}
		if seen[k.Random] {
			t.Fatalf("two sandboxes drew the same random number %v: the template's generator state was not reseeded", k.Random)
		}
		seen[k.Random] = true
		if strconv.Itoa(portOf(insts["sb-"+strconv.Itoa(i)].Addr)) != k.Port {
			t.Fatalf("sandbox %d sees PORT %s, serves %s", i, k.Port, insts["sb-"+strconv.Itoa(i)].Addr)
		}
	}
	// A write in one child's memory is not seen by another, nor by a
	// child forked after it.
	if w := call(t, insts["sb-0"].Addr, `{"write": "mine"}`); w.Written == nil || *w.Written != "mine" {
		t.Fatalf("the writer does not see its own write: %+v", w)
	}
	if w := call(t, insts["sb-1"].Addr, `{}`); w.Written != nil {
		t.Fatalf("another child sees the write: %+v", w)
	}
	late := startSandbox(t, r, codeSpec(t, r, m, "sb-late", templateSource))
	if w := call(t, late.Addr, `{}`); w.Written != nil || w.PPID != procOf(tpl).pid {
		t.Fatalf("a later child: %+v", w)
	}

	// Kill reports the sandbox killed, and the template goes on.
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := r.Kill(ctx, "sb-0"); err != nil {
		t.Fatal(err)
	}
	<-insts["sb-0"].Exited
	if err := insts["sb-0"].ExitErr(); !errors.Is(err, ErrKilled) {
		t.Fatalf("killed child: %v", err)
	}
	// A child that crashes is reported with the status the template saw.
	if err := syscall.Kill(kids[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-insts["sb-1"].Exited
	if err := insts["sb-1"].ExitErr(); err == nil || !strings.Contains(err.Error(), "killed by signal 9") {
		t.Fatalf("crashed child: %v", err)
	}

	// A restarted runtime on the same state: the old template is killed,
	// its children are adopted.
	r2, err := New(Config{StateDir: stateDir, BriskBinary: helper})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLong, func() bool { return !alive(procOf(tpl).pid) }, "the earlier worker's template is killed")
	list, err := r2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, l := range list {
		if l.Running {
			running++
		}
	}
	if running != 2 { // sb-2 and sb-late
		t.Fatalf("after a restart: %+v; want the two live children adopted", list)
	}
	if w := call(t, late.Addr, `{}`); w.PID != call(t, late.Addr, `{}`).PID {
		t.Fatal("the adopted child changed")
	}
	killAll(t, r2)
	if err := r2.Shutdown(); err != nil {
		t.Error(err)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// A template that dies is reported, and the function's sandboxes start
// fresh meanwhile; one whose module cannot load never serves, and its
// sandboxes fail fresh with the reason.
func TestTemplateFailureFallsBackToFreshStarts(t *testing.T) {
	m := newLang(t, templateSource)
	r := newRuntime(t, Config{})
	tpl := templateReady(t, r, codeSpec(t, r, m, "x", templateSource))
	if err := syscall.Kill(procOf(tpl).pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-tpl.Done()
	if tpl.Err() == nil || !strings.Contains(tpl.Err().Error(), "killed by signal 9") {
		t.Fatalf("the template's end: %v", tpl.Err())
	}
	inst := startSandbox(t, r, codeSpec(t, r, m, "fresh", templateSource))
	if w := call(t, inst.Addr, `{}`); w.PPID == procOf(tpl).pid || w.PPID != os.Getpid() {
		t.Fatalf("after the template died: parent %d, want this worker %d (a fresh start)", w.PPID, os.Getpid())
	}
	if r.TemplateCount() != 0 {
		t.Fatalf("%d templates after the failure; want none until the retry delay passes", r.TemplateCount())
	}
}

// BenchmarkPythonColdStart is runtimetest.ColdStart (Create → readiness →
// first 200, conc at once) of a Python function whose imports take ~100
// ms, started fresh and forked from its template, side by side:
//
//	go test -run '^$' -bench PythonColdStart -benchtime 10x ./internal/worker/runtime/process/
func BenchmarkPythonColdStart(b *testing.B) {
	for _, conc := range []int{1, 10, 50} {
		for _, mode := range []string{"fresh", "template"} {
			b.Run(fmt.Sprintf("conc=%d/%s", conc, mode), func(b *testing.B) {
				m := newLang(b, runtimetest.PythonHeavySource)
				r := newRuntime(b, Config{NoTemplates: mode == "fresh"})
				// The code from the manager's directory: runtimetest's
				// specs carry no mounts.
				s := codeSpecMount(b, m, "x", runtimetest.PythonHeavySource, false)
				if mode == "template" {
					templateReady(b, r, s)
				}
				runtimetest.ColdStart(b, r, s.Function, conc, runtimetest.ColdStartOptions{})
			})
		}
	}
}

// A template runs the function's code, which can make it answer a fork
// request with any pid: here another process's (a victim the test runs,
// as another tenant's sandbox would be). The worker must not take it for
// the sandbox, move it into the sandbox's cgroup, or kill it.
func TestTemplateCannotHandOverAnotherProcess(t *testing.T) {
	victim := exec.Command("sleep", "300")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	src := fmt.Sprintf("import os\nos.fork = lambda: %d\ndef handler(event, context):\n    return {}\n", victim.Process.Pid)
	m := newLang(t, src)
	r := newRuntime(t, Config{})
	templateReady(t, r, codeSpec(t, r, m, "x", src))
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, codeSpec(t, r, m, "hostile", src))
	if err == nil && inst != nil {
		r.mu.Lock()
		sb := r.sandboxes["hostile"]
		r.mu.Unlock()
		if sb != nil && sb.rec.PID == victim.Process.Pid {
			t.Fatalf("the sandbox is the victim process %d", victim.Process.Pid)
		}
	}
	if err := r.Kill(ctx, "hostile"); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		t.Fatal(err)
	}
	if !alive(victim.Process.Pid) {
		t.Fatal("the victim was killed with the hostile sandbox")
	}
	if r.TemplateCount() != 0 {
		t.Fatal("the lying template was kept")
	}
}

// The memory a template holds is measured (its cgroup as root, its RSS
// without) and the function it holds is listed, for the node to report;
// both are gone with the template.
func TestTemplateMemoryIsMeasured(t *testing.T) {
	m := newLang(t, templateSource)
	r := newRuntime(t, Config{})
	runtimetest.TemplateMemory(t, r, func() { templateReady(t, r, codeSpec(t, r, m, "x", templateSource)) })
}

// A worker starting on another state directory of the same host (the
// cgroup root is shared) leaves this one's templates alone: it kills only
// those its own table lists.
func TestAnotherWorkerLeavesTemplatesAlone(t *testing.T) {
	m := newLang(t, templateSource)
	r1 := newRuntime(t, Config{})
	s := codeSpec(t, r1, m, "x", templateSource)
	tpl := templateReady(t, r1, s)
	pid := procOf(tpl).pid
	newRuntime(t, Config{}) // another worker, another state directory
	select {
	case <-tpl.Done():
		t.Fatalf("another worker's start ended this one's template: %v", tpl.Err())
	default:
	}
	if !alive(pid) {
		t.Fatalf("template process %d killed by another worker's start", pid)
	}
	inst := startSandbox(t, r1, codeSpec(t, r1, m, "after", templateSource))
	call(t, inst.Addr, `{}`)
}

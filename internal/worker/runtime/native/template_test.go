package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/forkserver"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// isolationSource answers who the sandbox is and what it can see: a
// module global and files a call may write, its capabilities and seccomp
// mode, and whether the root file system takes writes.
const isolationSource = `import os, random, socket
STATE = {"written": None}
def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split()[1]
def handler(event, context):
    if "write" in event:
        STATE["written"] = event["write"]
        with open("/tmp/" + event["write"], "w") as f:
            f.write("x")
    try:
        with open("/etc/brisk-probe", "w") as f:
            f.write("x")
        root_writable = True
    except OSError:
        root_writable = False
    return {"pid": os.getpid(), "random": random.random(), "written": STATE["written"], "tmp": sorted(os.listdir("/tmp")),
            "hostname": socket.gethostname(), "cap_eff": status("CapEff"), "cap_bnd": status("CapBnd"),
            "seccomp": status("Seccomp"), "no_new_privs": status("NoNewPrivs"), "root_writable": root_writable,
            "task": sorted(os.listdir("/var/task"))}
`

type childView struct {
	PID                            int
	Random                         float64
	Written                        *string
	Tmp                            []string
	Hostname                       string
	CapEff, CapBnd, Seccomp, NoNew string
	RootWritable                   bool `json:"root_writable"`
	Task                           []string
}

func (c *childView) UnmarshalJSON(b []byte) error {
	type plain childView
	var aux struct {
		plain
		NoNewPrivs string `json:"no_new_privs"`
		CapEff     string `json:"cap_eff"`
		CapBnd     string `json:"cap_bnd"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*c = childView(aux.plain)
	c.NoNew, c.CapEff, c.CapBnd = aux.NoNewPrivs, aux.CapEff, aux.CapBnd
	return nil
}

// pyLang is a language manager serving src's archive as app.py.
func pyLang(t testing.TB, src string) (*lang.Manager, string) {
	t.Helper()
	if _, err := os.Stat(lang.DefaultPython); err != nil {
		t.Skip("no " + lang.DefaultPython)
	}
	data, err := codezip.ZipFiles(map[string][]byte{"app.py": []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := lang.New(lang.Config{Dir: filepath.Join(t.TempDir(), "lang"), Fetch: func(context.Context, string) ([]byte, error) { return data, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return m, codezip.Digest(data)
}

func pySpec(t testing.TB, m *lang.Manager, digest, id string) runtime.Spec {
	t.Helper()
	f := &spec.Function{Name: "pyfn", Revision: 1, Concurrency: 1, Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128},
		Code: &spec.Code{Language: spec.LangPython, Handler: "app.handler", Contract: spec.ContractLambda, Digest: digest}}
	f.ApplyDefaults()
	s, err := m.Prepare(context.Background(), runtime.Spec{ID: id, Function: f}, lang.Target{Mount: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ask(t *testing.T, addr, body string) childView {
	t.Helper()
	var v childView
	runtimetest.PostJSON(t, addr, body, &v)
	return v
}

func nativeTemplateReady(t testing.TB, r *Runtime, s runtime.Spec) *forkserver.Template {
	t.Helper()
	r.Prewarm(s)
	var tpl *forkserver.Template
	testutil.Eventually(t, waitLong, func() bool {
		tpl = r.tpls.Get(s)
		return tpl != nil
	}, "the template loads the function")
	return tpl
}

// Sandboxes forked from a native template each get their own mount, UTS
// and IPC namespaces, /tmp, cgroup and port, no capability, the sandbox's
// seccomp program, a read-only root, fresh randomness and their own
// memory; they are killed as any sandbox, and die with their template.
func TestTemplateChildrenAreSandboxes(t *testing.T) {
	m, digest := pyLang(t, isolationSource)
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	tpl := nativeTemplateReady(t, r, pySpec(t, m, digest, "x"))

	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	insts := make([]*runtime.Instance, 3)
	views := make([]childView, 3)
	for i := range insts {
		s := pySpec(t, m, digest, "child-"+strconv.Itoa(i))
		inst, err := r.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
			t.Fatal(err)
		}
		insts[i] = inst
		views[i] = ask(t, inst.Addr, fmt.Sprintf(`{"write": "from-%d"}`, i))
	}
	r.mu.Lock()
	forked := r.sandboxes["child-0"].sh.tpl == tpl
	r.mu.Unlock()
	if !forked {
		t.Fatal("child-0 was not forked from the template")
	}
	for i, v := range views {
		if len(v.Tmp) != 1 || v.Tmp[0] != fmt.Sprintf("from-%d", i) {
			t.Errorf("child %d sees /tmp %v: want only its own file", i, v.Tmp)
		}
		if v.Written == nil || *v.Written != fmt.Sprintf("from-%d", i) {
			t.Errorf("child %d: its own write reads %v", i, v.Written)
		}
		if v.Hostname != "child-"+strconv.Itoa(i) {
			t.Errorf("child %d: hostname %q", i, v.Hostname)
		}
		if v.CapEff != "0000000000000000" || v.CapBnd != "0000000000000000" || v.Seccomp != "2" || v.NoNew != "1" {
			t.Errorf("child %d: CapEff %s CapBnd %s Seccomp %s NoNewPrivs %s; want no capability, a filter, no_new_privs", i, v.CapEff, v.CapBnd, v.Seccomp, v.NoNew)
		}
		if v.RootWritable {
			t.Errorf("child %d could write /etc", i)
		}
		if strings.Join(v.Task, ",") != "app.py" {
			t.Errorf("child %d: /var/task holds %v", i, v.Task)
		}
		for j := range i {
			if views[j].Random == v.Random {
				t.Errorf("children %d and %d drew the same random number", j, i)
			}
		}
	}
	// Another child's call sees neither the first's global nor its file.
	if v := ask(t, insts[1].Addr, `{}`); v.Written == nil || *v.Written != "from-1" || len(v.Tmp) != 1 {
		t.Fatalf("child 1 after child 0's write: %+v", v)
	}
	if err := r.Kill(ctx, "child-0"); err != nil {
		t.Fatal(err)
	}
	<-insts[0].Exited
	if err := insts[0].ExitErr(); !errors.Is(err, runtime.ErrKilled) {
		t.Fatalf("killed child: %v", err)
	}
	// The template's end ends its children, and is reported.
	r.stopTemplate(tpl)
	<-insts[1].Exited
	<-insts[2].Exited
	if err := insts[1].ExitErr(); err == nil || errors.Is(err, runtime.ErrKilled) {
		t.Fatalf("a child of a dead template: %v", err)
	}
	<-tpl.Done()
	testutil.Eventually(t, waitLong, func() bool { return r.TemplateCount() == 0 }, "the dead template leaves the set")
}

// A template whose function cannot load fails; sandboxes then start fresh
// and fail with the reason, and nothing is left of either.
func TestTemplateLoadFailureFallsBack(t *testing.T) {
	m, digest := pyLang(t, "def handler(event, context)\n    return 1\n")
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	s := pySpec(t, m, digest, "x")
	r.Prewarm(s)
	testutil.Eventually(t, waitLong, func() bool {
		r.tpls.Get(s) // starts one unless the last failed within Retry
		return r.TemplateCount() == 0 && r.tpls.Get(s) == nil && r.TemplateCount() == 0
	}, "the failed template leaves the set and is not retried at once")
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, pySpec(t, m, digest, "fresh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err == nil {
		t.Fatal("a function with a syntax error became ready")
	}
	if err := r.Kill(ctx, "fresh"); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		t.Fatal(err)
	}
}

// The memory a template holds is measured from its shell's cgroup and the
// function it holds is listed, for the node to report; both are gone with
// the template.
func TestTemplateMemoryIsMeasured(t *testing.T) {
	m, digest := pyLang(t, isolationSource)
	r := newRuntime(t, newPool(t, poolConfig()), t.TempDir(), true)
	runtimetest.TemplateMemory(t, r, func() { nativeTemplateReady(t, r, pySpec(t, m, digest, "x")) })
}

// A worker killed with a template and a child running (abandoned, as by
// kill -9) and started again on the same state reaps both: the child is
// not adopted (it would die with its template), nothing of either is
// left, and the function gets a new template and children.
func TestRestartReapsTemplates(t *testing.T) {
	testutil.RequiresRoot(t)
	m, digest := pyLang(t, isolationSource)
	state, pcfg := t.TempDir(), poolConfig()
	p1, err := netpool.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p1.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r1, err := New(Config{StateDir: state, Pool: p1, Shells: 2, InitArgv: []string{leanInit, nsinit.Subcommand},
		BriskBinary: probeBin, KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r1.Start()
	tpl := nativeTemplateReady(t, r1, pySpec(t, m, digest, "x"))
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r1.Create(ctx, pySpec(t, m, digest, "child-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		t.Fatal(err)
	}
	ask(t, inst.Addr, `{}`)
	tplShell := tpl.State().(*tplShell).sh
	r1.mu.Lock()
	child := r1.sandboxes["child-1"].sh
	r1.mu.Unlock()
	// The earlier worker's cgroups, by directory identity: the new
	// runtime's own shells may take their names again.
	held := map[string]uint64{}
	for _, sh := range []*shell{tplShell, child} {
		if sh.cg != nil {
			held[sh.cg.Dirs()[0]] = inode(t, sh.cg.Dirs()[0])
		}
	}
	r1.stop() // the worker dies; its template and child run on
	r1.wg.Wait()

	r2 := newRuntime(t, newPool(t, pcfg), state, true)
	if ls, err := r2.List(ctx); err != nil || len(ls) != 0 {
		t.Fatalf("List after restart = %+v, %v; want nothing (a template's child is not adopted)", ls, err)
	}
	for _, pid := range []int{tplShell.pid, child.pid} {
		waitFor(t, fmt.Sprintf("process %d reaped", pid), func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || strings.Contains(string(b), ") Z ")
		})
	}
	for dir, ino := range held {
		if st, err := os.Stat(dir); err == nil && st.Sys().(*syscall.Stat_t).Ino == ino {
			t.Errorf("cgroup %s of the earlier worker's template or child is left", dir)
		}
	}
	if n := r2.TemplateCount(); n != 0 {
		t.Fatalf("the restarted runtime holds %d templates before any was asked for", n)
	}
	nativeTemplateReady(t, r2, pySpec(t, m, digest, "x"))
	inst, err = r2.Create(ctx, pySpec(t, m, digest, "child-2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		t.Fatal(err)
	}
	ask(t, inst.Addr, `{}`)
}

// inode is the inode number of path.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

type nodeView struct {
	PID                         int
	Port, LoadedPort, Tpl       string
	CapEff, Seccomp, NoNewPrivs string
}

// nodeLang is a manager serving src as a Node function's app.js.
func nodeLang(t testing.TB, src string) (*lang.Manager, string) {
	return runtimetest.LangManager(t, spec.LangNode, map[string]string{"app.js": src})
}

func nodeSpec(t testing.TB, m *lang.Manager, digest, id string, mount bool) runtime.Spec {
	t.Helper()
	f := &spec.Function{Name: "nodefn", Revision: 1, Concurrency: 1, Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128},
		Code: &spec.Code{Language: spec.LangNode, Handler: "app.handler", Contract: spec.ContractLambda, Digest: digest}}
	f.ApplyDefaults()
	s, err := m.Prepare(context.Background(), runtime.Spec{ID: id, Function: f}, lang.Target{Mount: mount})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func askNode(t *testing.T, addr string) nodeView {
	t.Helper()
	var v nodeView
	runtimetest.PostJSON(t, addr, `{"n":1}`, &v)
	return v
}

// A Node function's sandbox on the native runtime is its standby's shell:
// the runner that loaded the module serves, with the sandbox's
// environment, as unprivileged as a fresh sandbox, writing into the
// sandbox's log; the next standby starts; a killed sandbox is reported as
// any; a restarted worker adopts the sandbox and reaps the standby.
func TestNodeSandboxesStartFromStandbys(t *testing.T) {
	testutil.RequiresRoot(t)
	m, digest := nodeLang(t, runtimetest.NodeStandbySource)
	state, pcfg := t.TempDir(), poolConfig()
	r := newRuntime(t, newPool(t, pcfg), state, true)
	first := nativeTemplateReady(t, r, nodeSpec(t, m, digest, "x", true))
	standbySh := first.State().(*tplShell).sh

	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	inst, err := r.Create(ctx, nodeSpec(t, m, digest, "sb-0", true))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
		t.Fatal(err)
	}
	v := askNode(t, inst.Addr)
	r.mu.Lock()
	sh := r.sandboxes["sb-0"].sh
	r.mu.Unlock()
	if sh != standbySh {
		t.Fatal("sb-0 is not the standby's shell")
	}
	if v.LoadedPort != "8080" || v.Port != "8080" || v.Tpl != "" {
		t.Fatalf("loaded with PORT %q, serves with %q, control variable %q", v.LoadedPort, v.Port, v.Tpl)
	}
	if v.CapEff != "0000000000000000" || v.Seccomp != "2" || v.NoNewPrivs != "1" {
		t.Fatalf("CapEff %s Seccomp %s NoNewPrivs %s; want a fresh sandbox's: none, a filter, no_new_privs", v.CapEff, v.Seccomp, v.NoNewPrivs)
	}
	logPath := r.logPath("nodefn", "sb-0")
	testutil.Eventually(t, waitLong, func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "loading") && strings.Contains(string(b), `called {"n":1}`)
	}, "the sandbox's log holds the standby's and the sandbox's output")
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(logPath), "tpl-"+standbySh.name+".log*")); len(left) != 0 {
		t.Fatalf("the standby's log is left: %v", left)
	}

	next := nativeTemplateReady(t, r, nodeSpec(t, m, digest, "x", true))
	if next == first {
		t.Fatal("the taken standby is still the set's")
	}
	if err := r.Kill(ctx, "sb-0"); err != nil {
		t.Fatal(err)
	}
	<-inst.Exited
	if err := inst.ExitErr(); !errors.Is(err, runtime.ErrKilled) {
		t.Fatalf("killed sandbox: %v", err)
	}

	// Restart: the sandbox made of the second standby is adopted, and the
	// third standby (unclaimed) reaped.
	inst1, err := r.Create(ctx, nodeSpec(t, m, digest, "sb-1", true))
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.WaitReady(ctx, inst1.Addr, inst1.Exited); err != nil {
		t.Fatal(err)
	}
	third := nativeTemplateReady(t, r, nodeSpec(t, m, digest, "x", true))
	thirdPID := third.State().(*tplShell).sh.pid
	r.stop()
	r.wg.Wait()
	r2 := newRuntime(t, newPool(t, pcfg), state, true)
	ls, err := r2.List(ctx)
	if err != nil || len(ls) != 1 || ls[0].ID != "sb-1" || !ls[0].Running {
		t.Fatalf("List after restart = %+v, %v; want sb-1 adopted", ls, err)
	}
	askNode(t, inst1.Addr)
	waitFor(t, "the unclaimed standby reaped", func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(thirdPID) + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	})
}

// BenchmarkNodeColdStart is runtimetest.ColdStart of a Node function on
// the native runtime, started fresh and from its standby (the next
// standby is waited for between batches, untimed: one a function):
//
//	go test -run '^$' -bench NodeColdStart -benchtime 20x ./internal/worker/runtime/native/
func BenchmarkNodeColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range []int{1, 10, 50} {
		for _, mode := range []string{"fresh", "standby"} {
			b.Run(fmt.Sprintf("conc=%d/%s", conc, mode), func(b *testing.B) {
				cfg := poolConfig()
				cfg.Size = 64
				r := newRuntimeWith(b, newPool(b, cfg), b.TempDir(), true, func(c *Config) { c.NoTemplates = mode == "fresh" })
				m, digest := nodeLang(b, runtimetest.NodeStandbySource)
				s := nodeSpec(b, m, digest, "x", false)
				o := runtimetest.ColdStartOptions{}
				if mode == "standby" {
					o.BeforeBatch = func(int) { nativeTemplateReady(b, r, s) }
				}
				testutil.Eventually(b, waitLong, func() bool { return len(r.ready) == 4 }, "shell pool filled")
				runtimetest.ColdStart(b, r, s.Function, conc, o)
			})
		}
	}
}

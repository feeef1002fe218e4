package native

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The native runtime passes the conformance suite with the probe function.
// A restart is a new Runtime on the same state directory and a new pool of
// the same configuration, after the old one was dropped without Close: as
// after kill -9 of the worker.
func TestConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	var (
		mu      sync.Mutex
		current *Runtime
		pcfg    = poolConfig()
	)
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, stateDir string) runtime.Runtime {
			mu.Lock()
			defer mu.Unlock()
			if current != nil && current.cfg.StateDir == stateDir {
				// A restart: the old runtime is abandoned, its sandboxes
				// and shells stay, as after kill -9 of the worker.
				current.stop()
				current.wg.Wait()
			}
			p, err := netpool.New(pcfg)
			if err != nil {
				t.Fatal(err)
			}
			exe, _ := os.Executable()
			r, err := New(Config{StateDir: stateDir, Pool: p, Shells: 4, InitArgv: []string{exe, nsinit.Subcommand}, KillGrace: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.Start()
			current = r
			// The last runtime of a case is torn down with it; an abandoned
			// one is left alone (its successor adopted or reaped its work).
			t.Cleanup(func() {
				mu.Lock()
				last := current == r
				mu.Unlock()
				if !last {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), waitLong)
				defer cancel()
				killAll(t, r)
				r.Close()
				if err := p.Close(ctx); err != nil {
					t.Errorf("pool Close: %v", err)
				}
			})
			return r
		},
		Function: func(*testing.T) *spec.Function { return probeFn("conformance") },
		Failing: func(*testing.T) *spec.Function {
			f := probeFn("crash-conformance")
			f.Env = map[string]string{"PROBE_MODE": "exit"}
			return f
		},
		Leaks: func(t *testing.T, _ string) []string {
			mu.Lock()
			r := current
			mu.Unlock()
			var out []string
			r.mu.Lock()
			for id := range r.sandboxes {
				out = append(out, "sandbox "+id)
			}
			r.mu.Unlock()
			for _, name := range r.cg.List(r.prefix) {
				if _, ok := r.unbound.Load(name); !ok {
					out = append(out, "cgroup "+name)
				}
			}
			return out
		},
		Restartable: true,
		Secrets:     func(*testing.T) *spec.Function { return probeFn("secrets-conformance") },
		LangTarget:  func(runtime.Runtime) lang.Target { return lang.Target{Mount: true} },
	})
}

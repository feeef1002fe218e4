package native

import (
	"context"
	"fmt"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// BenchmarkColdStart is runtimetest.ColdStart on this runtime — Create,
// readiness, first HTTP 200 of the probe function (a static Go binary) for
// batches of conc sandboxes at once — in two shapes: "burst" starts each
// batch with the shell pool full (max(conc, 4) shells parked); "sustained"
// keeps 16 shells and does not wait for the refill between batches, so its
// rate includes making shells (the figure to compare with the containerd
// and process runtimes' BenchmarkRuntimeColdStart).
//
//	go test -run '^$' -bench ColdStart -benchtime 20x ./internal/worker/runtime/native/
func BenchmarkColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range runtimetest.ColdStartConcurrency {
		b.Run(fmt.Sprintf("conc=%d/burst", conc), func(b *testing.B) { benchCold(b, conc, max(conc, 4), true) })
		b.Run(fmt.Sprintf("conc=%d/sustained", conc), func(b *testing.B) { benchCold(b, conc, 16, false) })
	}
}

func benchCold(b *testing.B, conc, shells int, refill bool) {
	cfg := poolConfig()
	cfg.Size = shells + conc
	pool := newPool(b, cfg)
	if err := pool.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	// The lean init, as `make build` installs it beside brisk.
	r, err := New(Config{StateDir: b.TempDir(), Pool: pool, Shells: shells, InitArgv: []string{leanInit, nsinit.Subcommand}})
	if err != nil {
		b.Fatal(err)
	}
	r.Start()
	b.Cleanup(func() { killAll(b, r); r.Close() })
	f := &spec.Function{Name: "bench", Revision: 1, Command: []string{probeBin}, Port: 8080}
	runtimetest.ColdStart(b, r, f, conc, runtimetest.ColdStartOptions{BeforeBatch: func(i int) {
		if refill || i < 1 {
			testutil.Eventually(b, waitLong, func() bool { return len(r.ready) == shells }, "shell refill")
		}
	}})
}

// BenchmarkChurn is runtimetest.Churn on this runtime: conc workers start
// and kill sandboxes back to back, teardown timed, the shell pool (16)
// never waited for. "created" counts sandboxes started (Create returned:
// the function exec'd in its namespaces and cgroup); "served" also waits
// for the function to listen and answer its first request, so it includes
// the function's own start (a Go HTTP server here). "minimal" runs a
// function with no language runtime at all (testdata/pause): the runtime's
// own rate, where the Go function's start (1.1 ms of CPU on this machine's
// virtual CPU) competes with it for the two cores.
//
//	go test -run '^$' -bench Churn -benchtime 2000x ./internal/worker/runtime/native/
func BenchmarkChurn(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range []int{1, 10, 50} {
		for _, kind := range []string{"created", "served", "minimal"} {
			b.Run(fmt.Sprintf("conc=%d/%s", conc, kind), func(b *testing.B) {
				cfg := poolConfig()
				cfg.Size = 16 + conc
				pool := newPool(b, cfg)
				if err := pool.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				r, err := New(Config{StateDir: b.TempDir(), Pool: pool, InitArgv: []string{leanInit, nsinit.Subcommand}})
				if err != nil {
					b.Fatal(err)
				}
				r.Start()
				b.Cleanup(func() { killAll(b, r); r.Close() })
				f := &spec.Function{Name: "bench", Revision: 1, Command: []string{probeBin}, Port: 8080}
				if kind == "minimal" {
					f.Command = []string{pauseBin}
				}
				testutil.Eventually(b, waitLong, func() bool { return len(r.ready) == DefaultShells }, "shell pool filled")
				runtimetest.Churn(b, r, f, conc, kind == "served", nil)
			})
		}
	}
}

// BenchmarkPythonColdStart is runtimetest.ColdStart (Create → readiness →
// first 200, conc at once) of a Python function whose imports take ~100
// ms, started fresh and forked from its template, side by side:
//
//	go test -run '^$' -bench PythonColdStart -benchtime 10x ./internal/worker/runtime/native/
func BenchmarkPythonColdStart(b *testing.B) {
	testutil.RequiresRoot(b)
	for _, conc := range []int{1, 10, 50} {
		for _, mode := range []string{"fresh", "template"} {
			b.Run(fmt.Sprintf("conc=%d/%s", conc, mode), func(b *testing.B) {
				cfg := poolConfig()
				cfg.Size = 16 + conc
				pool := newPool(b, cfg)
				r := newRuntimeWith(b, pool, b.TempDir(), true, func(c *Config) { c.NoTemplates = mode == "fresh" })
				m, digest := pyLangShared(b, runtimetest.PythonHeavySource)
				s := pySpecShared(b, m, digest)
				if mode == "template" {
					nativeTemplateReady(b, r, s)
				}
				testutil.Eventually(b, waitLong, func() bool { return len(r.ready) == 4 }, "shell pool filled")
				runtimetest.ColdStart(b, r, s.Function, conc, runtimetest.ColdStartOptions{})
			})
		}
	}
}

// pyLangShared is pyLang with its directory where the sandbox's user can
// reach it on the host's file system: runtimetest's specs carry no mounts.
func pyLangShared(b testing.TB, src string) (*lang.Manager, string) {
	return runtimetest.LangManager(b, spec.LangPython, map[string]string{"app.py": src})
}

func pySpecShared(b testing.TB, m *lang.Manager, digest string) runtime.Spec {
	b.Helper()
	f := &spec.Function{Name: "pyfn", Revision: 1, Concurrency: 1, Resources: spec.Resources{MilliCPU: 250, MemoryMB: 128},
		Code: &spec.Code{Language: spec.LangPython, Handler: "app.handler", Contract: spec.ContractLambda, Digest: digest}}
	f.ApplyDefaults()
	s, err := m.Prepare(context.Background(), runtime.Spec{ID: "x", Function: f}, lang.Target{})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

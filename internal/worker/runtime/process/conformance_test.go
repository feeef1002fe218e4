package process

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The process runtime passes the conformance suite with the builtin trace
// function (run by the echoserver helper as "brisk __trace" would) and, as
// root, with cgroups.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, stateDir string) runtime.Runtime {
			return newRuntime(t, Config{StateDir: stateDir})
		},
		Function: func(*testing.T) *spec.Function {
			return &spec.Function{Name: "trace-conformance", Builtin: "trace", Revision: 5}
		},
		Failing: func(*testing.T) *spec.Function {
			return &spec.Function{Name: "crash-conformance", Command: []string{"/bin/sh", "-c", "exit 3"}, Revision: 6}
		},
		Leaks:       conformanceLeaks,
		Restartable: true,
		Secrets: func(*testing.T) *spec.Function {
			return &spec.Function{Name: "secrets-conformance", Command: []string{helper}, Revision: 7}
		},
		SecretsElsewhere: os.Geteuid() != 0,
		LangTarget: func(rt runtime.Runtime) lang.Target {
			return lang.Target{Mount: rt.(runtime.Mounter).CanMount()}
		},
	})
}

// conformanceLeaks lists what the process runtime holds for the suite's
// sandboxes: the table's entries in stateDir, their cgroups (as root), the
// live processes running as one of them, and their secrets directories
// (without root).
func conformanceLeaks(t *testing.T, stateDir string) []string {
	t.Helper()
	var out []string
	_, recs, err := readTable(stateDir)
	if err != nil {
		t.Fatalf("Leaks: %v", err)
	}
	for _, rec := range recs {
		out = append(out, "table entry "+rec.ID)
	}
	// brisk/<id> in each v1 hierarchy, or in the v2 one.
	for _, pattern := range []string{
		filepath.Join(DefaultCgroupRoot, cgroupParent, runtimetest.IDPrefix+"*"),
		filepath.Join(DefaultCgroupRoot, "*", cgroupParent, runtimetest.IDPrefix+"*"),
	} {
		dirs, _ := filepath.Glob(pattern)
		for _, d := range dirs {
			out = append(out, "cgroup "+d)
		}
	}
	out = append(out, suiteProcesses()...)
	dirs, _ := filepath.Glob(filepath.Join(stateDir, secretsDirName, "*"))
	for _, d := range dirs {
		out = append(out, "secrets "+d)
	}
	return out
}

// suiteProcesses lists the live (non-zombie) processes whose environment
// names a sandbox of the suite.
func suiteProcesses() []string {
	var out []string
	marker := []byte(tracefn.EnvSandboxID + "=" + runtimetest.IDPrefix)
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		environ, err := os.ReadFile("/proc/" + d.Name() + "/environ")
		if err != nil {
			continue
		}
		for v := range bytes.SplitSeq(environ, []byte{0}) {
			if bytes.HasPrefix(v, marker) && !gone(pid) {
				out = append(out, "process "+d.Name()+" ("+string(v)+")")
				break
			}
		}
	}
	return out
}

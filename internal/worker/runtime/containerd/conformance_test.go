package containerd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/containerd/snapshots"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// conformancePool is the network pool of one state directory's runtimes:
// a restarted runtime keeps its predecessor's pool, as one restarted in a
// worker process does.
type conformancePool struct {
	cfg  netpool.Config
	pool *netpool.Pool
}

// The containerd runtime passes the conformance suite with the echo image.
// Its pools pre-create no namespaces (Size 0), so that every namespace
// belongs to a sandbox and is destroyed with it: Leaks can then list them.
func TestConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	var mu sync.Mutex
	pools := map[string]*conformancePool{}
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, stateDir string) runtime.Runtime {
			mu.Lock()
			p := pools[stateDir]
			mu.Unlock()
			if p == nil {
				p = &conformancePool{cfg: poolConfig(0)}
				p.pool = newPoolFrom(t, p.cfg, true)
				mu.Lock()
				pools[stateDir] = p
				mu.Unlock()
			}
			return newRuntime(t, p.pool, stateDir)
		},
		Function: func(*testing.T) *spec.Function { return echoFn("conformance", nil) },
		Failing: func(*testing.T) *spec.Function {
			return echoFn("conformance-crash", map[string]string{"ECHO_MODE": "exit"})
		},
		Leaks: func(t *testing.T, stateDir string) []string {
			mu.Lock()
			p := pools[stateDir]
			mu.Unlock()
			return conformanceLeaks(t, stateDir, p)
		},
		Restartable: true,
		Secrets:     func(*testing.T) *spec.Function { return echoFn("secrets-conformance", nil) },
		LangTarget: func(rt runtime.Runtime) lang.Target {
			return lang.Target{Mount: true, Import: rt.(*Runtime).ImportImage}
		},
	})
}

// conformanceLeaks lists what the runtimes on stateDir hold: their
// containers, the suite's tasks, their active snapshots, and their pool's
// network namespaces and leased endpoints.
func conformanceLeaks(t *testing.T, stateDir string, p *conformancePool) []string {
	t.Helper()
	ctx := nsCtx()
	var out []string
	cs, err := client.Containers(ctx, ownedFilter(stateDir))
	if err != nil {
		t.Fatalf("Leaks: list containers: %v", err)
	}
	for _, c := range cs {
		out = append(out, "container "+c.ID())
	}
	ts, err := client.TaskService().List(ctx, nil)
	if err != nil {
		t.Fatalf("Leaks: list tasks: %v", err)
	}
	for _, tk := range ts.Tasks {
		if strings.HasPrefix(tk.ID, runtimetest.IDPrefix) {
			out = append(out, "task "+tk.ID)
		}
	}
	err = client.SnapshotService(image.DefaultSnapshotter).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind != snapshots.KindCommitted && i.Labels[LabelState] == stateDir {
			out = append(out, fmt.Sprintf("snapshot %s (%v)", i.Name, i.Kind))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Leaks: walk snapshots: %v", err)
	}
	if p == nil {
		return out
	}
	ents, err := os.ReadDir("/var/run/netns")
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("Leaks: %v", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), p.cfg.NamePrefix+"-") {
			out = append(out, "netns "+e.Name())
		}
	}
	if n := p.pool.Stats().InUse; n > 0 {
		out = append(out, fmt.Sprintf("%d pool endpoints in use", n))
	}
	return out
}

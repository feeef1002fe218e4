package containerd

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
)

// A sandbox a restarted runtime adopted is watched for exit through its
// containerd task, like one it created: a worker learns of its death at
// once (issue 21's adopted sandbox that died unnoticed).
func TestWatchAdoptedSandbox(t *testing.T) {
	testutil.RequiresRoot(t)
	pool := newPool(t, 1)
	dir := t.TempDir()
	r1 := newRuntime(t, pool, dir)
	id := newID()
	createReady(t, r1, id, echoFn("adopted", nil))
	r1.Close() // the worker "restarts"

	r2 := newRuntime(t, pool, dir)
	if list, err := r2.List(context.Background()); err != nil || len(list) != 1 || !list[0].Running {
		t.Fatalf("List after restart = %+v, %v", list, err)
	}
	var w runtime.Watcher = r2
	exited, why, ok := w.Watch(id)
	if !ok {
		t.Fatal("Watch of an adopted sandbox: not watchable")
	}
	if closed(exited) || why() != nil {
		t.Fatalf("a running adopted sandbox is reported ended: %v", why())
	}
	if _, _, ok := w.Watch("unknown"); ok {
		t.Error("Watch of an unknown id: ok")
	}

	// It dies on its own (killed behind the runtime's back).
	c, err := client.LoadContainer(nsCtx(), id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(nsCtx(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Kill(nsCtx(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitLong, func() bool { return closed(exited) }, "the adopted sandbox's death was not seen")
	if err := why(); err == nil || errors.Is(err, runtime.ErrKilled) {
		t.Errorf("ExitErr = %v, want a crash", err)
	}
	if err := r2.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill after the exit: %v", err)
	}
	if l := leftovers(t, id); len(l) > 0 {
		t.Errorf("left after Kill: %v", l)
	}
	testutil.Eventually(t, waitLong, func() bool { return pool.Stats().InUse == 0 }, "adopted endpoint not released")
}

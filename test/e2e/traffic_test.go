package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A traffic split sends each data plane's calls to revisions by the
// percents, each pinned earlier revision running sandboxes of its own; it
// makes no revision, survives a restart and later updates (latest follows
// them, a pinned revision stays), and latest=100 ends it.
func TestTrafficSplit(t *testing.T) {
	c := newCluster(t)
	p := c.up(t)
	ctx := context.Background()
	c.mustBrisk(t, "fn", "deploy", "canary", "--builtin", "trace", "--env", "V=1")
	c.mustBrisk(t, "fn", "update", "canary", "--env", "V=2")
	v := c.fn(t, "canary")
	revs, err := c.cl.Revisions(ctx, "canary")
	if err != nil || len(revs) != 2 {
		t.Fatalf("revisions: %d %v", len(revs), err)
	}
	first, second := revs[1].Revision, v.Revision
	pinned := spec.RevisionFunction("canary", first)

	out := c.mustBrisk(t, "fn", "traffic", "canary", fmt.Sprintf("rev-%d=50,latest=50", first))
	if !strings.Contains(out, "traffic") {
		t.Fatalf("fn traffic:\n%s", out)
	}
	if w := c.fn(t, "canary"); w.Revision != second || len(w.Traffic) != 2 {
		t.Fatalf("after the split: revision %d (want %d: a split makes none), traffic %+v", w.Revision, second, w.Traffic)
	}
	// served counts which function served each of n calls, by the sandbox
	// the trace function reports.
	served := func(n int, fns ...string) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range n {
			inv := c.invoke(t, "canary", "")
			if inv.status != 200 {
				t.Fatalf("call: %d %s", inv.status, inv.body)
			}
			by := "?"
			for _, fn := range fns {
				for _, sb := range c.fn(t, fn).Status.Sandboxes {
					if sb.ID == inv.sandbox {
						by = fn
					}
				}
			}
			got[by]++
		}
		return got
	}
	if got := served(40, "canary", pinned); got["canary"] != 20 || got[pinned] != 20 {
		t.Fatalf("40 calls at 50/50: %v", got)
	}
	if pv := c.fn(t, pinned); pv.Revision != first || pv.Env["V"] != "1" {
		t.Fatalf("%s runs revision %d env %v, want %d with V=1", pinned, pv.Revision, pv.Env, first)
	}
	// Revision functions are not listed as functions of their own.
	if out := c.mustBrisk(t, "fn", "list"); strings.Contains(out, pinned) {
		t.Fatalf("fn list shows %s:\n%s", pinned, out)
	}
	if out := c.mustBrisk(t, "fn", "traffic", "canary"); !strings.Contains(out, pinned) || !strings.Contains(out, "rev-1 ") { // the first revision, by its number
		t.Fatalf("fn traffic canary:\n%s", out)
	}

	// Bad splits are refused, naming why.
	for _, bad := range []struct{ split, want string }{
		{"rev-999=50,latest=50", "not kept"},
		{fmt.Sprintf("rev-%d=50,latest=40", first), "add up to 90"},
		{"latest=50,latest=50", "twice"},
		{"rev-x=100", "not rev-N"},
	} {
		if out, code := c.brisk(t, "fn", "traffic", "canary", bad.split); code == 0 || !strings.Contains(out, bad.want) {
			t.Errorf("fn traffic canary %s: exit %d, want an error with %q:\n%s", bad.split, code, bad.want, out)
		}
	}
	if _, err := c.cl.Create(ctx, &spec.Function{Name: "fresh", Builtin: "trace", Traffic: []spec.TrafficTarget{{Revision: 1, Percent: 100}}}); !isStatus(err, 400) {
		t.Fatalf("a new function pinning a revision: %v, want 400", err)
	}
	if _, err := c.cl.SetTraffic(ctx, pinned, nil); !isStatus(err, 404) {
		t.Fatalf("a split of a revision function: %v, want 404", err)
	}

	// A restart rebuilds the revision function from the registry.
	p.stop(syscall.SIGTERM)
	c.up(t)
	if got := served(10, "canary", pinned); got["canary"] != 5 || got[pinned] != 5 {
		t.Fatalf("10 calls at 50/50 after a restart: %v", got)
	}

	// An update keeps the split: latest is the new revision, the pinned one
	// stays.
	c.mustBrisk(t, "fn", "update", "canary", "--env", "V=3")
	if w := c.fn(t, "canary"); w.Env["V"] != "3" || len(w.Traffic) != 2 {
		t.Fatalf("after an update: env %v traffic %+v", w.Env, w.Traffic)
	}
	if got := served(10, "canary", pinned); got["canary"] != 5 || got[pinned] != 5 {
		t.Fatalf("10 calls at 50/50 after an update: %v", got)
	}

	// A rollback keeps the current split, not the one stored with the
	// revision it restores.
	c.mustBrisk(t, "fn", "traffic", "canary", "latest=100")
	c.mustBrisk(t, "fn", "update", "canary", "--env", "V=4")
	if _, err := c.cl.Rollback(ctx, "canary", 0); err != nil {
		t.Fatal(err)
	}
	if w := c.fn(t, "canary"); len(w.Traffic) != 0 || w.Env["V"] != "3" {
		t.Fatalf("after a rollback: env %v traffic %+v, want V=3 and no split", w.Env, w.Traffic)
	}
	c.mustBrisk(t, "fn", "traffic", "canary", fmt.Sprintf("rev-%d=50,latest=50", first))

	// latest=100 ends it: the revision function goes.
	c.mustBrisk(t, "fn", "update", "canary", "--traffic", "latest=100")
	if w := c.fn(t, "canary"); len(w.Traffic) != 0 {
		t.Fatalf("traffic after latest=100: %+v", w.Traffic)
	}
	eventually(t, 30*time.Second, pinned+" removed", func() bool {
		_, err := c.cl.Get(ctx, pinned)
		return isStatus(err, 404)
	})
	if got := served(5, "canary"); got["canary"] != 5 {
		t.Fatalf("calls after the split ended: %v", got)
	}

	// Deleting the function removes its revision functions.
	c.mustBrisk(t, "fn", "traffic", "canary", fmt.Sprintf("rev-%d=10,latest=90", first))
	if _, err := c.cl.Get(ctx, pinned); err != nil {
		t.Fatalf("%s after a new split: %v", pinned, err)
	}
	c.mustBrisk(t, "fn", "delete", "canary")
	eventually(t, 30*time.Second, pinned+" removed with its function", func() bool {
		_, err := c.cl.Get(ctx, pinned)
		return isStatus(err, 404)
	})
}

// A traffic split may not do what a rollback may not: a token limited to
// the function cannot bring back, through a pinned revision, a secret the
// function no longer names; an update that would push a pinned revision
// out of the kept history is refused rather than moving its share.
func TestTrafficSplitChecks(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	ctx := context.Background()
	c.mustBrisk(t, "secret", "create", "db", "--from-literal", "pw")
	c.mustBrisk(t, "fn", "deploy", "sec", "--builtin", "trace", "--secret", "db")
	c.mustBrisk(t, "fn", "deploy", "sec", "--builtin", "trace") // revision 2: no secret
	revs, err := c.cl.Revisions(ctx, "sec")
	if err != nil || len(revs) != 2 {
		t.Fatalf("revisions %d %v", len(revs), err)
	}
	withSecret := revs[1].Revision
	tok := strings.TrimSpace(c.mustBrisk(t, "token", "create", "ci", "--scope", "deploy", "--function", "sec", "-q"))
	limited := client.New(c.admin, c.invokeAddr)
	limited.Token = tok
	split := []spec.TrafficTarget{{Revision: withSecret, Percent: 50}, {Percent: 50}}
	if _, err := limited.SetTraffic(ctx, "sec", split); !isStatus(err, 403) {
		t.Fatalf("a function-limited token pinning a revision with a secret the function dropped: %v, want 403", err)
	}
	if _, err := c.cl.SetTraffic(ctx, "sec", split); err != nil {
		t.Fatalf("the admin token may: %v", err)
	}
	if _, err := limited.SetTraffic(ctx, "sec", split); err != nil {
		t.Fatalf("the limited token re-setting the split that runs already: %v", err)
	}

	// Fill the history: the pinned revision is the oldest kept.
	for i := 0; ; i++ {
		f := c.fn(t, "sec").Function
		f.Env = map[string]string{"I": fmt.Sprint(i)}
		f.Revision = 0
		_, err := c.cl.Update(ctx, f)
		if err == nil {
			if i > 30 {
				t.Fatal("30 updates, none refused: the pinned revision left the history")
			}
			continue
		}
		if !isStatus(err, 409) || !strings.Contains(err.Error(), "move its traffic first") {
			t.Fatalf("update %d: %v, want 409 naming the pinned revision", i, err)
		}
		break
	}
	if v := c.fn(t, "sec"); len(v.Status.Traffic) != 2 || v.Status.Traffic[1].Missing {
		t.Fatalf("split after the refused update: %+v", v.Status.Traffic)
	}
}

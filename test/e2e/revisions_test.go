package e2e

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Every update keeps the spec it replaced: fn revisions lists them with
// what each changed, fn rollback brings one back as a new revision, and
// the history survives a restart and goes with the function.
func TestRevisionsAndRollback(t *testing.T) {
	c := newCluster(t)
	p := c.up(t)
	ctx := context.Background()
	c.mustBrisk(t, "fn", "deploy", "web", "--builtin", "trace", "--env", "A=1", "--env", "B=2")
	out := c.mustBrisk(t, "fn", "deploy", "web", "--builtin", "trace", "--env", "A=1")
	if !strings.Contains(out, "changed: env (-B)") {
		t.Fatalf("fn deploy over an existing function does not say what changed:\n%s", out)
	}
	c.mustBrisk(t, "fn", "update", "web", "--max", "7")
	revs, err := c.cl.Revisions(ctx, "web")
	if err != nil || len(revs) != 3 {
		t.Fatalf("revisions: %d %v, want 3", len(revs), err)
	}
	if revs[0].Scaling.Max != 7 || revs[1].Env["B"] != "" || revs[2].Env["B"] != "2" || !(revs[0].Revision > revs[1].Revision && revs[1].Revision > revs[2].Revision) {
		t.Fatalf("revisions, newest first: %+v", revs)
	}
	first := revs[2].Revision
	if out := c.mustBrisk(t, "fn", "revisions", "web"); !strings.Contains(out, "(current)") || !strings.Contains(out, "env (-B)") || !strings.Contains(out, "scaling (~max)") {
		t.Fatalf("fn revisions:\n%s", out)
	}

	// Back to the one before the current: max 0 again.
	c.mustBrisk(t, "fn", "rollback", "web")
	if v := c.fn(t, "web"); v.Scaling.Max == 7 || v.Revision <= revs[0].Revision {
		t.Fatalf("after rollback: max %d revision %d", v.Scaling.Max, v.Revision)
	}
	// To the first, by number: B comes back.
	out = c.mustBrisk(t, "fn", "rollback", "web", strconv.FormatUint(first, 10))
	if v := c.fn(t, "web"); v.Env["B"] != "2" || !strings.Contains(out, "env (+B)") {
		t.Fatalf("rollback to %d: env %v\n%s", first, v.Env, out)
	}
	if out, code := c.brisk(t, "fn", "rollback", "web", "12345"); code == 0 || !strings.Contains(out, "not kept") {
		t.Fatalf("rollback to an unknown revision: exit %d\n%s", code, out)
	}
	if _, err := c.cl.Rollback(ctx, "nope", 0); !isStatus(err, 404) {
		t.Fatalf("rollback of an unknown function: %v", err)
	}
	c.mustBrisk(t, "fn", "deploy", "fresh", "--builtin", "trace")
	if _, err := c.cl.Rollback(ctx, "fresh", 0); !isStatus(err, 409) {
		t.Fatalf("rollback of a function with no earlier revision: %v, want 409", err)
	}

	// A restart keeps the history.
	p.stop(syscall.SIGTERM)
	c.up(t)
	if revs, err := c.cl.Revisions(ctx, "web"); err != nil || len(revs) != 5 {
		t.Fatalf("revisions after a restart: %d %v, want 5", len(revs), err)
	}
	// A deleted function's history goes with it.
	c.mustBrisk(t, "fn", "delete", "web")
	c.mustBrisk(t, "fn", "deploy", "web", "--builtin", "trace")
	if revs, err := c.cl.Revisions(ctx, "web"); err != nil || len(revs) != 1 {
		t.Fatalf("revisions of a re-created function: %d %v, want only its own", len(revs), err)
	}
}

// Revisions are numbered 1, 2, 3, ... per function, and that number is
// what fn list, fn revisions, fn rollback N and traffic rev-N use (the
// issue: fn list showed a nanosecond id).
func TestRevisionNumbers(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "num", "--builtin", "trace", "--env", "V=1")
	c.mustBrisk(t, "fn", "update", "num", "--env", "V=2")
	if out := c.mustBrisk(t, "fn", "update", "num", "--env", "V=3"); !strings.Contains(out, "(revision 3)") {
		t.Fatalf("the third revision's update:\n%s", out)
	}
	var row string
	for _, line := range strings.Split(c.mustBrisk(t, "fn", "list"), "\n") {
		if strings.HasPrefix(line, "num ") {
			row = line
		}
	}
	if fields := strings.Fields(row); len(fields) < 8 || fields[7] != "3" {
		t.Fatalf("fn list row %q: want REVISION 3", row)
	}
	revs := c.mustBrisk(t, "fn", "revisions", "num")
	for _, want := range []string{"\n3 (current)", "\n2 ", "\n1 "} {
		if !strings.Contains(revs, want) {
			t.Fatalf("fn revisions lacks %q:\n%s", want, revs)
		}
	}
	out := c.mustBrisk(t, "fn", "traffic", "num", "rev-2=50,latest=50")
	if !strings.Contains(out, "rev-2=50") || !strings.Contains(out, "latest = revision 3") {
		t.Fatalf("fn traffic rev-2:\n%s", out)
	}
	if v := c.fn(t, "num"); len(v.Traffic) != 2 || v.Traffic[1].Generation != 2 || v.Traffic[1].Revision < 1e15 {
		t.Fatalf("the split %+v: want rev-2 stored as revision 2's id", v.Traffic)
	}
	c.mustBrisk(t, "fn", "traffic", "num", "latest=100")
	if out := c.mustBrisk(t, "fn", "rollback", "num", "1"); !strings.Contains(out, "revision 4") {
		t.Fatalf("rollback to revision 1:\n%s", out)
	}
	if v := c.fn(t, "num"); v.Env["V"] != "1" || v.Generation != 4 {
		t.Fatalf("after rollback to 1: V=%q generation %d, want V=1 and revision 4", v.Env["V"], v.Generation)
	}
}

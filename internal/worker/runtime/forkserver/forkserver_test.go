package forkserver

import (
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/keepalive"
)

// newSet is an empty Set of at most max templates; add puts in one last
// used at used, loaded in load, kept idle for idle, forked forks times.
func newSet(max int) *Set {
	return &Set{Max: max, Idle: 15 * time.Minute, byKey: map[Key]*Template{}, failed: map[Key]time.Time{}, gd: keepalive.NewGD(0)}
}

func (ts *Set) add(name string, used time.Time, load, idle time.Duration, forks int) *Template {
	t := &Template{Key: Key{Function: name, Revision: 1}, idle: idle}
	t.lastUse.Store(used.UnixNano())
	t.load.Store(int64(load))
	ts.byKey[t.Key] = t
	ts.gd.Touch(used, t.Key.String(), int64(forks))
	return t
}

func names(ts []*Template) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Key.Function)
	}
	slices.Sort(out)
	return out
}

// A template unused for longer than its function's keep-alive goes; one
// within its own keep-alive stays, whatever the others'.
func TestTemplatesExpireWithTheirKeepAlive(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	ts := newSet(16)
	ts.add("short", now.Add(-2*time.Minute), time.Second, time.Minute, 1)
	ts.add("long", now.Add(-10*time.Minute), time.Second, 15*time.Minute, 1)
	got := names(ts.evictLocked(now, 0))
	if !slices.Equal(got, []string{"short"}) {
		t.Fatalf("evicted %v; want only the function kept 1 minute", got)
	}
	if _, ok := ts.byKey[Key{Function: "long", Revision: 1}]; !ok {
		t.Fatal("the function kept 15 minutes left after 10")
	}
}

// At Max, the template of lowest Greedy-Dual priority (forks × load time
// ÷ memory) makes room, not the least recently used: a template that
// saves 2 s per sandbox and made several stays over a cheap one used
// since.
func TestFullSetEvictsByGreedyDual(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	ts := newSet(2)
	ts.add("costly", now.Add(-5*time.Minute), 2*time.Second, 15*time.Minute, 5)
	ts.add("cheap", now.Add(-time.Minute), 20*time.Millisecond, 15*time.Minute, 1)
	got := names(ts.evictLocked(now, 1))
	if !slices.Equal(got, []string{"cheap"}) {
		t.Fatalf("evicted %v; want the cheap template (LRU would take the costly one)", got)
	}
	if len(ts.byKey) != 1 {
		t.Fatalf("%d templates left; want room for one more in 2", len(ts.byKey))
	}
	// Nothing goes while there is room.
	if got := ts.evictLocked(now, 1); len(got) != 0 {
		t.Fatalf("evicted %v with room left", names(got))
	}
}

// A template with live children stays past its keep-alive and Max when
// the runtime's children die with it (native).
func TestTemplatesWithChildrenStay(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	ts := newSet(1)
	ts.KeepWhileChildren = true
	busy := ts.add("busy", now.Add(-time.Hour), time.Second, time.Minute, 1)
	busy.AddChild()
	if got := ts.evictLocked(now, 1); len(got) != 0 {
		t.Fatalf("evicted %v: a template with a live child", names(got))
	}
	busy.DoneChild()
	if got := names(ts.evictLocked(now, 1)); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("evicted %v once its child ended; want it", got)
	}
}

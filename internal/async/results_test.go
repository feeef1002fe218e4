package async

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// A namespace's result bodies are bounded (issue 36: 400 async calls
// answering 1 MiB put 421 MiB on disk for 24 h): past its budget the
// oldest are dropped, said so in their records and counted, and another
// namespace's results and short bodies are untouched.
func TestNamespaceResultBudget(t *testing.T) {
	const body = 20 << 10
	e := start(t, t.TempDir(), Config{NamespaceResultBytes: 64 << 10})
	inv := newScripted(func(c *Call, _ int) Result {
		if strings.HasPrefix(c.ID, "small") {
			return ok("short")
		}
		return Result{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: bytes.Repeat([]byte(c.ID[:2]), body/2)}
	})
	inv.known = map[string]bool{"a.team-a": true, "b.team-b": true}
	run(t, e.q, inv)
	call := func(fn, id string) {
		t.Helper()
		if err := e.q.Submit(context.Background(), &Call{ID: id, Function: fn, Method: "POST", Path: "/"}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.q, id, StatusSucceeded)
	}
	call("b.team-b", "b1")
	for _, id := range []string{"a1", "a2", "a3", "a4", "a5", "a6", "small-a"} {
		call("a.team-a", id)
	}
	get := func(id string) *Record {
		t.Helper()
		r, err := e.q.Get(context.Background(), id)
		if err != nil || r.Result == nil {
			t.Fatalf("%s: %+v %v", id, r, err)
		}
		return r
	}
	if r := get("a1"); len(r.Result.Body) != 0 || !r.Result.BodyDropped || r.Result.BodyBytes != body {
		t.Errorf("a1, the oldest of team-a's: body %d bytes, dropped %v, body_bytes %d; want dropped", len(r.Result.Body), r.Result.BodyDropped, r.Result.BodyBytes)
	}
	for _, id := range []string{"a6", "b1"} {
		if r := get(id); len(r.Result.Body) != body || r.Result.BodyDropped || r.Result.Body[0] != id[0] {
			t.Errorf("%s: body %d bytes, dropped %v; want its whole body", id, len(r.Result.Body), r.Result.BodyDropped)
		}
	}
	if r := get("small-a"); string(r.Result.Body) != "short" || r.Result.BodyBytes != 0 {
		t.Errorf("a short body: %+v, want it in its record", r.Result)
	}
	if n := promtest.ToFloat64(e.q.m.resultsDropped.WithLabelValues("team-a")); n < 1 {
		t.Errorf("dropped bodies counted %v, want at least 1", n)
	}
	st, err := e.q.resultsStream(context.Background(), "team-a", false)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil || info.State.Bytes > 64<<10 {
		t.Fatalf("team-a's results hold %d bytes (%v), budget 64 KiB", info.State.Bytes, err)
	}
	// A list leaves the large bodies out.
	recs, err := e.q.List(context.Background(), Filter{Function: "a.team-a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Result != nil && len(r.Result.Body) > inlineResult {
			t.Errorf("the list carries %s's %d-byte body", r.ID, len(r.Result.Body))
		}
	}
}

// One namespace cannot fill the queue for everyone (issue 36: one tenant
// filling it refused every tenant's submits): it holds at most its share
// of the calls and of the bytes, and gets room again as its calls leave.
func TestNamespaceShareOfTheQueue(t *testing.T) {
	e := start(t, t.TempDir(), Config{MaxQueued: 10, MaxQueuedBytes: 1 << 30, NamespaceShare: 0.5})
	ctx := context.Background()
	sub := func(fn, id string, body int) error {
		return e.q.Submit(ctx, &Call{ID: id, Function: fn, Method: "POST", Path: "/", Body: make([]byte, body)})
	}
	for i := range 5 {
		if err := sub("a.team-a", "a"+strconv.Itoa(i), 10); err != nil {
			t.Fatalf("team-a's call %d: %v", i+1, err)
		}
	}
	if err := sub("a.team-a", "a5", 10); !errors.Is(err, ErrNamespaceFull) {
		t.Fatalf("team-a's 6th call of a queue of 10: %v, want ErrNamespaceFull", err)
	}
	for i := range 5 {
		if err := sub("b.team-b", "b"+strconv.Itoa(i), 10); err != nil {
			t.Fatalf("team-b's call %d while team-a holds its share: %v", i+1, err)
		}
	}
	if err := sub("fn", "d0", 10); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("the 11th call: %v, want the queue's own limit", err)
	}
	// team-a's calls leave: a depth reading gives it room again. This
	// queue runs no consumer (a control plane's, for triggers), so its
	// submits take the reading once the last is stale.
	if _, err := e.q.Purge(ctx, "a.team-a", false); err != nil {
		t.Fatal(err)
	}
	e.q.now = func() time.Time { return time.Now().Add(sharesStale + time.Second) }
	testutil.Eventually(t, 10*time.Second, func() bool { return sub("a.team-a", "a6", 10) == nil },
		"team-a never got room again after its calls left")

	// Bytes: half of 1 MiB is about 12 calls of 40 KiB.
	e = start(t, t.TempDir(), Config{MaxQueued: 1000, MaxQueuedBytes: 1 << 20, NamespaceShare: 0.5})
	n := 0
	for ; n < 100; n++ {
		if err := sub("big.team-a", "big"+strconv.Itoa(n), 40<<10); errors.Is(err, ErrNamespaceFull) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if n < 11 || n > 13 {
		t.Fatalf("team-a queued %d calls of 40 KiB before its share of 512 KiB refused it", n)
	}
	if err := sub("b.team-b", "b-big", 40<<10); err != nil {
		t.Fatalf("team-b while team-a holds its share of the bytes: %v", err)
	}
}

package client

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// replicaServer answers every request with status (and the not-forwarded
// mark when set), counting them.
func replicaServer(t *testing.T, status int, notForwarded bool, hits *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		hits.Add(1)
		if notForwarded {
			w.Header().Set(api.HeaderNotForwarded, "1")
		}
		w.WriteHeader(status)
		io.WriteString(w, `{"name":"a"}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// refusedAddr is a loopback address nothing listens on.
func refusedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestFailoverMovesPastReplicasThatCannotServe(t *testing.T) {
	var noLeader, leader atomic.Int64
	b := replicaServer(t, http.StatusServiceUnavailable, true, &noLeader)
	c := replicaServer(t, http.StatusCreated, false, &leader)
	cl := New(refusedAddr(t)+", "+b.URL+","+c.URL, "")
	if len(cl.Replicas) != 2 {
		t.Fatalf("replicas %q, want the two after the first", cl.Replicas)
	}
	// A create (not idempotent) moves past a refused connection and a
	// replica that says it passed nothing on.
	if _, err := cl.Create(context.Background(), nil); err != nil {
		t.Fatalf("create: %v", err)
	}
	if noLeader.Load() != 1 || leader.Load() != 1 {
		t.Fatalf("hits: %d on the leaderless replica, %d on the leader; want 1 and 1", noLeader.Load(), leader.Load())
	}
	// The next request goes straight to the replica that answered.
	if _, err := cl.Get(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if noLeader.Load() != 1 || leader.Load() != 2 || cl.CurrentAdmin() != c.URL {
		t.Fatalf("after a success: %d / %d hits, current %s; want the leader only", noLeader.Load(), leader.Load(), cl.CurrentAdmin())
	}
}

func TestFailoverNeverSendsAWriteTwice(t *testing.T) {
	release := make(chan struct{})
	var slow, other atomic.Int64
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		slow.Add(1)
		<-release
	}))
	defer hang.Close()
	defer close(release)
	ok := replicaServer(t, http.StatusOK, false, &other)
	var busy atomic.Int64
	plain503 := replicaServer(t, http.StatusServiceUnavailable, false, &busy)

	cl := New(hang.URL+","+ok.URL, "")
	cl.HTTP.Timeout = 300 * time.Millisecond
	// A create sent whole and never answered may have been applied: it is
	// not sent again, and the error says so.
	_, err := cl.Create(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "unknown") || other.Load() != 0 || NotApplied(err) {
		t.Fatalf("create to a replica that never answers: err %v, %d sent elsewhere; want an unknown outcome and none", err, other.Load())
	}
	// The next request starts at the other replica (the first may be
	// paused or cut off).
	if cl.CurrentAdmin() != ok.URL {
		t.Fatalf("after a write of unknown outcome the client stays at %s; want the next replica", cl.CurrentAdmin())
	}
	// A read of the same fate moves on.
	cl = New(hang.URL+","+ok.URL, "")
	cl.HTTP.Timeout = 300 * time.Millisecond
	if _, err := cl.Get(context.Background(), "a"); err != nil || other.Load() != 1 {
		t.Fatalf("get: %v, %d served by the other replica; want 1", err, other.Load())
	}
	// A 503 without the mark (a leader losing its term mid-write) ends a
	// POST, a DELETE and a PUT: a repeat could undo others' writes.
	writes := map[string]func(*Client) error{
		"create": func(cl *Client) error { _, err := cl.Create(context.Background(), nil); return err },
		"delete": func(cl *Client) error { return cl.Delete(context.Background(), "a") },
		"update": func(cl *Client) error {
			_, err := cl.Update(context.Background(), &spec.Function{Name: "a"})
			return err
		},
	}
	for name, write := range writes {
		if err := write(New(plain503.URL+","+ok.URL, "")); err == nil || other.Load() != 1 || NotApplied(err) {
			t.Fatalf("%s answered 503: err %v, %d sent elsewhere; want the 503 and none", name, err, other.Load())
		}
	}
	if _, err := New(plain503.URL+","+ok.URL, "").Get(context.Background(), "a"); err != nil || other.Load() != 2 {
		t.Fatalf("get answered 503: %v, %d served elsewhere; want it moved", err, other.Load())
	}
	if slow.Load() != 2 || busy.Load() != 4 {
		t.Fatalf("each request reached its first replica once: %d and %d, want 2 and 4", slow.Load(), busy.Load())
	}
}

func TestOneAdminAddressHasNoReplicas(t *testing.T) {
	cl := New("127.0.0.1:9090", "")
	if cl.Admin != "http://127.0.0.1:9090" || len(cl.Replicas) != 0 || cl.HTTP.Transport != nil {
		t.Fatalf("one address: admin %q, replicas %q, transport %v", cl.Admin, cl.Replicas, cl.HTTP.Transport)
	}
}

// NotApplied tells a caller when a failed write may be sent again.
func TestNotApplied(t *testing.T) {
	var n atomic.Int64
	refused := New(refusedAddr(t), "")
	_, err := refused.Create(context.Background(), nil)
	if err == nil || !NotApplied(err) {
		t.Errorf("a create that reached no replica: %v, NotApplied %v; want true", err, NotApplied(err))
	}
	noLeader := New(replicaServer(t, http.StatusServiceUnavailable, true, &n).URL, "")
	if _, err := noLeader.Create(context.Background(), nil); err == nil || !NotApplied(err) {
		t.Errorf("a create answered not-forwarded: %v, NotApplied %v; want true", err, NotApplied(err))
	}
	// A PUT sent to a replica that never answered (it may have applied
	// it), then refused by the next as not forwarded: the outcome is
	// unknown, not "not applied" (the partition lab's flapping schedule
	// found a write so classified that had been applied).
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body); <-release }))
	defer hang.Close()
	defer close(release) // before Close, which waits for the handler
	moved := New(hang.URL+","+replicaServer(t, http.StatusServiceUnavailable, true, &n).URL, "")
	moved.HTTP.Timeout = 200 * time.Millisecond
	if _, err := moved.Update(context.Background(), &spec.Function{Name: "a"}); err == nil || NotApplied(err) {
		t.Errorf("a PUT unanswered by one replica, refused by the next: %v, NotApplied %v; want false", err, NotApplied(err))
	}
	failing := New(replicaServer(t, http.StatusInternalServerError, false, &n).URL, "")
	if _, err := failing.Create(context.Background(), nil); err == nil || NotApplied(err) {
		t.Errorf("a create answered 500: %v, NotApplied %v; want false", err, NotApplied(err))
	}
}

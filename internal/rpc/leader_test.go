package rpc

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// replicaServer answers ReportMetrics as the leader, or refuses as a
// follower naming *leader.
type replicaServer struct {
	briskv1.UnimplementedControlPlaneServer
	leader *atomic.Pointer[string] // nil value: this one leads
	self   string
	calls  atomic.Int64
}

func (s *replicaServer) ReportMetrics(ctx context.Context, _ *briskv1.MetricsReport) (*briskv1.MetricsAck, error) {
	s.calls.Add(1)
	if l := s.leader.Load(); l != nil && *l != s.self {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderHintKey, *l))
		return nil, NotLeader(*l)
	}
	return &briskv1.MetricsAck{}, nil
}

func startReplica(t *testing.T, leader *atomic.Pointer[string]) (*replicaServer, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &replicaServer{leader: leader, self: l.Addr().String()}
	gs := grpc.NewServer()
	briskv1.RegisterControlPlaneServer(gs, s)
	go func() { _ = gs.Serve(l) }()
	return s, gs.Stop
}

func TestLeaderConnFollowsTheLeader(t *testing.T) {
	var leader atomic.Pointer[string]
	a, stopA := startReplica(t, &leader)
	defer stopA()
	b, stopB := startReplica(t, &leader)
	defer stopB()
	c, stopC := startReplica(t, &leader)
	defer stopC()
	lb := b.self
	leader.Store(&lb)

	conn, err := DialLeader(nil, a.self+","+b.self+", "+c.self)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := briskv1.NewControlPlaneClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func() error { _, err := client.ReportMetrics(ctx, &briskv1.MetricsReport{}); return err }

	// a is asked first, refuses and names b.
	if err := call(); err != nil {
		t.Fatalf("first call: %v", err)
	}
	if conn.Current() != b.self || a.calls.Load() != 1 || b.calls.Load() != 1 {
		t.Fatalf("current %s, calls a=%d b=%d; want b current after one refusal by a", conn.Current(), a.calls.Load(), b.calls.Load())
	}
	// Later calls go straight to b.
	for range 5 {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	if a.calls.Load() != 1 || b.calls.Load() != 6 {
		t.Fatalf("calls a=%d b=%d, want 1 and 6", a.calls.Load(), b.calls.Load())
	}

	// b dies; c is elected. The next call finds b unreachable, moves on,
	// and reaches c (directly, or through a's hint).
	stopB()
	lc := c.self
	leader.Store(&lc)
	if err := call(); err != nil {
		t.Fatalf("call after the leader died: %v", err)
	}
	if conn.Current() != c.self || c.calls.Load() != 1 {
		t.Fatalf("current %s, c calls %d; want c", conn.Current(), c.calls.Load())
	}

	// No leader anywhere: the error comes back, Unavailable, after a
	// bounded number of tries.
	none := ""
	leader.Store(&none)
	before := a.calls.Load() + c.calls.Load()
	if err := call(); status.Code(err) != codes.Unavailable {
		t.Fatalf("without a leader: %v, want Unavailable", err)
	}
	if n := a.calls.Load() + c.calls.Load() - before; n < 2 || n > 7 {
		t.Fatalf("%d tries without a leader, want between 2 and 2×3+1", n)
	}
}

func TestDialLeaderNeedsAnAddress(t *testing.T) {
	if _, err := DialLeader(nil, " , "); err == nil {
		t.Fatal("DialLeader without addresses succeeded")
	}
}

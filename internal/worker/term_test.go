package worker

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A deposed control-plane leader (lower term) that has not noticed yet must
// not take the node over: its Hello is refused, even one asking for a drain,
// and the sandboxes the current leader runs stay. The current term, or a
// newer one, is admitted.
func TestSessionOfAnOlderTermIsRefused(t *testing.T) {
	host, err := emulated.NewHost("127.0.0.1:0", quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hostDone := make(chan struct{})
	go func() { host.Run(ctx); close(hostDone) }()
	defer func() { cancel(); <-hostDone }()
	// No control plane listens there: registration fails quietly, and the
	// test drives sessions itself.
	d, err := New(Config{ControlPlane: "127.0.0.1:1", Logger: quiet,
		Nodes: []NodeConfig{{ID: "n1", Runtime: host.Runtime("n1", 0), Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 4096}}}})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- d.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	<-d.Ready()
	conn, err := rpc.Dial(d.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := briskv1.NewWorkerClient(conn)

	hello := func(term, epoch uint64, drain bool, cmds *briskv1.Commands) (briskv1.Worker_SessionClient, error) {
		s, err := client.Session(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(&briskv1.ToWorker{Epoch: epoch, Msg: &briskv1.ToWorker_Hello{Hello: &briskv1.Hello{
			Epoch: epoch, Term: term, Drain: drain, Mode: briskv1.HandshakeMode_HANDSHAKE_MODE_RESET}}}); err != nil {
			return nil, err
		}
		m, err := s.Recv()
		if err != nil {
			return nil, err
		}
		if m.GetHelloAck() == nil {
			t.Fatalf("first answer %v, want HelloAck", m)
		}
		if cmds != nil {
			if err := s.Send(&briskv1.ToWorker{Epoch: epoch, Msg: &briskv1.ToWorker_Commands{Commands: cmds}}); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	if _, err := hello(5, 1, false, create("s1")); err != nil {
		t.Fatalf("term 5: %v", err)
	}
	n := d.Node("n1")
	testutil.Eventually(t, 5*time.Second, func() bool { return state(n, "s1") == briskv1.SandboxState_SANDBOX_STATE_READY }, "s1 ready")

	_, err = hello(3, 2, true, nil)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("term 3 after term 5: err %v, want FailedPrecondition", err)
	}
	if got := state(n, "s1"); got != briskv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("after a refused drain from an old term, s1 is %v, want READY", got)
	}
	if got := n.currentEpoch(); got != 1 {
		t.Fatalf("session epoch %d after the refused Hello, want 1 (unchanged)", got)
	}
	if _, err := hello(6, 3, false, nil); err != nil {
		t.Fatalf("term 6: %v", err)
	}
	if got := n.currentEpoch(); got != 3 {
		t.Fatalf("session epoch %d after term 6's Hello, want 3", got)
	}
}

package worker

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/process"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// pendingRecords drains the node's queued updates for one id.
func pendingRecords(n *Node, id string) []*briskv1.SandboxRecord {
	recs, _ := n.takePending(n.currentEpoch())
	var out []*briskv1.SandboxRecord
	for _, r := range recs {
		if r.Id == id {
			out = append(out, r)
		}
	}
	return out
}

func readyNode(t *testing.T, id string) *Node {
	t.Helper()
	n := newTestNode(t, 0)
	n.apply(context.Background(), n.currentEpoch(), create(id))
	testutil.Eventually(t, 5*time.Second, func() bool { return state(n, id) == briskv1.SandboxState_SANDBOX_STATE_READY })
	pendingRecords(n, id)
	return n
}

func verifyCmd(ids ...string) *briskv1.Commands { return &briskv1.Commands{Verify: ids} }

var errRefused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// A sandbox a data plane reported that refuses the worker's connects too is
// finished as EXITED (the control plane replaces it) and torn down.
func TestVerifyRefusingSandboxExits(t *testing.T) {
	n := readyNode(t, "v")
	n.dial = func(context.Context, string) error { return errRefused }
	n.apply(context.Background(), n.currentEpoch(), verifyCmd("v"))
	var got []*briskv1.SandboxRecord
	testutil.Eventually(t, 5*time.Second, func() bool {
		got = append(got, pendingRecords(n, "v")...)
		return len(got) > 0
	})
	if len(got) != 1 || got[0].State != briskv1.SandboxState_SANDBOX_STATE_EXITED || !strings.Contains(got[0].Message, "refuses connections") {
		t.Fatalf("verify of a refusing sandbox sent %v, want one EXITED", got)
	}
	if len(n.Snapshot()) != 0 {
		t.Errorf("the dead sandbox is still in the table: %v", n.Snapshot())
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		l, _ := n.rt.List(context.Background())
		return len(l) == 0
	})
	// A terminated id is not revived by a later check.
	n.apply(context.Background(), n.currentEpoch(), verifyCmd("v"))
	if got := pendingRecords(n, "v"); len(got) != 0 {
		t.Errorf("a second verify sent %v", got)
	}
}

// A sandbox that answers is announced again (a newer version of the same
// record): the data plane that reported it had a fault of its own, and the
// control plane puts the sandbox back. A connect that times out proves
// nothing either.
func TestVerifyLiveSandboxIsAnnouncedAgain(t *testing.T) {
	for name, dial := range map[string]func(context.Context, string) error{
		"answers":   nil, // the real connect: the emulated host serves
		"times out": func(context.Context, string) error { return context.DeadlineExceeded },
	} {
		t.Run(name, func(t *testing.T) {
			n := readyNode(t, "live")
			before := n.Snapshot()[0].Version
			if dial != nil {
				n.dial = dial
			}
			n.apply(context.Background(), n.currentEpoch(), verifyCmd("live"))
			var got []*briskv1.SandboxRecord
			testutil.Eventually(t, 5*time.Second, func() bool {
				got = append(got, pendingRecords(n, "live")...)
				return len(got) > 0
			})
			if len(got) != 1 || got[0].State != briskv1.SandboxState_SANDBOX_STATE_READY || got[0].Version <= before {
				t.Fatalf("verify of a live sandbox sent %v, want READY with a version above %d", got, before)
			}
			if state(n, "live") != briskv1.SandboxState_SANDBOX_STATE_READY {
				t.Error("a live sandbox left the table")
			}
		})
	}
}

// An id the worker does not hold is GONE: nothing serves under it.
func TestVerifyUnknownSandboxIsGone(t *testing.T) {
	n := newTestNode(t, 0)
	n.apply(context.Background(), n.currentEpoch(), verifyCmd("nope"))
	testutil.Eventually(t, 5*time.Second, func() bool {
		got := pendingRecords(n, "nope")
		return len(got) == 1 && got[0].State == briskv1.SandboxState_SANDBOX_STATE_GONE
	})
}

// Issue 21 item 1: a sandbox a restarted worker adopted is watched for
// exit (here through the process runtime's pidfd watch), and its death is
// reported EXITED like that of a sandbox the worker started, so the control
// plane replaces it at once.
func TestAdoptedSandboxExitIsReported(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(t.TempDir(), "pid")
	// r1 stands for the worker that was killed: it started the sandbox.
	// The sandbox writes pidFile, in a directory only this user may write.
	self := strconv.Itoa(os.Getuid()) + ":" + strconv.Itoa(os.Getgid())
	r1, err := process.New(process.Config{StateDir: dir, DisableCgroups: true, User: self})
	if err != nil {
		t.Fatal(err)
	}
	f := &spec.Function{Name: "f", Revision: 1, Command: []string{"sh", "-c", `echo $$ > "$0"; exec sleep 1000`, pidFile}}
	if _, err := r1.Create(context.Background(), runtime.Spec{ID: "adopted", Function: f}); err != nil {
		t.Fatal(err)
	}
	var pid int
	testutil.Eventually(t, 5*time.Second, func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	r2, err := process.New(process.Config{StateDir: dir, DisableCgroups: true, User: self})
	if err != nil {
		t.Fatal(err)
	}
	n := newNode("n1", "boot-2", r2, spec.Resources{MilliCPU: 4000, MemoryMB: 4096}, 0, time.Minute, quiet)
	n.adopt(context.Background())
	ack := n.install(context.Background(), &briskv1.Hello{Epoch: 1, Mode: briskv1.HandshakeMode_HANDSHAKE_MODE_RECOVER})
	if len(ack.Records) != 1 || ack.Records[0].Id != "adopted" || ack.Records[0].State != briskv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("handshake after the restart reports %v, want the adopted sandbox ready", ack.Records)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var got []*briskv1.SandboxRecord
	testutil.Eventually(t, 5*time.Second, func() bool {
		got = append(got, pendingRecords(n, "adopted")...)
		return len(got) > 0
	})
	if len(got) != 1 || got[0].State != briskv1.SandboxState_SANDBOX_STATE_EXITED || got[0].Version <= ack.Records[0].Version {
		t.Fatalf("death of an adopted sandbox sent %v, want one newer EXITED", got)
	}
	if len(n.Snapshot()) != 0 {
		t.Errorf("the dead sandbox is still in the table: %v", n.Snapshot())
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		l, err := r2.List(context.Background())
		return err == nil && len(l) == 0
	})
}

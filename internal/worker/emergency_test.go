package worker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// newEmergencyNode is a node on the emulated runtime offering slots
// emergency slots, and its runtime.
func newEmergencyNode(t *testing.T, delay time.Duration, slots int) (*Node, runtime.Runtime) {
	t.Helper()
	n, rt := newTestNodeRT(t, delay)
	n.em.slots = slots
	n.apply(context.Background(), 1, &briskv1.Commands{Specs: []*briskv1.FunctionSpec{fnSpec}}) // as the control plane offers it
	return n, rt
}

func emergencyCall() *briskv1.EmergencyRequest {
	return &briskv1.EmergencyRequest{NodeId: "n1", Spec: fnSpec, CallId: "c1", Method: "GET", Path: "/",
		DeadlineUnixMs: time.Now().Add(time.Minute).UnixMilli()}
}

func listed(t *testing.T, rt runtime.Runtime) int {
	ls, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(ls)
}

// One call, one sandbox: served, never in the node's table or its updates
// (so never in the control plane's table or the endpoint stream), counted
// in the heartbeat while it runs, torn down after (docs/reliability.md,
// cases 20 and 23).
func TestEmergencyServesOneCallInAOneShotSandbox(t *testing.T) {
	n, rt := newEmergencyNode(t, 200*time.Millisecond, 2)
	type result struct {
		r   *briskv1.EmergencyReply
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := n.emergency(context.Background(), emergencyCall())
		done <- result{r, err}
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return n.heartbeat().GetEmergency().GetInUse() == 1 }, "the call holds a slot")
	hb := n.heartbeat()
	if hb.GetUsed().GetMilliCpu() != 100 || hb.GetUsed().GetMemoryMb() != 64 || hb.GetSandboxes() != 0 {
		t.Errorf("heartbeat during the call: used %v, sandboxes %d; want the emergency sandbox's 100m/64MiB and no regular sandbox", hb.GetUsed(), hb.GetSandboxes())
	}
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.r.GetStatus() != 200 || !strings.HasPrefix(res.r.GetSandboxId(), EmergencyPrefix) || res.r.GetStartUs() <= 0 {
		t.Errorf("reply status %d, sandbox %q, start %d µs", res.r.GetStatus(), res.r.GetSandboxId(), res.r.GetStartUs())
	}
	if len(n.Snapshot()) != 0 {
		t.Errorf("the emergency sandbox is in the node's table: %v", n.Snapshot())
	}
	if recs, _ := n.takePending(n.currentEpoch()); len(recs) != 0 {
		t.Errorf("the emergency sandbox produced updates for the control plane: %v", recs)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return listed(t, rt) == 0 && n.heartbeat().GetEmergency().GetInUse() == 0 }, "teardown")
	if em := n.heartbeat().GetEmergency(); em.GetStarted() != 1 || em.GetFailed() != 0 || n.heartbeat().GetUsed().GetMilliCpu() != 0 {
		t.Errorf("after the call: %v, used %v", em, n.heartbeat().GetUsed())
	}
}

// Concurrent first calls are each served and each torn down.
func TestEmergencyConcurrentCallsAllTornDown(t *testing.T) {
	n, rt := newEmergencyNode(t, 20*time.Millisecond, 8)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := n.emergency(context.Background(), emergencyCall())
			if err == nil && r.GetStatus() != 200 {
				err = status.Errorf(codes.Internal, "status %d", r.GetStatus())
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The runtime lists none a moment before the node counts the last slot
	// free: wait for both.
	testutil.Eventually(t, 10*time.Second, func() bool { return listed(t, rt) == 0 && n.heartbeat().GetEmergency().GetInUse() == 0 }, "all 8 torn down")
	if em := n.heartbeat().GetEmergency(); em.GetStarted() != 8 || em.GetInUse() != 0 {
		t.Errorf("stats %v, want 8 started, none in use", em)
	}
}

// With every slot taken the call is refused at once, as RESOURCE_EXHAUSTED
// (the data plane tries another worker or queues: case 21); a node without
// slots refuses with FAILED_PRECONDITION.
func TestEmergencyRefusedWhenSlotsAreFull(t *testing.T) {
	n, _ := newEmergencyNode(t, 500*time.Millisecond, 1)
	go func() { _, _ = n.emergency(context.Background(), emergencyCall()) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return n.heartbeat().GetEmergency().GetInUse() == 1 }, "first call holds the slot")
	if _, err := n.emergency(context.Background(), emergencyCall()); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second call: %v, want RESOURCE_EXHAUSTED", err)
	}
	off, _ := newEmergencyNode(t, 0, 0)
	if _, err := off.emergency(context.Background(), emergencyCall()); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("node without slots: %v, want FAILED_PRECONDITION", err)
	}
	bad := emergencyCall()
	bad.Path = "no-slash"
	if _, err := n.emergency(context.Background(), bad); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad path: %v, want INVALID_ARGUMENT", err)
	}
}

// A daemon that restarts kills the emergency sandboxes an earlier one left
// (their calls died with it) instead of adopting them (case 19).
func TestRestartKillsLeftoverEmergencySandboxes(t *testing.T) {
	n, rt := newEmergencyNode(t, 0, 1)
	f := specpb.FromProto(fnSpec)
	for _, id := range []string{EmergencyPrefix + "old-1", "regular-1"} {
		if _, err := rt.Create(context.Background(), runtime.Spec{ID: id, Function: f}); err != nil {
			t.Fatal(err)
		}
	}
	n2 := newNode("n1", "boot-2", rt, n.capacity, 0, time.Minute, quiet)
	n2.adopt(context.Background())
	ls, _ := rt.List(context.Background())
	if len(ls) != 1 || ls[0].ID != "regular-1" {
		t.Errorf("runtime after restart: %+v, want only regular-1", ls)
	}
	if snap := n2.Snapshot(); len(snap) != 1 || snap[0].GetId() != "regular-1" {
		t.Errorf("adopted %v, want only regular-1", snap)
	}
}

// A sandbox an earlier worker left that is not running (a creation it did
// not finish: a Pod still Pending) is removed at the restart, not left
// behind forever.
func TestRestartRemovesSandboxesNotRunning(t *testing.T) {
	n, rt := newEmergencyNode(t, 0, 1)
	f := specpb.FromProto(fnSpec)
	for _, id := range []string{"pending-1", "regular-1"} {
		if _, err := rt.Create(context.Background(), runtime.Spec{ID: id, Function: f}); err != nil {
			t.Fatal(err)
		}
	}
	n2 := newNode("n1", "boot-2", notRunning{rt, "pending-1"}, n.capacity, 0, time.Minute, quiet)
	n2.adopt(context.Background())
	if ls, _ := rt.List(context.Background()); len(ls) != 1 || ls[0].ID != "regular-1" {
		t.Errorf("runtime after restart: %+v, want only regular-1", ls)
	}
	if snap := n2.Snapshot(); len(snap) != 1 || snap[0].GetId() != "regular-1" {
		t.Errorf("adopted %v, want only regular-1", snap)
	}
}

// notRunning lists sandbox id as not running, as the kube runtime lists a
// Pending Pod.
type notRunning struct {
	runtime.Runtime
	id string
}

func (r notRunning) List(ctx context.Context) ([]runtime.Listed, error) {
	ls, err := r.Runtime.List(ctx)
	for i := range ls {
		if ls[i].ID == r.id {
			ls[i].Running = false
		}
	}
	return ls, err
}

// Data planes may make emergency calls; sessions and image pushes stay the
// control plane's.
func TestOnlyControlPlanesOpenSessions(t *testing.T) {
	ca, err := pki.CreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	as := func(kind string) context.Context {
		id, err := ca.Issue(kind, []string{"x"}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := tls.ConnectionState{PeerCertificates: []*x509.Certificate{id.Cert.Leaf}}
		return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: st}})
	}
	if err := onlyControlPlane(as(pki.KindDataPlane), briskv1.Worker_Session_FullMethodName); status.Code(err) != codes.PermissionDenied {
		t.Errorf("data plane opening a session: %v, want PERMISSION_DENIED", err)
	}
	if err := onlyControlPlane(as(pki.KindControlPlane), briskv1.Worker_Session_FullMethodName); err != nil {
		t.Errorf("control plane opening a session: %v", err)
	}
}

// Nodes of one daemon share a boot id (and, emulated, a runtime): their
// emergency sandboxes still get distinct ids (found replaying a trace on
// four emulated nodes).
func TestEmergencyIDsAreUniqueAcrossNodes(t *testing.T) {
	a, rt := newEmergencyNode(t, 0, 1)
	b := newNode("n2", "boot-1", rt, a.capacity, 0, time.Minute, quiet)
	b.em.slots = 1
	ida, err := a.reserveEmergency(spec.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	idb, err := b.reserveEmergency(spec.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if ida == idb {
		t.Errorf("both nodes named their emergency sandbox %s", ida)
	}
}

// A data plane names the function; it cannot choose what runs: a spec the
// control plane never offered the node (another function, another
// revision) is refused before anything starts.
func TestEmergencyRunsOnlyOfferedSpecs(t *testing.T) {
	n, rt := newEmergencyNode(t, 0, 2)
	for _, spec := range []*briskv1.FunctionSpec{
		{Name: "other", Revision: 1, Command: []string{"/bin/sh", "-c", "echo pwned"}},
		{Name: "f", Revision: 2, Command: []string{"/bin/sh", "-c", "echo pwned"}},
	} {
		req := emergencyCall()
		req.Spec = spec
		if _, err := n.emergency(context.Background(), req); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("spec %s rev %d: %v, want FAILED_PRECONDITION", spec.Name, spec.Revision, err)
		}
	}
	if listed(t, rt) != 0 || n.heartbeat().GetEmergency().GetStarted() != 0 {
		t.Error("a refused emergency call started something")
	}
}

package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/proxy"
	"github.com/brisk-faas/brisk/internal/rpc"
)

// unreachCP is fakeCP that also takes reports of unreachable endpoints.
type unreachCP struct {
	*fakeCP
	unreach chan *briskv1.UnreachableReport
}

func (f *unreachCP) ReportUnreachable(_ context.Context, r *briskv1.UnreachableReport) (*briskv1.UnreachableAck, error) {
	f.unreach <- r
	return &briskv1.UnreachableAck{}, nil
}

func startUnreachCP(t *testing.T) (*unreachCP, string) {
	t.Helper()
	f := &unreachCP{fakeCP: &fakeCP{
		registered: make(chan *briskv1.RegisterDataPlaneRequest, 16),
		watches:    make(chan *watchSession, 16),
		reports:    make(chan *briskv1.MetricsReport, 1024),
	}, unreach: make(chan *briskv1.UnreachableReport, 16)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(rpc.ServerOptions(nil)...)
	briskv1.RegisterControlPlaneServer(s, f)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return f, ln.Addr().String()
}

// refusingAddr is a loopback address nothing listens on: connects to it are
// refused, as to a sandbox that died.
func refusingAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func routed(d *DataPlane, fn string) []string {
	var ids []string
	if f := d.lookup(fn); f != nil {
		for _, ep := range f.set.Load().Endpoints {
			ids = append(ids, ep.id)
		}
	}
	return ids
}

// Issue 21: an endpoint that refuses connections is taken out of rotation
// within one call, and reported to the control plane at once; the control
// plane's add (the worker found it alive) puts it back.
func TestRefusingEndpointLeavesRotation(t *testing.T) {
	f, cpAddr := startUnreachCP(t)
	d := runDP(t, Config{ID: "dp-test", ControlPlane: cpAddr})
	ws := recv(t, f.watches, "WatchEndpoints")
	dead := refusingAddr(t)
	rr := func(s *briskv1.FunctionSpec) { s.LoadBalancing = "round-robin" }
	ws.send <- &briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f", rr)},
		Added: []*briskv1.Endpoint{ep("f", "sb-a", dead), ep("f", "sb-b", newSandbox(t, echo))}}
	waitFor(t, "snapshot applied", func() bool { return len(routed(d, "f")) == 2 })

	// Round-robin reaches the dead endpoint within two calls; that call
	// moves on to sb-b (nothing of it was sent), and no call after it
	// meets the dead endpoint.
	url := "http://" + d.Addr() + "/function/f"
	for range 2 {
		if r := get(t, url); r.code != 200 || decodeSeen(t, r).Sandbox != "sb-b" {
			t.Fatalf("a call with a refusing sandbox in rotation: %d %s, want 200 from sb-b", r.code, r.body)
		}
	}
	if n := testutil.ToFloat64(d.prom.reroutes); n != 1 {
		t.Fatalf("%v calls rerouted, want the one that met the dead endpoint", n)
	}
	if got := routed(d, "f"); !slices.Equal(got, []string{"sb-b"}) {
		t.Fatalf("routes after the refused connect: %v, want [sb-b]", got)
	}
	for range 4 {
		if r := get(t, url); r.code != 200 || decodeSeen(t, r).Sandbox != "sb-b" {
			t.Fatalf("call after the dead endpoint left: %d %s", r.code, r.body)
		}
	}
	rep := recv(t, f.unreach, "report of the unreachable endpoint")
	if rep.GetDataPlaneId() != "dp-test" || len(rep.GetEndpoints()) != 1 {
		t.Fatalf("report %v", rep)
	}
	if e := rep.GetEndpoints()[0]; e.GetSandboxId() != "sb-a" || e.GetFunction() != "f" || e.GetAddress() != dead ||
		!strings.Contains(e.GetError(), "refused") {
		t.Fatalf("reported %v", e)
	}

	// The worker found it serving after all: the control plane adds it again.
	ws.send <- &briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("f", "sb-a", dead)}}
	waitFor(t, "the endpoint back in rotation", func() bool { return len(routed(d, "f")) == 2 })
	// The control plane's removal of an endpoint already out is harmless.
	ws.send <- &briskv1.EndpointBatch{Removed: []string{"sb-a"}}
	waitFor(t, "the endpoint removed", func() bool { return slices.Equal(routed(d, "f"), []string{"sb-b"}) })
}

// The net/http path (here: a chunked body) takes a refusing endpoint out of
// rotation too; with no other sandbox the call waits in the queue, as a new
// call would, and is served by the sandbox the control plane adds; with
// one free it goes there at once.
func TestRefusingEndpointLeavesRotationNetHTTP(t *testing.T) {
	d, _ := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added: []*briskv1.Endpoint{ep("f", "sb-a", refusingAddr(t))}})
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- chunkedCall(d, "f") }()
	waitFor(t, "the call queued after the refused connect", func() bool { return d.lookup("f").q.Len() == 1 })
	d.Apply(&briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("f", "sb-b", newSandbox(t, echo))}})
	if rec := <-answered; rec.Code != http.StatusOK {
		t.Fatalf("a call whose only sandbox refused: %d %s, want 200 from the one added", rec.Code, rec.Body)
	}
	defer func() {
		rr := func(s *briskv1.FunctionSpec) { s.LoadBalancing = "round-robin" }
		d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("g", rr)},
			Added: []*briskv1.Endpoint{ep("g", "sb-c", refusingAddr(t)), ep("g", "sb-d", newSandbox(t, echo))}})
		for range 2 {
			if rec := chunkedCall(d, "g"); rec.Code != http.StatusOK {
				t.Fatalf("a chunked call with a refusing sandbox in rotation: %d %s, want 200 from the other", rec.Code, rec.Body)
			}
		}
		if got := routed(d, "g"); !slices.Equal(got, []string{"sb-d"}) {
			t.Fatalf("routes of g: %v, want [sb-d]", got)
		}
	}()
	if got := routed(d, "f"); !slices.Equal(got, []string{"sb-b"}) {
		t.Fatalf("routes after the refused connect: %v, want [sb-b]", got)
	}
	if got := d.unreach.take(); len(got) != 1 || got[0].GetSandboxId() != "sb-a" {
		t.Fatalf("queued reports %v, want sb-a", got)
	}
}

// shortQueue bounds a test function's wait for a sandbox to 100 ms: a call
// whose only sandbox refused waits that long for another, then fails.
func shortQueue(s *briskv1.FunctionSpec) { s.QueueTimeoutMs = 100 }

// chunkedCall calls fn with a chunked body, which takes the net/http path.
func chunkedCall(d *DataPlane, fn string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/function/"+fn, strings.NewReader(`{}`))
	req.ContentLength = -1 // chunked
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, req)
	return rec
}

// Only a refused connect proves the sandbox gone: a timeout (a busy or
// slow sandbox) leaves it in rotation and reports nothing.
func TestConnectTimeoutKeepsEndpoint(t *testing.T) {
	d, _ := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added: []*briskv1.Endpoint{ep("f", "sb-a", "127.0.0.1:1")}})
	fn := d.lookup("f")
	st := &reqState{fn: fn, ep: fn.set.Load().Endpoints[0]}
	d.connectFailed(st, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("i/o timeout")})
	d.connectFailed(st, context.DeadlineExceeded)
	if got := routed(d, "f"); !slices.Equal(got, []string{"sb-a"}) {
		t.Fatalf("routes after a timeout: %v, want [sb-a]", got)
	}
	if got := d.unreach.take(); len(got) != 0 {
		t.Fatalf("a timeout was reported: %v", got)
	}
}

// blackholeAddr is a loopback address whose connects time out: a listener
// with a backlog of 0 that never accepts, its queue filled, so that the
// kernel drops further SYNs, as a partitioned host's are dropped.
func blackholeAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for range 8 { // fill the queue until a connect times out
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("connects to a full listen queue do not time out on this kernel")
	return ""
}

// A call whose sandbox cannot be reached (its connect times out: a worker
// cut off from this data plane) moves to another sandbox of its function;
// the unreachable one stays in rotation, as a timeout proves nothing
// (the partition lab's finding 4).
func TestUnreachableEndpointRerouted(t *testing.T) {
	d, srv := newTestDP(t, nil)
	rr := func(s *briskv1.FunctionSpec) { s.LoadBalancing = "round-robin" }
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f", rr)},
		Added: []*briskv1.Endpoint{ep("f", "sb-a", blackholeAddr(t)), ep("f", "sb-b", newSandbox(t, echo))}})
	for range 2 { // the fast path
		if r := get(t, srv.URL+"/function/f"); r.code != 200 || decodeSeen(t, r).Sandbox != "sb-b" {
			t.Fatalf("a call with an unreachable sandbox in rotation: %d %s (%v), want 200 from sb-b", r.code, r.body, r.err)
		}
	}
	for range 2 { // the net/http path
		if rec := chunkedCall(d, "f"); rec.Code != http.StatusOK {
			t.Fatalf("a chunked call with an unreachable sandbox in rotation: %d %s, want 200 from the other", rec.Code, rec.Body)
		}
	}
	// Round-robin hands each call sb-a first (the reroute moved the
	// cursor on to it again): each costs a connect timeout, none fails.
	if n := testutil.ToFloat64(d.prom.reroutes); n != 4 {
		t.Fatalf("%v calls rerouted, want the four that met the unreachable endpoint", n)
	}
	if got := routed(d, "f"); len(got) != 2 {
		t.Fatalf("routes after the timed-out connect: %v, want both", got)
	}
}

// A call moves past every dead sandbox of its function, more than the
// three unreachable ones it would: after a long partition all the
// sandboxes a data plane knows may have been stopped at once (the lab's
// finding 1, at 60 s).
func TestCallMovesPastEveryDeadSandbox(t *testing.T) {
	d, srv := newTestDP(t, nil)
	rr := func(s *briskv1.FunctionSpec) { s.LoadBalancing = "round-robin" }
	var eps []*briskv1.Endpoint
	for i := range 5 {
		eps = append(eps, ep("f", fmt.Sprintf("sb-%d", i), refusingAddr(t)))
	}
	eps = append(eps, ep("f", "sb-live", newSandbox(t, echo)))
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f", rr)}, Added: eps})
	if r := get(t, srv.URL+"/function/f"); r.code != 200 || decodeSeen(t, r).Sandbox != "sb-live" {
		t.Fatalf("a call meeting five dead sandboxes first: %d %s, want 200 from sb-live", r.code, r.body)
	}
	if n := testutil.ToFloat64(d.prom.reroutes); n != 5 {
		t.Fatalf("%v reroutes, want 5", n)
	}
	if got := routed(d, "f"); !slices.Equal(got, []string{"sb-live"}) {
		t.Fatalf("routes: %v, want [sb-live]", got)
	}
}

// A call that took a slot on a sandbox withdrawn before it connected (the
// control plane evicted the sandbox as idle on a report that predates the
// call: its pool is closed, nothing was sent) moves to another sandbox of
// its function instead of failing 502 "the upstream left the routing
// table", which the InVitro loader met once in 3,531 calls at a burst.
func TestWithdrawnBeforeConnectRerouted(t *testing.T) {
	d, _ := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")},
		Added: []*briskv1.Endpoint{ep("f", "sb-a", newSandbox(t, echo)), ep("f", "sb-b", newSandbox(t, echo))}})
	fn := d.lookup("f")
	taken, _, err := fn.acquire(t.Context(), fn.set.Load(), d.markUrgent, false)
	if err != nil {
		t.Fatal(err)
	}
	other := "sb-a"
	if taken.id == "sb-a" {
		other = "sb-b"
	}
	d.Apply(&briskv1.EndpointBatch{Removed: []string{taken.id}})
	st := &reqState{fn: fn, ep: taken}
	sc := &sandboxCall{d: d, st: st, deadline: time.Now().Add(5 * time.Second)}
	c, _, err := sc.Take(t.Context(), 0, false)
	if err != nil {
		t.Fatalf("take after the sandbox was withdrawn: %v, want a connection to %s", err, other)
	}
	c.NC.Close()
	if st.ep.id != other || sc.reroutes != 1 {
		t.Fatalf("call on %s after %d reroutes, want %s after 1", st.ep.id, sc.reroutes, other)
	}
	if n := testutil.ToFloat64(d.prom.reroutes); n != 1 {
		t.Fatalf("%v reroutes counted, want 1", n)
	}
}

// A call whose only sandbox is withdrawn before it connects gives the
// sandbox's slot back at once while it waits for another (held, it would
// keep the sandbox draining, and its room from whatever it was evicted
// for), and with none coming is answered as a call that waited in the
// queue: 504 queue-timeout, not 502 sandbox-failed. Its slot is given back
// once only.
func TestWithdrawnSoleSandboxGivesItsSlotBack(t *testing.T) {
	d, _ := newTestDP(t, nil)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f", shortQueue)},
		Added: []*briskv1.Endpoint{ep("f", "sb-a", newSandbox(t, echo))}})
	fn := d.lookup("f")
	set := fn.set.Load()
	taken, _, err := fn.acquire(t.Context(), set, d.markUrgent, false)
	if err != nil {
		t.Fatal(err)
	}
	d.Apply(&briskv1.EndpointBatch{Removed: []string{"sb-a"}})
	st := &reqState{Context: t.Context(), fn: fn, ep: taken, conf: set.Conf}
	fn.m.inflight.Add(1) // as admit counts it
	sc := &sandboxCall{d: d, st: st, deadline: time.Now().Add(5 * time.Second)}
	if _, _, err := sc.Take(t.Context(), 0, false); err == nil {
		t.Fatal("a connection with no sandbox left")
	}
	if n := taken.inFlight(); n != 0 || !st.slotGone {
		t.Fatalf("withdrawn sandbox has %d calls (slot given back: %v), want 0", n, st.slotGone)
	}
	if got := d.collect(time.Now(), time.Second).GetDraining(); len(got) != 0 {
		t.Fatalf("report lists %v as draining, want none", got)
	}
	if f := d.upstreamError(st, proxy.ErrPoolClosed); f.code != http.StatusGatewayTimeout || f.why != reasonQueueTimeout {
		t.Fatalf("answer %d %v %q, want 504 queue-timeout", f.code, f.why, f.msg)
	}
	d.finish(st, nil)
	if n := taken.inFlight(); n != 0 {
		t.Fatalf("withdrawn sandbox's tracker at %d after finish, want 0 (its slot given back once)", n)
	}
}

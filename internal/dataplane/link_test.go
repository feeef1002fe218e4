package dataplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/rpc"
)

// fakeCP is a ControlPlane server driven by the test: each WatchEndpoints
// call becomes a watchSession the test feeds batches to and can end.
type fakeCP struct {
	briskv1.UnimplementedControlPlaneServer
	registered chan *briskv1.RegisterDataPlaneRequest
	watches    chan *watchSession
	reports    chan *briskv1.MetricsReport
}

type watchSession struct {
	req  *briskv1.WatchEndpointsRequest
	send chan *briskv1.EndpointBatch
	end  chan struct{}
}

func (f *fakeCP) RegisterDataPlane(_ context.Context, req *briskv1.RegisterDataPlaneRequest) (*briskv1.RegisterDataPlaneResponse, error) {
	f.registered <- req
	return &briskv1.RegisterDataPlaneResponse{ControlPlaneId: "cp-test"}, nil
}

func (f *fakeCP) WatchEndpoints(req *briskv1.WatchEndpointsRequest, stream grpc.ServerStreamingServer[briskv1.EndpointBatch]) error {
	ws := &watchSession{req: req, send: make(chan *briskv1.EndpointBatch, 16), end: make(chan struct{})}
	f.watches <- ws
	for {
		select {
		case b := <-ws.send:
			if err := stream.Send(b); err != nil {
				return err
			}
		case <-ws.end:
			return nil
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

func (f *fakeCP) ReportMetrics(_ context.Context, rep *briskv1.MetricsReport) (*briskv1.MetricsAck, error) {
	select {
	case f.reports <- rep:
	default: // the test stopped listening
	}
	return &briskv1.MetricsAck{}, nil
}

func startFakeCP(t *testing.T) (*fakeCP, string) {
	t.Helper()
	f := &fakeCP{
		registered: make(chan *briskv1.RegisterDataPlaneRequest, 16),
		watches:    make(chan *watchSession, 16),
		reports:    make(chan *briskv1.MetricsReport, 1024),
	}
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

// runDP runs a data plane until the test ends and waits for it to return.
func runDP(t *testing.T, cfg Config) *DataPlane {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := recv(t, done, "Run to return"); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	recv(t, d.Ready(), "data plane to bind")
	return d
}

// awaitReport returns the first report that satisfies match.
func awaitReport(t *testing.T, f *fakeCP, what string, match func(*briskv1.MetricsReport) *briskv1.FunctionMetric) *briskv1.FunctionMetric {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case rep := <-f.reports:
			if m := match(rep); m != nil {
				return m
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func metricFor(rep *briskv1.MetricsReport, fn string) *briskv1.FunctionMetric {
	for _, m := range rep.GetFunctions() {
		if m.GetFunction() == fn {
			return m
		}
	}
	return nil
}

func TestControlPlaneLink(t *testing.T) {
	f, cpAddr := startFakeCP(t)
	d := runDP(t, Config{ID: "dp-test", ControlPlane: cpAddr, MetricsInterval: 20 * time.Millisecond})
	base := "http://" + d.Addr()

	reg := recv(t, f.registered, "RegisterDataPlane")
	if reg.GetId() != "dp-test" || reg.GetAddress() != d.Addr() {
		t.Errorf("registered as %+v", reg)
	}
	ws := recv(t, f.watches, "WatchEndpoints")
	if ws.req.GetDataPlaneId() != "dp-test" {
		t.Errorf("watch from %q", ws.req.GetDataPlaneId())
	}
	ws.send <- &briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("cold"), fnSpec("other")}}
	waitFor(t, "snapshot applied", func() bool { return d.lookup("cold") != nil })

	// A request with no sandbox triggers an urgent report at once.
	res := goGet(t, base+"/function/cold")
	m := awaitReport(t, f, "urgent no-capacity report", func(rep *briskv1.MetricsReport) *briskv1.FunctionMetric {
		if !rep.GetUrgent() {
			return nil
		}
		return metricFor(rep, "cold")
	})
	if !m.GetNoCapacity() || m.GetQueued() != 1 || m.GetAvgConcurrency() != 1 || m.GetRequests() != 0 {
		t.Errorf("urgent metric %+v", m)
	}

	// The control plane answers with a sandbox; the request is a cold start.
	ws.send <- &briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("cold", "sb-1", newSandbox(t, echo))}}
	r := recv(t, res, "cold response")
	if r.code != 200 || !strings.Contains(r.header.Get("X-Brisk-Timing"), "cold=true") {
		t.Fatalf("cold response %d, timing %q", r.code, r.header.Get("X-Brisk-Timing"))
	}
	// The periodic report counts the request and the time it was in the system.
	m = awaitReport(t, f, "periodic report with the request", func(rep *briskv1.MetricsReport) *briskv1.FunctionMetric {
		if m := metricFor(rep, "cold"); !rep.GetUrgent() && m.GetRequests() == 1 {
			return m
		}
		return nil
	})
	if m.GetAvgConcurrency() <= 0 {
		t.Errorf("periodic metric %+v: want avg_concurrency > 0", m)
	}
	// Once idle, the function reports one zero interval and then falls silent.
	awaitReport(t, f, "zero interval", func(rep *briskv1.MetricsReport) *briskv1.FunctionMetric {
		if m := metricFor(rep, "cold"); m != nil && m.GetRequests() == 0 && m.GetAvgConcurrency() == 0 {
			return m
		}
		return nil
	})
	// Activity elsewhere produces reports; none may mention cold.
	ws.send <- &briskv1.EndpointBatch{Added: []*briskv1.Endpoint{ep("other", "sb-o", newSandbox(t, echo))}}
	for range 3 {
		if r := get(t, base+"/function/other"); r.code != 200 {
			t.Fatalf("other: %d %s", r.code, r.body)
		}
		awaitReport(t, f, "report with other", func(rep *briskv1.MetricsReport) *briskv1.FunctionMetric {
			if metricFor(rep, "cold") != nil {
				t.Fatalf("idle function still reported: %+v", rep)
			}
			return metricFor(rep, "other")
		})
	}

	// Resync: the stream ends, the data plane registers and watches again,
	// and the new snapshot replaces everything.
	close(ws.end)
	recv(t, f.registered, "re-registration")
	ws = recv(t, f.watches, "second WatchEndpoints")
	ws.send <- &briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("fresh")},
		Added:     []*briskv1.Endpoint{ep("fresh", "sb-2", newSandbox(t, echo))}}
	waitFor(t, "resync snapshot applied", func() bool { return d.lookup("fresh") != nil && d.lookup("cold") == nil })
	if s := decodeSeen(t, get(t, base+"/function/fresh")); s.Sandbox != "sb-2" {
		t.Errorf("fresh served by %q", s.Sandbox)
	}
	wantError(t, get(t, base+"/function/cold"), 404, `function "cold" not found`)
}

func TestFirstBatchMustBeSnapshot(t *testing.T) {
	f, cpAddr := startFakeCP(t)
	d := runDP(t, Config{ControlPlane: cpAddr, MetricsInterval: time.Hour})
	recv(t, f.registered, "RegisterDataPlane")
	ws := recv(t, f.watches, "WatchEndpoints")
	ws.send <- &briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec("delta")}}
	// The delta is refused and the data plane starts over.
	recv(t, f.registered, "re-registration")
	ws = recv(t, f.watches, "second WatchEndpoints")
	if d.lookup("delta") != nil {
		t.Fatal("a delta was applied before any snapshot")
	}
	ws.send <- &briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("snap")}}
	waitFor(t, "snapshot applied", func() bool { return d.lookup("snap") != nil })
}

func TestH2C(t *testing.T) {
	d := runDP(t, Config{})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("hello")}, Added: []*briskv1.Endpoint{ep("hello", "sb-1", newSandbox(t, echo))}})
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, body := range []string{"", "payload"} {
		resp, err := client.Post("http://"+d.Addr()+"/function/hello/h2?x=1", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("served over %s", resp.Proto)
		}
		s := decodeSeen(t, result{code: resp.StatusCode, body: string(b)})
		if s.Path != "/h2" || s.RawQuery != "x=1" || resp.Header.Get("X-Brisk-Sandbox") != "sb-1" {
			t.Errorf("h2c: upstream saw %+v, headers %v", s, resp.Header)
		}
	}
}

func TestReconnectsUntilControlPlaneUp(t *testing.T) {
	// Reserve a port, free it, and start the control plane there only after
	// the data plane has been failing to reach it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var logs syncBuffer
	d := runDP(t, Config{ControlPlane: addr, MetricsInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	waitFor(t, "a failed attempt", func() bool { return strings.Contains(logs.String(), "control-plane link down") })

	f := &fakeCP{
		registered: make(chan *briskv1.RegisterDataPlaneRequest, 16),
		watches:    make(chan *watchSession, 16),
		reports:    make(chan *briskv1.MetricsReport, 16),
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	s := grpc.NewServer(rpc.ServerOptions(nil)...)
	briskv1.RegisterControlPlaneServer(s, f)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)

	recv(t, f.registered, "registration after the control plane came up")
	ws := recv(t, f.watches, "WatchEndpoints")
	ws.send <- &briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("late")}}
	waitFor(t, "snapshot applied", func() bool { return d.lookup("late") != nil })
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The emergency track (PulseNet's Pulselet): a data plane sends a call that
// found no free regular sandbox straight here; the node starts a one-shot
// sandbox for it, serves that one call and tears the sandbox down. Emergency
// sandboxes never enter the node's table, so the control plane and the
// endpoint stream never see them; they count in the node's resources and
// its heartbeats, and a restarted daemon kills any it finds (adopt).

// EmergencyPrefix starts every emergency sandbox's id.
const EmergencyPrefix = "ei-"

const (
	// maxEmergencyReply bounds a reply carried back in one gRPC message.
	maxEmergencyReply = 16 << 20
	// emergencyTeardown bounds the kill after the reply.
	emergencyTeardown = 30 * time.Second
)

// emergencyState is a node's emergency track, guarded by Node.mu.
type emergencyState struct {
	slots           int
	inUse           int
	started, failed int64
	used            spec.Resources
	mibSeconds      float64 // Σ MiB × lifetime of ended emergency sandboxes
}

// emergencySeq numbers emergency sandboxes (their ids).
var emergencySeq atomic.Uint64

// emergencyClient talks to one-shot sandboxes: one request per connection.
var emergencyClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil, MaxResponseHeaderBytes: 1 << 20},
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

// emergencyStatsLocked is the heartbeat's view of the track.
func (n *Node) emergencyStatsLocked() *briskv1.EmergencyStats {
	return &briskv1.EmergencyStats{Slots: int32(n.em.slots), InUse: int32(n.em.inUse), Started: n.em.started, Failed: n.em.failed,
		MemoryMbSeconds: n.em.mibSeconds}
}

// reserveEmergency takes a slot and the sandbox's resources, or says why not.
func (n *Node) reserveEmergency(res spec.Resources) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.em.slots <= 0:
		return "", status.Errorf(codes.FailedPrecondition, "node %s takes no emergency calls", n.id)
	case n.em.inUse >= n.em.slots:
		return "", status.Errorf(codes.ResourceExhausted, "node %s: all %d emergency slots in use", n.id, n.em.slots)
	}
	used := spec.Resources{MilliCPU: n.used.MilliCPU + n.em.used.MilliCPU + res.MilliCPU, MemoryMB: n.used.MemoryMB + n.em.used.MemoryMB + res.MemoryMB}
	if (n.capacity.MilliCPU > 0 && used.MilliCPU > n.capacity.MilliCPU) || (n.capacity.MemoryMB > 0 && used.MemoryMB > n.capacity.MemoryMB) {
		return "", status.Errorf(codes.ResourceExhausted, "node %s: no room for an emergency sandbox (%dm CPU, %d MiB)", n.id, res.MilliCPU, res.MemoryMB)
	}
	n.em.inUse++
	n.em.started++
	n.em.used.MilliCPU += res.MilliCPU
	n.em.used.MemoryMB += res.MemoryMB
	// One counter for the process: nodes of one daemon (emulated) share a
	// boot id and may share a runtime.
	return EmergencyPrefix + n.bootID[:min(8, len(n.bootID))] + "-" + strconv.FormatUint(emergencySeq.Add(1), 36), nil
}

func (n *Node) releaseEmergency(res spec.Resources, failed bool, lived time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.em.mibSeconds += float64(res.MemoryMB) * lived.Seconds()
	n.em.inUse--
	n.em.used.MilliCPU -= res.MilliCPU
	n.em.used.MemoryMB -= res.MemoryMB
	if failed {
		n.em.failed++
	}
}

// emergency serves one call in a one-shot sandbox. Errors before the call
// reached the sandbox are RESOURCE_EXHAUSTED, FAILED_PRECONDITION or
// UNAVAILABLE (the caller may try another node); after, ABORTED.
func (n *Node) emergency(ctx context.Context, req *briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
	t0 := time.Now()
	if req.GetSpec() == nil || !runtime.ValidName(req.GetSpec().GetName()) {
		return nil, status.Error(codes.InvalidArgument, "emergency call without a valid function spec")
	}
	if !strings.HasPrefix(req.GetPath(), "/") {
		return nil, status.Errorf(codes.InvalidArgument, "emergency call path %q must start with /", req.GetPath())
	}
	if dl := req.GetDeadlineUnixMs(); dl > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.UnixMilli(dl))
		defer cancel()
	}
	// Only a spec the control plane sent this node runs: a data plane names
	// the function and revision, it does not choose what runs.
	n.mu.Lock()
	f := n.specs[specKey{req.GetSpec().GetName(), req.GetSpec().GetRevision()}]
	n.mu.Unlock()
	if f == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s: function %s revision %d was not offered by the control plane",
			n.id, req.GetSpec().GetName(), req.GetSpec().GetRevision())
	}
	res := f.Resources
	id, err := n.reserveEmergency(res)
	if err != nil {
		return nil, err
	}
	failed := true
	rs, err := n.prepare(ctx, n.emRT, runtime.Spec{ID: id, Function: f})
	var inst *runtime.Instance
	if err == nil {
		inst, err = n.emRT.Create(ctx, rs)
	}
	if err != nil {
		n.releaseEmergency(res, true, time.Since(t0))
		n.log.Warn("emergency sandbox did not start", "function", f.Name, "sandbox", id, "err", err)
		if errors.Is(err, errors.ErrUnsupported) {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s: %v", n.id, err)
		}
		return nil, status.Errorf(codes.Unavailable, "node %s: emergency sandbox: %v", n.id, err)
	}
	// Torn down after the reply, whatever happened; the slot is held until
	// then, so the node never runs more than its slots.
	defer func() {
		go func() {
			kctx, cancel := context.WithTimeout(context.Background(), emergencyTeardown)
			defer cancel()
			if err := n.emRT.Kill(kctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
				n.log.Warn("emergency sandbox teardown", "sandbox", id, "err", err)
			}
			n.releaseEmergency(res, failed, time.Since(t0))
		}()
	}()
	if !inst.Ready {
		if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
			return nil, status.Errorf(codes.Unavailable, "node %s: emergency sandbox %s not ready: %v", n.id, id, err)
		}
	}
	started := time.Since(t0)
	hreq, err := http.NewRequestWithContext(ctx, req.GetMethod(), "http://"+inst.Addr+req.GetPath(), bytes.NewReader(req.GetBody()))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "emergency call: %v", err)
	}
	for _, h := range req.GetHeaders() {
		hreq.Header.Add(h.GetName(), h.GetValue())
	}
	hreq.Header.Set("X-Brisk-Sandbox", id)
	if req.GetCallId() != "" {
		hreq.Header.Set("X-Call-Id", req.GetCallId())
	}
	resp, err := emergencyClient.Do(hreq)
	if err != nil {
		return nil, status.Errorf(codes.Aborted, "node %s: emergency sandbox %s: %v", n.id, id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEmergencyReply+1))
	switch {
	case err != nil:
		return nil, status.Errorf(codes.Aborted, "node %s: emergency sandbox %s: reply: %v", n.id, id, err)
	case len(body) > maxEmergencyReply:
		return nil, status.Errorf(codes.Aborted, "node %s: emergency sandbox %s: reply larger than %d bytes", n.id, id, maxEmergencyReply)
	}
	failed = false
	out := &briskv1.EmergencyReply{Status: int32(resp.StatusCode), Body: body, SandboxId: id, StartUs: started.Microseconds()}
	for k, vs := range resp.Header {
		for _, v := range vs {
			out.Headers = append(out.Headers, &briskv1.Header{Name: k, Value: v})
		}
	}
	return out, nil
}

// Emergency implements the Worker service's emergency call; control planes
// and data planes of the cluster may call it.
func (d *Daemon) Emergency(ctx context.Context, req *briskv1.EmergencyRequest) (*briskv1.EmergencyReply, error) {
	n := d.nodes[req.GetNodeId()]
	if n == nil {
		return nil, status.Errorf(codes.NotFound, "no node %q here", req.GetNodeId())
	}
	return n.emergency(ctx, req)
}

// peerKind is the certificate kind of the caller, "" without TLS.
func peerKind(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return ""
	}
	k, _ := pki.IDs(ti.State.PeerCertificates[0])
	return k
}

// onlyControlPlane refuses callers other than control planes; with TLS on,
// data planes reach the worker's listener but only for Emergency.
func onlyControlPlane(ctx context.Context, method string) error {
	if k := peerKind(ctx); k != "" && k != pki.KindControlPlane {
		return status.Errorf(codes.PermissionDenied, "a %s certificate may not call %s", k, method)
	}
	return nil
}

package dataplane

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/internal/rpc"
)

// The dual track (PulseNet; docs/architecture.md, "Dual track"): a call of a
// dual-mode function that finds no free regular sandbox is sent at once to
// a worker's emergency endpoint, which serves it in a one-shot sandbox,
// instead of waiting in the queue for the autoscaler. Workers are tried
// round-robin, skipping those whose last heartbeat showed no free slot and
// those that refused in the last second; when none takes the call before it
// reaches a sandbox, the call queues for a regular sandbox as in async mode.

const (
	// emergencyTries bounds the workers one call tries.
	emergencyTries = 3
	// emergencyBackoff is how long a worker that refused is skipped.
	emergencyBackoff = time.Second
	// maxEmergencyBody: larger bodies go the regular way (one gRPC message
	// carries the call).
	maxEmergencyBody = 4 << 20
	// iatWindow is how far back the metric filter looks (PulseNet: one
	// hour), iatKeep how many inter-arrival times a function keeps.
	iatWindow = time.Hour
	iatKeep   = 256
)

// emWorker is one worker taking emergency calls, as the control plane last
// said.
type emWorker struct {
	node, addr string
	free       int32
}

// emergencyTrack is the data plane's side of the dual track.
type emergencyTrack struct {
	workers atomic.Pointer[[]emWorker]
	next    atomic.Uint64
	// skipUntil: node -> nanotime before which it is not tried.
	skipUntil sync.Map

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // node+"\x00"+addr
}

// close closes the connections to workers.
func (e *emergencyTrack) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, c := range e.conns {
		c.Close()
		delete(e.conns, k)
	}
}

// setWorkers replaces the list (EndpointBatch.emergency_workers).
func (e *emergencyTrack) setWorkers(ws []*briskv1.EmergencyWorker) {
	list := make([]emWorker, 0, len(ws))
	for _, w := range ws {
		list = append(list, emWorker{node: w.GetNodeId(), addr: w.GetAddress(), free: w.GetFree()})
	}
	e.workers.Store(&list)
}

func (e *emergencyTrack) any() bool {
	ws := e.workers.Load()
	return ws != nil && len(*ws) > 0
}

// client returns a gRPC client of w's worker; connections are kept.
func (d *DataPlane) emergencyClient(w emWorker) (briskv1.WorkerClient, error) {
	e := &d.em
	key := w.node + "\x00" + w.addr
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.conns[key]; ok {
		return briskv1.NewWorkerClient(c), nil
	}
	var creds credentials.TransportCredentials
	if id := d.cfg.Identity; id != nil {
		creds = credentials.NewTLS(id.ClientTLS(pki.KindWorker, w.node))
	}
	conn, err := rpc.Dial(w.addr, creds)
	if err != nil {
		return nil, err
	}
	if e.conns == nil {
		e.conns = map[string]*grpc.ClientConn{}
	}
	e.conns[key] = conn
	return briskv1.NewWorkerClient(conn), nil
}

// candidates returns up to emergencyTries workers to try, round-robin.
func (d *DataPlane) candidates(now int64) []emWorker {
	ws := d.em.workers.Load()
	if ws == nil || len(*ws) == 0 {
		return nil
	}
	list := *ws
	start := int(d.em.next.Add(1) % uint64(len(list)))
	out := make([]emWorker, 0, emergencyTries)
	for i := 0; i < len(list) && len(out) < emergencyTries; i++ {
		w := list[(start+i)%len(list)]
		if w.free <= 0 {
			continue
		}
		if until, ok := d.em.skipUntil.Load(w.node); ok && until.(int64) > now {
			continue
		}
		out = append(out, w)
	}
	return out
}

// emergency tries to serve the call on the emergency track. It reports
// false when no worker took it before it reached a sandbox: the caller then
// queues it for a regular sandbox.
func (d *DataPlane) emergency(w http.ResponseWriter, r *http.Request, st *reqState, conf *fnConf, body []byte) bool {
	fn := st.fn
	arrival := d.nanotime()
	cands := d.candidates(arrival)
	if len(cands) == 0 {
		return false
	}
	path := st.rest
	if r.URL.RawQuery != "" {
		path += "?" + r.URL.RawQuery
	}
	req := &briskv1.EmergencyRequest{Spec: conf.wire, CallId: st.callID[0], Method: r.Method, Path: path, Body: body,
		DeadlineUnixMs: time.Now().Add(conf.timeout).UnixMilli()}
	for k, vs := range r.Header {
		if httpguts.HeaderValuesContainsToken(r.Header["Connection"], k) || hopHeader(k) {
			continue
		}
		for _, v := range vs {
			req.Headers = append(req.Headers, &briskv1.Header{Name: k, Value: v})
		}
	}
	counted := fn.iats().counts(conf.keepAlive, d.cfg.EmergencyPercentile, time.Now())
	for _, cand := range cands {
		c, err := d.emergencyClient(cand)
		if err != nil {
			continue
		}
		req.NodeId = cand.node
		ctx, cancel := context.WithTimeout(r.Context(), conf.timeout)
		if counted && fn.stats.arrive(d.nanotime()) {
			d.noteActive(fn)
		}
		fn.m.inflight.Add(1)
		reply, err := c.Emergency(ctx, req, grpc.MaxCallRecvMsgSize(32<<20))
		fn.m.inflight.Add(-1)
		end := d.nanotime()
		if counted {
			fn.stats.depart(end)
		} else {
			// Uncounted, it woke nothing, but a latency may be
			// observed below: the next report must visit fn.
			d.noteActive(fn)
		}
		cancel()
		switch status.Code(err) {
		case codes.OK:
			d.prom.emergency.WithLabelValues("served").Inc()
			fn.m.used.Store(true)
			fn.m.emergency.Add(1)
			fn.m.codes.inc(int(reply.GetStatus()))
			fn.m.duration.observe(end - arrival)
			h := w.Header()
			for _, hd := range reply.GetHeaders() {
				if !hopHeader(hd.GetName()) && hd.GetName() != "Content-Length" {
					h.Add(hd.GetName(), hd.GetValue())
				}
			}
			h["X-Call-Id"] = st.callID
			h["X-Brisk-Sandbox"] = []string{reply.GetSandboxId()}
			h["X-Brisk-Track"] = hdrEmergency
			h["X-Brisk-Timing"] = []string{timing(reply.GetStartUs(), true, (end-arrival)/1e3)}
			h["X-Start-Time"] = []string{strconv.FormatInt(d.epochNs+arrival, 10)}
			h["Content-Length"] = []string{strconv.Itoa(len(reply.GetBody()))}
			w.WriteHeader(int(reply.GetStatus()))
			_, _ = w.Write(reply.GetBody())
			return true
		case codes.ResourceExhausted, codes.Unavailable, codes.FailedPrecondition, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
			// The call never reached a sandbox: another worker may take it.
			d.prom.emergency.WithLabelValues("refused").Inc()
			d.em.skipUntil.Store(cand.node, end+int64(emergencyBackoff))
			if r.Context().Err() != nil {
				fn.m.codes.inc(statusClientGone)
				return true
			}
			continue
		}
		// It may have reached the sandbox: not retried (at most once).
		d.prom.emergency.WithLabelValues("failed").Inc()
		fn.m.used.Store(true)
		fn.m.duration.observe(end - arrival)
		var f failure
		switch {
		case r.Context().Err() != nil:
			fn.m.codes.inc(statusClientGone)
			return true
		case status.Code(err) == codes.DeadlineExceeded:
			f = fail(http.StatusGatewayTimeout, reasonFunctionTimeout, "function %q timed out after %s (emergency sandbox on %s)", fn.name, conf.timeout, cand.node)
		default:
			f = fail(http.StatusBadGateway, reasonSandboxFailed, "function %q: emergency sandbox on %s: %v", fn.name, cand.node, status.Convert(err).Message())
		}
		fn.m.codes.inc(f.code)
		d.writeError(w, st.callID, f)
		return true
	}
	return false
}

var hdrEmergency = []string{"emergency"}

// hopHeader reports the hop-by-hop headers a proxy does not pass on.
func hopHeader(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// iatTracker keeps a dual-mode function's recent inter-arrival times for
// the metric filter.
type iatTracker struct {
	mu   sync.Mutex
	last time.Time
	ring [iatKeep]struct {
		at  time.Time
		gap time.Duration
	}
	n, head int
}

// observe records an arrival at now.
func (t *iatTracker) observe(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.last.IsZero() {
		t.ring[t.head].at, t.ring[t.head].gap = now, now.Sub(t.last)
		t.head = (t.head + 1) % iatKeep
		t.n = min(t.n+1, iatKeep)
	}
	t.last = now
}

// counts is PulseNet's metric filter: an emergency-served call counts
// toward regular scaling only when an idle regular sandbox would outlive
// the pct-th percentile of the function's inter-arrival times over the last
// hour, that is when the next call probably comes before a new regular
// sandbox would expire anyway. Without history the call counts.
func (t *iatTracker) counts(keepAlive time.Duration, pct float64, now time.Time) bool {
	t.mu.Lock()
	gaps := make([]time.Duration, 0, t.n)
	for i := 0; i < t.n; i++ {
		e := t.ring[(t.head-1-i+iatKeep)%iatKeep]
		if now.Sub(e.at) > iatWindow {
			break
		}
		gaps = append(gaps, e.gap)
	}
	t.mu.Unlock()
	if len(gaps) == 0 {
		return true
	}
	slices.Sort(gaps)
	i := min(len(gaps)-1, int(pct/100*float64(len(gaps)-1)+0.5))
	return keepAlive > gaps[i]
}

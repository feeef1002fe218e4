package controlplane

import (
	"context"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/pki"
)

// verifyAgainAfter bounds how often one sandbox is checked on data planes'
// reports: a check whose answer was lost (the session ended) is asked again
// on a report after this long; reports in between are answered by the
// check in flight.
const verifyAgainAfter = time.Second

// ReportUnreachable takes a data plane's report of sandbox endpoints it
// could not connect to. The data plane has taken them out of its own
// rotation; the control plane does not act on the report itself but asks
// each sandbox's worker to check it (Commands.verify), so one data plane
// with a network fault cannot have healthy sandboxes killed.
func (cp *ControlPlane) ReportUnreachable(ctx context.Context, r *briskv1.UnreachableReport) (*briskv1.UnreachableAck, error) {
	if _, err := cp.caller(ctx, pki.KindDataPlane, r.GetDataPlaneId()); err != nil {
		return nil, err
	}
	cp.cluster.reportUnreachable(r)
	return &briskv1.UnreachableAck{}, nil
}

func (c *Cluster) reportUnreachable(rep *briskv1.UnreachableReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for _, e := range rep.GetEndpoints() {
		fs := c.fns[e.GetFunction()]
		if fs == nil {
			continue
		}
		r := fs.sandboxes[e.GetSandboxId()]
		switch {
		case r == nil, r.state != sbReady, r.withdrawn, r.node.sess == nil:
			// Gone, on its way out, or its node's link is down: nothing
			// routes to it, and the handshake will tell what still runs.
			continue
		case e.GetAddress() != "" && e.GetAddress() != r.addr:
			continue // about an earlier address of the sandbox
		case !r.verifyAsked.IsZero() && now.Sub(r.verifyAsked) < verifyAgainAfter:
			continue // a check is in flight
		}
		r.verifyAsked = now
		r.node.sess.verifySandbox(r.id)
		c.log.Info("a data plane could not connect to a sandbox: its worker checks it", "data_plane", rep.GetDataPlaneId(),
			"function", fs.spec.Name, "sandbox", r.id, "node", r.node.id, "err", e.GetError())
	}
}

// verifiedLocked takes a ready sandbox's record announced again. After a
// check a data plane asked for, it means the worker found the sandbox
// serving: it goes back to every data plane (those that still route to it
// ignore the add), so a data plane's network blip costs no sandbox.
func (c *Cluster) verifiedLocked(r *sandboxRec) {
	if r.verifyAsked.IsZero() {
		return
	}
	r.verifyAsked = time.Time{}
	if !r.withdrawn {
		c.publishAddLocked(r)
	}
}

package controlplane

import (
	"context"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/pki"
)

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

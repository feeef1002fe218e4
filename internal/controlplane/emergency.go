package controlplane

import (
	"fmt"
	"slices"
	"strings"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The dual track (PulseNet, docs/architecture.md "Dual track"): the control
// plane neither places nor records emergency sandboxes. It only tells data
// planes which workers take emergency calls, from their heartbeats, and
// gives each function's effective scaling mode and keep-alive.

// wireSpec is f as data planes and workers get it: the spec with the
// effective scaling mode and the keep-alive of an idle regular sandbox.
func (c *Cluster) wireSpec(f *spec.Function) *briskv1.FunctionSpec {
	pf := f.ToProto()
	pf.ScalingMode = c.modeOf(f)
	pf.KeepAliveMs = keepAlive(c.kpaConfig(f)).Milliseconds()
	return pf
}

// emergencyWorkersLocked lists the live workers offering emergency slots,
// sorted by node id.
func (c *Cluster) emergencyWorkersLocked() []*briskv1.EmergencyWorker {
	var out []*briskv1.EmergencyWorker
	for _, n := range c.nodeList {
		em := n.heartbeat.GetEmergency()
		if n.sess == nil || n.rec.Drain || em.GetSlots() <= 0 || n.rec.Address == "" {
			continue
		}
		out = append(out, &briskv1.EmergencyWorker{NodeId: n.id, Address: n.rec.Address, Free: max(0, em.GetSlots()-em.GetInUse())})
	}
	slices.SortFunc(out, func(a, b *briskv1.EmergencyWorker) int { return strings.Compare(a.NodeId, b.NodeId) })
	return out
}

// refreshEmergencyLocked sends data planes the emergency worker list when
// it changed (a heartbeat, a session up or down).
func (c *Cluster) refreshEmergencyLocked() {
	list := c.emergencyWorkersLocked()
	var b strings.Builder
	for _, w := range list {
		fmt.Fprintf(&b, "%s|%s|%d;", w.NodeId, w.Address, w.Free)
	}
	if key := b.String(); key != c.emergencyKey {
		c.emergencyKey = key
		c.publishLocked(func(batch *briskv1.EndpointBatch) {
			batch.EmergencyWorkers, batch.EmergencySet = list, true
		})
	}
}

// offerDualLocked sends node n's session every dual-mode function's spec,
// which its emergency track needs (and checks calls against).
func (c *Cluster) offerDualLocked(n *nodeState) {
	if n.sess == nil {
		return
	}
	for _, fs := range c.fns {
		if c.modeOf(fs.spec) == spec.ModeDual {
			n.sess.offer(fs.spec)
		}
	}
}

// offerToAllLocked sends f's spec to every live session when f is in dual
// mode.
func (c *Cluster) offerToAllLocked(f *spec.Function) {
	if c.modeOf(f) != spec.ModeDual {
		return
	}
	for _, n := range c.nodeList {
		if n.sess != nil {
			n.sess.offer(f)
		}
	}
}

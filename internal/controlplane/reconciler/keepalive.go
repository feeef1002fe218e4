package reconciler

import (
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/keepalive"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Keep-alive (docs/policies.md, Keep-alive). Under ttl, the autoscaler's
// decision is the whole story: a sandbox leaves once demand has been below
// it for the keep-alive (the KPA's windows, or its scale-down delay). Under
// gd, sandboxes beyond the demand are idle but kept: they serve the next
// burst warm, and they leave only when a new sandbox finds no node with
// room (evicted in FaasCache's Greedy-Dual-Size-Frequency order) or, if the
// spec sets one, after the keep-alive.

// KeepAlivePolicyOf is f's effective keep-alive policy.
func (c *Reconciler) KeepAlivePolicyOf(f *spec.Function) string {
	if f.Scaling.KeepAlivePolicy != "" {
		return f.Scaling.KeepAlivePolicy
	}
	return c.cfg.KeepAlivePolicy
}

// holdSurplus reports whether fs keeps sandboxes beyond its demand instead
// of removing them now (gd, within the keep-alive if one is set).
func (c *Reconciler) holdSurplus(now time.Time, fs *fnState) bool {
	if fs.deleted || c.KeepAlivePolicyOf(fs.spec) != spec.KeepAliveGD {
		return false
	}
	if fs.surplusSince.IsZero() {
		fs.surplusSince = now
	}
	ka := time.Duration(fs.spec.Scaling.KeepAlive)
	return ka <= 0 || now.Sub(fs.surplusSince) < ka
}

// touch tells the keep-alive policy about n calls of fs.
func (c *Reconciler) touch(now time.Time, fs *fnState, n int64) {
	if n > 0 {
		fs.lastUsed = now
		c.keep.Touch(now, fs.spec.Name, n)
	}
}

// evictFor makes room for one sandbox of fs by evicting idle sandboxes of
// gd functions on one node, and reports whether room is coming (evicted
// now, or already being freed by sandboxes on their way out). Resources
// return when the evicted sandboxes are gone, so the caller retries.
func (c *Reconciler) evictFor(now time.Time, fs *fnState) bool {
	need := placement.Resources{MilliCPU: fs.spec.Resources.MilliCPU, MemoryMB: fs.spec.Resources.MemoryMB}
	// Idle sandboxes of each gd function: its current-revision ready ones
	// beyond its demand, newest first as victims() orders them.
	idle := map[*nodeState][]*sandboxRec{}
	for _, g := range c.order {
		if g == fs || g.deleted || c.KeepAlivePolicyOf(g.spec) != spec.KeepAliveGD {
			continue
		}
		active := 0
		for _, r := range g.sandboxes {
			if r.state != sbTombstoned && r.rev == g.spec.Revision {
				active++
			}
		}
		surplus := active - g.desired
		if surplus <= 0 {
			continue
		}
		for _, r := range c.victims(g, surplus) {
			if r.state == sbReady {
				idle[r.node] = append(idle[r.node], r)
			}
		}
	}
	if len(idle) == 0 {
		return false
	}
	best, bestShort := -1, int64(-1)
	for i, n := range c.nodeList {
		if !n.up || n.rec.Drain {
			continue
		}
		p := &c.place[i]
		if p.MaxSandboxes > 0 && p.Sandboxes-leaving(n, nil) >= p.MaxSandboxes && len(idle[n]) == 0 {
			continue
		}
		freeCPU := p.Allocatable.MilliCPU - p.Requested.MilliCPU
		freeMem := p.Allocatable.MemoryMB - p.Requested.MemoryMB
		var goingCPU, goingMem int64
		leaving(n, func(r *sandboxRec) { goingCPU += r.milliCPU; goingMem += r.memoryMB })
		if freeCPU+goingCPU >= need.MilliCPU && freeMem+goingMem >= need.MemoryMB {
			return true // room is on its way: evict nothing more
		}
		var idleCPU, idleMem int64
		for _, r := range idle[n] {
			idleCPU += r.milliCPU
			idleMem += r.memoryMB
		}
		if freeCPU+goingCPU+idleCPU < need.MilliCPU || freeMem+goingMem+idleMem < need.MemoryMB {
			continue
		}
		// The node that needs the least evicted, in memory (GD's size).
		short := max(need.MemoryMB-freeMem-goingMem, 0)
		if best < 0 || short < bestShort {
			best, bestShort = i, short
		}
	}
	if best < 0 {
		return false
	}
	n := c.nodeList[best]
	cands := idle[n]
	slices.SortFunc(cands, func(a, b *sandboxRec) int { return strings.Compare(a.id, b.id) })
	kc := make([]keepalive.Candidate, len(cands))
	for i, r := range cands {
		kc[i] = keepalive.Candidate{Key: r.fn.spec.Name, MemoryMB: r.memoryMB, LastUsed: r.fn.lastUsed, ColdStart: r.fn.coldStart}
	}
	p := &c.place[best]
	freeCPU := p.Allocatable.MilliCPU - p.Requested.MilliCPU
	// Evict by memory (GD's size), then more while CPU is still short.
	victims := c.keep.Evict(now, kc, max(bestShort, 1))
	for _, i := range victims {
		freeCPU += cands[i].milliCPU
	}
	for freeCPU < need.MilliCPU && len(victims) < len(cands) {
		rest := make([]keepalive.Candidate, 0, len(cands))
		idx := make([]int, 0, len(cands))
		for i := range cands {
			if !slices.Contains(victims, i) {
				rest, idx = append(rest, kc[i]), append(idx, i)
			}
		}
		more := c.keep.Evict(now, rest, 1)
		for _, j := range more {
			victims = append(victims, idx[j])
			freeCPU += cands[idx[j]].milliCPU
		}
	}
	for _, i := range victims {
		r := cands[i]
		c.log.Debug("evict idle sandbox", "function", r.fn.spec.Name, "sandbox", r.id, "node", n.id, "for", fs.spec.Name)
		c.tombstone(r)
		c.stats.Evictions++
	}
	return len(victims) > 0
}

// leaving counts n's sandboxes on their way out (tombstoned, not yet gone),
// calling visit with each when it is not nil.
func leaving(n *nodeState, visit func(*sandboxRec)) int {
	k := 0
	for _, r := range n.sandboxes {
		if r.state == sbTombstoned {
			k++
			if visit != nil {
				visit(r)
			}
		}
	}
	return k
}

// observeColdStart keeps fs's creation-to-ready time (what a miss costs,
// GD's cost term) as a moving average.
func (fs *fnState) observeColdStart(d time.Duration) {
	if fs.coldStart == 0 {
		fs.coldStart = d
		return
	}
	fs.coldStart += (d - fs.coldStart) / 8
}

package controlplane

import (
	"fmt"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Namespaces' quotas at scheduling time: what a namespace's sandboxes hold
// is counted as they are placed, adopted and dropped, and a function whose
// next sandbox would pass its namespace's quota gets none (its condition
// says quota-exceeded). Quotas on the number of functions and on one
// function's scale are checked by the admin API.

const condQuotaExceeded = "quota-exceeded"

// nsUsage is what one namespace's sandboxes request now.
type nsUsage struct {
	sandboxes          int
	milliCPU, memoryMB int64
}

// setQuotas replaces the namespaces' quotas (from the registry) and
// reconciles, so that a raised quota takes effect at once.
func (c *Cluster) setQuotas(q map[string]spec.Quota) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.quotas = q
	for _, fs := range c.fns {
		c.boundDesiredLocked(fs)
		c.reconcileLocked(fs)
	}
}

// chargeLocked counts r's resources to its function's namespace (sign 1)
// or gives them back (-1).
func (c *Cluster) chargeLocked(r *sandboxRec, sign int) {
	ns := namespaceOf(r.fn.spec)
	u := c.nsUse[ns]
	if u == nil {
		u = &nsUsage{}
		c.nsUse[ns] = u
	}
	u.sandboxes += sign
	u.milliCPU += int64(sign) * r.milliCPU
	u.memoryMB += int64(sign) * r.memoryMB
}

// quotaRoomLocked says why fs's namespace has no room for one more of its
// sandboxes ("": it has).
func (c *Cluster) quotaRoomLocked(fs *fnState) string {
	ns := namespaceOf(fs.spec)
	q, ok := c.quotas[ns]
	if !ok {
		return ""
	}
	u := c.nsUse[ns]
	if u == nil {
		u = &nsUsage{}
	}
	res := fs.spec.Resources
	switch {
	case q.MaxSandboxes > 0 && u.sandboxes+1 > q.MaxSandboxes:
		return fmt.Sprintf("namespace %q holds %d sandboxes, its quota max_sandboxes", ns, u.sandboxes)
	case q.MaxMilliCPU > 0 && u.milliCPU+res.MilliCPU > q.MaxMilliCPU:
		return fmt.Sprintf("namespace %q's sandboxes request %dm CPU of its quota max_cpu_milli %dm; one more needs %dm", ns, u.milliCPU, q.MaxMilliCPU, res.MilliCPU)
	case q.MaxMemoryMB > 0 && u.memoryMB+res.MemoryMB > q.MaxMemoryMB:
		return fmt.Sprintf("namespace %q's sandboxes request %d MiB of its quota max_memory_mb %d; one more needs %d", ns, u.memoryMB, q.MaxMemoryMB, res.MemoryMB)
	}
	return ""
}

// maxScaleLocked is the most sandboxes fs may have: the operator's cap and
// its namespace's max_scale.
func (c *Cluster) maxScaleLocked(fs *fnState) int {
	m := c.cfg.Caps.MaxScale
	if q, ok := c.quotas[namespaceOf(fs.spec)]; ok && q.MaxScale > 0 && (m == 0 || q.MaxScale < m) {
		m = q.MaxScale
	}
	return m
}

// namespaceOf is f's namespace (records stored before namespaces existed
// have none: the default one).
func namespaceOf(f *spec.Function) string {
	if f.Namespace == "" {
		return spec.DefaultNamespace
	}
	return f.Namespace
}

func (c *Cluster) usage(ns string) NamespaceUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out NamespaceUsage
	for _, fs := range c.fns {
		if namespaceOf(fs.spec) == ns {
			out.Functions++
		}
	}
	if u := c.nsUse[ns]; u != nil {
		out.Sandboxes, out.MilliCPU, out.MemoryMB = u.sandboxes, u.milliCPU, u.memoryMB
	}
	return out
}

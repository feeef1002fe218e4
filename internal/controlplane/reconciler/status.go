package reconciler

import (
	"fmt"
	"sort"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Queries read the state; they change nothing and emit no command.

// Spec is the function called name (nil: none).
func (c *Reconciler) Spec(name string) *spec.Function {
	if fs := c.fns[name]; fs != nil {
		return fs.spec
	}
	return nil
}

// FunctionStatus is name's status with its sandboxes; false if there is
// no such function.
func (c *Reconciler) FunctionStatus(name string) (api.FunctionStatus, bool) {
	fs := c.fns[name]
	if fs == nil {
		return api.FunctionStatus{}, false
	}
	st := fs.status(true)
	st.Policies = c.PoliciesOf(fs.spec)
	return st, true
}

// PoliciesOf is what f runs with: its spec's choices or the cluster's.
func (c *Reconciler) PoliciesOf(f *spec.Function) *api.Policies {
	p := &api.Policies{ScalingMode: c.ModeOf(f), Autoscaler: "kpa", Placement: c.PlacementOf(f), LoadBalancing: f.LoadBalancing,
		KeepAlivePolicy: c.KeepAlivePolicyOf(f), KeepAlive: c.KeepAliveOf(f).String()}
	if p.ScalingMode == spec.ModeSync {
		p.Autoscaler = "sync"
	}
	if p.LoadBalancing == "" {
		p.LoadBalancing = c.cfg.LoadBalancing
	}
	if p.LoadBalancing == "" {
		p.LoadBalancing = "least-loaded" // the data plane's default
	}
	return p
}

// Functions calls visit for every function with its status (without the
// sandbox list), in no particular order.
func (c *Reconciler) Functions(visit func(f *spec.Function, st api.FunctionStatus)) {
	for _, fs := range c.fns {
		visit(fs.spec, fs.status(false))
	}
}

// Sandboxes calls visit for every sandbox in the table with its function,
// node and state (as FunctionStatus names it), in no particular order (the
// dashboard's counts by state).
func (c *Reconciler) Sandboxes(visit func(fn, node, state string)) {
	for name, fs := range c.fns {
		for _, r := range fs.sandboxes {
			visit(name, r.node.id, r.state.String())
		}
	}
}

// Autoscaler calls visit with every function's desired scale and panic
// state (the Prometheus collector).
func (c *Reconciler) Autoscaler(visit func(name string, desired int, panicking bool)) {
	for name, fs := range c.fns {
		visit(name, fs.desired, fs.panicking)
	}
}

func (fs *fnState) status(sandboxes bool) api.FunctionStatus {
	st := api.FunctionStatus{Desired: fs.desired, LastFailure: fs.lastFailure, Failures: fs.failures, Condition: fs.cond.reason, Message: fs.cond.message}
	if sandboxes {
		st.Sandboxes = []api.SandboxStatus{}
	}
	for _, r := range fs.sandboxes {
		switch r.state {
		case sbReady:
			st.Ready++
		case sbTombstoned:
			st.Terminating++
		default:
			st.Pending++
		}
		if sandboxes {
			st.Sandboxes = append(st.Sandboxes, api.SandboxStatus{ID: r.id, Node: r.node.id, State: r.state.String(), Address: r.addr, Revision: r.rev})
		}
	}
	sort.Slice(st.Sandboxes, func(i, j int) bool { return st.Sandboxes[i].ID < st.Sandboxes[j].ID })
	return st
}

// NodeStatus is every node as the table sees it at now.
func (c *Reconciler) NodeStatus(now time.Time) []api.NodeStatus {
	out := make([]api.NodeStatus, 0, len(c.nodeList))
	for _, n := range c.nodeList {
		p := c.place[n.idx]
		ns := api.NodeStatus{ID: n.id, Address: n.rec.Address, Runtime: n.rec.Runtime, Connected: n.up,
			Drain: n.rec.Drain, Sandboxes: len(n.sandboxes), Capacity: n.rec.Capacity,
			Requested: spec.Resources{MilliCPU: p.Requested.MilliCPU, MemoryMB: p.Requested.MemoryMB}, HeartbeatMs: -1}
		if !n.lastHeartbeat.IsZero() {
			ns.HeartbeatMs = now.Sub(n.lastHeartbeat).Milliseconds()
		}
		if hb := n.heartbeat; hb != nil {
			ns.Used = hb.Used
			ns.Templates = spec.Resources{MemoryMB: hb.Templates.MemoryMB}
			if em := hb.Emergency; em.Slots > 0 {
				ns.Emergency = &api.EmergencyStatus{Slots: em.Slots, InUse: em.InUse, Started: em.Started, Failed: em.Failed,
					MemoryMBSeconds: em.MemoryMBSeconds}
			}
		}
		out = append(out, ns)
	}
	return out
}

// Snapshot is the full endpoint state a data plane starts from: every
// function, its condition, every routable sandbox and the emergency
// workers (Auth is the owner's to fill in).
func (c *Reconciler) Snapshot() Snapshot {
	var snap Snapshot
	for _, fs := range c.order {
		snap.Functions = append(snap.Functions, c.Publish(fs.spec))
		if fs.cond.reason != "" {
			snap.Conditions = append(snap.Conditions, fs.conditionOut())
		}
		for _, r := range fs.sandboxes {
			if r.state == sbReady && !r.withdrawn {
				snap.Endpoints = append(snap.Endpoints, endpointOf(r))
			}
		}
	}
	snap.EmergencyWorkers = c.EmergencyWorkers()
	return snap
}

// ---------------------------------------------------------------- quotas

// Namespaces' quotas at scheduling time: what a namespace's sandboxes hold
// is counted as they are placed, adopted and dropped, and a function whose
// next sandbox would pass its namespace's quota gets none (its condition
// says quota-exceeded). Quotas on the number of functions and on one
// function's scale are checked by the admin API.

type nsUsage struct {
	sandboxes          int
	milliCPU, memoryMB int64
}

func (c *Reconciler) setQuotas(now time.Time, q map[string]spec.Quota) {
	c.quotas = q
	for _, fs := range c.order {
		c.boundDesired(fs)
		c.reconcile(now, fs)
	}
}

// Quota is namespace ns's quota; false if ns has none (it does not exist,
// or it is the default namespace with no quota set).
func (c *Reconciler) Quota(ns string) (spec.Quota, bool) {
	q, ok := c.quotas[ns]
	return q, ok
}

// charge counts r's resources to its function's namespace (sign 1) or
// gives them back (-1).
func (c *Reconciler) charge(r *sandboxRec, sign int) {
	ns := NamespaceOf(r.fn.spec)
	u := c.nsUse[ns]
	if u == nil {
		u = &nsUsage{}
		c.nsUse[ns] = u
	}
	u.sandboxes += sign
	u.milliCPU += int64(sign) * r.milliCPU
	u.memoryMB += int64(sign) * r.memoryMB
}

// quotaRoom says why fs's namespace has no room for one more of its
// sandboxes ("": it has).
func (c *Reconciler) quotaRoom(fs *fnState) string {
	ns := NamespaceOf(fs.spec)
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

// maxScale is the most sandboxes fs may have: the operator's cap and its
// namespace's max_scale.
func (c *Reconciler) maxScale(fs *fnState) int {
	m := c.cfg.MaxScale
	if q, ok := c.quotas[NamespaceOf(fs.spec)]; ok && q.MaxScale > 0 && (m == 0 || q.MaxScale < m) {
		m = q.MaxScale
	}
	return m
}

// NamespaceOf is f's namespace (records stored before namespaces existed
// have none: the default one).
func NamespaceOf(f *spec.Function) string { return spec.NamespaceOf(f) }

// Usage is what namespace ns holds now.
func (c *Reconciler) Usage(ns string) api.NamespaceUsage {
	var out api.NamespaceUsage
	for _, fs := range c.fns {
		if NamespaceOf(fs.spec) == ns {
			out.Functions++
		}
	}
	if u := c.nsUse[ns]; u != nil {
		out.Sandboxes, out.MilliCPU, out.MemoryMB = u.sandboxes, u.milliCPU, u.memoryMB
	}
	return out
}

// NodeCounts is how many sandboxes the table holds for node and how many
// ids it keeps marked invalid there (tests of the handshake read them).
func (c *Reconciler) NodeCounts(node string) (sandboxes, invalid int) {
	if n := c.nodes[node]; n != nil {
		return len(n.sandboxes), len(n.invalid)
	}
	return 0, 0
}

// Invalid reports whether the table holds id as invalid on node.
func (c *Reconciler) Invalid(node, id string) bool {
	if n := c.nodes[node]; n != nil {
		_, ok := n.invalid[id]
		return ok
	}
	return false
}

// Conditions calls visit for every function with a condition (the
// Prometheus collector).
func (c *Reconciler) Conditions(visit func(name, reason string)) {
	for name, fs := range c.fns {
		if fs.cond.reason != "" {
			visit(name, fs.cond.reason)
		}
	}
}

package controlplane

import (
	"time"

	"google.golang.org/grpc"

	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/policy/prewarm"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The cluster's read side, for the admin surface (admin.Cluster): each
// method takes the cluster lock for one consistent read, so that the admin
// API never holds it (nor reads the reconciler) itself.

// Now is the cluster's clock.
func (c *Cluster) Now() time.Time { return c.clk.Now() }

// Dash is the dashboard's call counts, which the cluster feeds.
func (c *Cluster) Dash() *admin.DashStats { return c.dash }

// Quota is namespace ns's quota; false when the namespace does not exist.
func (c *Cluster) Quota(ns string) (spec.Quota, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.Quota(ns)
}

// FunctionView is function name's spec and status, its traffic split's
// targets resolved; false when there is no such function.
func (c *Cluster) FunctionView(name string) (api.FunctionView, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.r.FunctionStatus(name)
	if !ok {
		return api.FunctionView{}, false
	}
	v := api.FunctionView{Function: c.r.Spec(name), Status: st}
	v.Status.Traffic = c.trafficStatusLocked(v.Function)
	return v, true
}

// EachFunction calls visit with every function and its status, under the
// cluster lock: visit must be quick and must not call the cluster.
func (c *Cluster) EachFunction(visit func(*spec.Function, api.FunctionStatus)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.r.Functions(visit)
}

// WatchedDataPlanes is the ids of the data planes with an endpoint stream
// open.
func (c *Cluster) WatchedDataPlanes() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.watchers))
	for w := range c.watchers {
		out[w.dpID] = true
	}
	return out
}

// WorkerConns is the gRPC connection of every node with a live link, by
// node id.
func (c *Cluster) WorkerConns() map[string]*grpc.ClientConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*grpc.ClientConn{}
	for _, id := range c.r.NodeIDs() {
		n := c.links[id]
		if n == nil || n.sess == nil {
			continue
		}
		if conn := n.conn.Load(); conn != nil {
			out[id] = conn
		}
	}
	return out
}

// TableState is the table as the dashboard shows it, copied out in one
// read: no map is built under the lock, since placements wait for it.
func (c *Cluster) TableState(now time.Time) (nodes []api.NodeStatus, fns []admin.DashRow, sbxs []admin.DashSandbox, dataPlanes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes = c.r.NodeStatus(now)
	c.r.Functions(func(f *spec.Function, st api.FunctionStatus) { fns = append(fns, admin.DashRow{Spec: f, Status: st}) })
	c.r.Sandboxes(func(fn, node, state string) {
		sbxs = append(sbxs, admin.DashSandbox{Function: fn, Node: node, State: state})
	})
	return nodes, fns, sbxs, len(c.watchers)
}

// trafficStatus reports each target of f's split with the function that
// serves it and its sandboxes; the caller holds c.mu.
func (c *Cluster) trafficStatusLocked(f *spec.Function) []api.TrafficStatus {
	var out []api.TrafficStatus
	for _, t := range f.Traffic {
		fn := f.TrafficFunction(t)
		ts := api.TrafficStatus{TrafficTarget: t, Function: fn, ServedRevision: f.Revision, ServedGeneration: f.Generation}
		if st, ok := c.r.FunctionStatus(fn); ok {
			ts.Ready, ts.Desired = st.Ready, st.Desired
			if fn != f.Name {
				ts.ServedRevision, ts.ServedGeneration = t.Revision, t.Generation
			}
		} else {
			ts.Function, ts.Missing = f.Name, true // served by the current revision
		}
		out = append(out, ts)
	}
	return out
}

// SetPrewarmSchedules gives the forecaster each function's cron
// schedules (none: it has no cron trigger any more).
func (c *Cluster) SetPrewarmSchedules(scheds map[string][]prewarm.Ticks) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for fn, s := range scheds {
		c.prewarm.SetSchedules(fn, s)
	}
}

package containerd

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/errdefs"

	"github.com/brisk-faas/brisk/internal/worker/netpool"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
)

// held records, per pool, the endpoints this process took for sandboxes and
// has not released, by name: a Runtime restarted in this process on the
// same Pool finds its predecessor's leases here. A restarted worker process
// has a new Pool, which adopts the endpoints by name before it starts (see
// adoptOrKill).
var held sync.Map // *netpool.Pool → *sync.Map (endpoint name → *netpool.Endpoint)

func (r *Runtime) take(ctx context.Context) (*netpool.Endpoint, error) {
	ep, err := r.cfg.Pool.Take(ctx)
	if err == nil {
		m, _ := held.LoadOrStore(r.cfg.Pool, &sync.Map{})
		m.(*sync.Map).Store(ep.Name, ep)
	}
	return ep, err
}

func (r *Runtime) release(ep *netpool.Endpoint) {
	if m, ok := held.Load(r.cfg.Pool); ok {
		m.(*sync.Map).CompareAndDelete(ep.Name, ep)
	}
	r.cfg.Pool.Release(ep)
}

func (r *Runtime) heldEndpoint(name string) *netpool.Endpoint {
	m, ok := held.Load(r.cfg.Pool)
	if !ok {
		return nil
	}
	ep, _ := m.(*sync.Map).Load(name)
	ep2, _ := ep.(*netpool.Endpoint)
	return ep2
}

// adoptOrKill takes over the containers an earlier Runtime on this StateDir
// left. A running one is adopted when its network endpoint is still leased
// by this process's Pool (a Runtime restarted in this process) or can be
// adopted by a Pool that has not started yet (a restarted worker process):
// it keeps its address and is watched for exit like one Create made. Every
// other one is torn down: its task, container and snapshot are deleted, and
// its network namespace is left to the Pool, whose Start reaps namespaces of
// an earlier worker process — so a worker must build its Runtime (this)
// before it starts its Pool.
func (r *Runtime) adoptOrKill(ctx context.Context) error {
	ctx = r.ns(ctx)
	cs, err := r.client.Containers(ctx, ownedFilter(r.cfg.StateDir))
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	for _, c := range cs {
		l, err := c.Labels(ctx)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("container %s: %w", c.ID(), err)
		}
		rev, _ := strconv.ParseUint(l[LabelRevision], 10, 64)
		sb := &sandbox{id: c.ID(), function: l[LabelFunction], revision: rev, addr: addrFromLabels(l),
			container: c, cgroup: "/" + r.cfg.Namespace + "/" + c.ID(), lock: make(chan struct{}, 1),
			secrets: true} // whether it has a secrets directory or not: removing none costs nothing here
		sb.ep = r.heldEndpoint(l[LabelNetNS])
		sb.released = sb.ep == nil // not ours to release: the Pool reaps it
		if s, err := c.Spec(ctx); err == nil && s.Linux != nil && s.Linux.Resources != nil &&
			s.Linux.Resources.Memory != nil && s.Linux.Resources.Memory.Limit != nil {
			sb.memMB = *s.Linux.Resources.Memory.Limit >> 20
		}
		task, err := c.Task(ctx, nil)
		switch {
		case errdefs.IsNotFound(err):
			sb.taskDeleted = true
		case err != nil:
			return fmt.Errorf("container %s: task: %w", c.ID(), err)
		default:
			sb.task = task
			statusC, err := task.Wait(r.bg)
			if err != nil {
				return fmt.Errorf("container %s: task wait: %w", c.ID(), err)
			}
			sb.exited = make(chan struct{})
			go r.waitExit(sb, statusC)
		}
		running := false
		if sb.task != nil {
			st, err := sb.task.Status(ctx)
			running = err == nil && st.Status == containerd.Running
		}
		if running && sb.ep == nil {
			// Left by an earlier worker process: its pool's endpoint is
			// taken over, unless this pool has started (and reaped it).
			if ep, err := r.cfg.Pool.Adopt(l[LabelNetNS]); err == nil && ep.IP.String() == l[labelIP] {
				sb.ep, sb.released = ep, false
				m, _ := held.LoadOrStore(r.cfg.Pool, &sync.Map{})
				m.(*sync.Map).Store(ep.Name, ep)
			} else if err == nil {
				r.cfg.Pool.Release(ep) // another address: the subnet changed; torn down below
			} else {
				r.log.Debug("cannot adopt the network of a sandbox left by an earlier worker", "sandbox", sb.id, "err", err)
			}
		}
		if running && sb.ep != nil {
			if err := logpipe.Adopt(filepath.Join(r.LogDir(), sb.function, sb.id+".log"), logpipe.Default, r.log); err != nil {
				r.log.Warn("adopted sandbox's output is not drained: it blocks once its pipe is full", "sandbox", sb.id, "err", err)
			}
			r.mu.Lock()
			r.sandboxes[sb.id] = sb
			r.mu.Unlock()
			r.log.Info("adopted running sandbox", "sandbox", sb.id, "function", sb.function, "addr", sb.addr)
			continue
		}
		if err := r.teardown(ctx, sb); err != nil {
			return fmt.Errorf("tearing down sandbox %s left by an earlier worker: %w", sb.id, err)
		}
		r.log.Info("removed sandbox left by an earlier worker", "sandbox", sb.id, "function", sb.function, "was_running", running)
	}
	return nil
}

package controlplane

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/policy/prewarm"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Cluster owns the control plane's reconciler (internal/controlplane/reconciler):
// it steps it with events from workers, data planes and the admin API, under
// one mutex, and carries out the commands it returns: session commands to
// workers, endpoint deltas to data planes, timers, durable writes. Nothing
// under the mutex blocks: sessions and watchers are outboxes that their own
// goroutines flush.
type Cluster struct {
	mu  sync.Mutex
	clk clock.Clock
	log *slog.Logger
	cfg Config
	r   *reconciler.Reconciler
	// prewarm is the reconciler's Predictor: the cron triggers' ticks,
	// updated under mu (admin/triggers.go, SetPrewarmSchedules).
	prewarm *prewarm.Cron

	links    map[string]*nodeLink
	watchers map[*watcher]struct{}
	// auth is what data planes need to check calls' tokens (SetAuth); nil
	// until the control plane has loaded its tokens.
	auth  *briskv1.AuthConfig
	store store.Registry
	// secrets are the registry's secrets by namespace/name (clustersecrets.go);
	// secretGen changes with them, so that a link sends a spec again when
	// the values it carried are stale.
	secrets   map[string]*store.Secret
	secretGen uint64
	// egress is every namespace's egress policy, as each worker session
	// gets it first and again on every change (setEgress).
	egress *briskv1.EgressPolicies

	idPrefix string
	// placementFailures is the reconciler's count last exported.
	placementFailures, evictions uint64

	metrics *cpMetrics
	// dash keeps the dashboard's rates and recent failures (the admin
	// surface's dashboard shows them).
	dash *admin.DashStats
}

// nodeLink is the I/O side of one worker node: its link's connection and
// live session (the reconciler keeps the node's state).
type nodeLink struct {
	id string
	// conn is the link's gRPC connection to the worker (nil while none),
	// for calls beside the session: logs.
	conn    atomic.Pointer[grpc.ClientConn]
	sess    *session
	managed bool // a link goroutine runs for it
}

func newCluster(cfg Config, m *cpMetrics) (*Cluster, error) {
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	prefix := hex.EncodeToString(seed[:6])
	// Cron triggers' ticks are known: their functions are pre-warmed one
	// cold start, and the autoscaler's period, before each (admin/triggers.go).
	pw := prewarm.NewCron(2*cfg.TickInterval, 2*cfg.TickInterval+5*time.Second)
	r, err := reconciler.New(reconciler.Config{Predictor: pw,
		Autoscale: cfg.Autoscale, TargetUtilization: cfg.TargetUtilization, ScalingMode: cfg.ScalingMode,
		Placement: cfg.Placement, KeepAlivePolicy: cfg.KeepAlivePolicy, LoadBalancing: cfg.LoadBalancing, TemplateFraction: cfg.TemplateFraction, MaxScale: cfg.Caps.MaxScale, DrainDelay: max(cfg.DrainDelay, 0), NodeGrace: cfg.NodeGrace,
		FailureBackoff: cfg.FailureBackoff, MaxFailureBackoff: cfg.MaxFailureBackoff,
		Seed: binary.LittleEndian.Uint64(seed[:]), IDPrefix: prefix, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		clk: clock.Or(cfg.Clock), log: cfg.Logger, cfg: cfg, r: r,
		links: make(map[string]*nodeLink), watchers: make(map[*watcher]struct{}),
		idPrefix: prefix, metrics: m, prewarm: pw,
	}
	c.dash = admin.NewDashStats(c.clk.Now())
	if err := m.reg.Register(newFunctionCollector(c)); err != nil {
		return nil, err
	}
	return c, nil
}

// stepLocked steps the reconciler with ev now and carries out its commands.
func (c *Cluster) stepLocked(ev reconciler.Event) {
	c.execLocked(c.r.Step(c.clk.Now(), ev))
}

// step is stepLocked under the lock.
func (c *Cluster) step(ev reconciler.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stepLocked(ev)
}

func (c *Cluster) execLocked(cmds []reconciler.Command) {
	for _, cmd := range cmds {
		switch x := cmd.(type) {
		case reconciler.Create:
			if s := c.sessionOf(x.Node); s != nil {
				data, gen := c.secretDataLocked(x.Spec)
				s.create(x.Spec, x.ID, data, gen)
			}
			c.metrics.creations.Inc()
			c.dash.Created(c.clk.Now(), x.Spec.Name)
		case reconciler.Offer:
			if s := c.sessionOf(x.Node); s != nil {
				data, gen := c.secretDataLocked(x.Spec)
				s.offer(x.Spec, data, gen)
			}
		case reconciler.Tombstone:
			if s := c.sessionOf(x.Node); s != nil {
				if x.After > 0 {
					// On the cluster's clock, as every delay: the data
					// planes withdraw the endpoint first.
					ch := c.clk.After(x.After)
					go func() {
						<-ch
						s.tombstone(x.ID)
					}()
				} else {
					s.tombstone(x.ID)
				}
			}
		case reconciler.Verify:
			if s := c.sessionOf(x.Node); s != nil {
				s.verifySandbox(x.ID)
			}
		case reconciler.AddEndpoint:
			ep := endpointPB(x.Endpoint)
			c.publishLocked(func(b *briskv1.EndpointBatch) { b.Added = append(b.Added, ep) })
			if after := x.Endpoint.ReadyAfter; after > 0 {
				c.prewarm.ObserveColdStart(x.Endpoint.Function, after)
				c.metrics.readyLatency.Observe(after.Seconds())
				c.observeStartPhases(x.Endpoint)
			}
		case reconciler.RemoveEndpoint:
			c.publishRemoveLocked(x.ID)
		case reconciler.PublishFunction:
			pf := specPB(x.Function)
			c.dash.Register(pf.GetName())
			c.publishLocked(func(b *briskv1.EndpointBatch) {
				b.DeletedFunctions = without(b.DeletedFunctions, pf.GetName())
				b.Functions = append(withoutFn(b.Functions, pf.GetName()), pf)
			})
		case reconciler.DeleteFunction:
			name := x.Name
			c.dash.Forget(name)
			c.publishLocked(func(b *briskv1.EndpointBatch) {
				b.Functions = withoutFn(b.Functions, name)
				b.DeletedFunctions = append(without(b.DeletedFunctions, name), name)
			})
		case reconciler.SetCondition:
			pc := conditionPB(x.Condition)
			c.dash.Condition(c.clk.Now(), pc.GetFunction(), pc.GetReason(), pc.GetMessage())
			c.publishLocked(func(b *briskv1.EndpointBatch) {
				for i, old := range b.Conditions {
					if old.GetFunction() == pc.GetFunction() {
						b.Conditions[i] = pc
						return
					}
				}
				b.Conditions = append(b.Conditions, pc)
			})
		case reconciler.SetEmergencyWorkers:
			list := emergencyWorkersPB(x.Workers)
			c.publishLocked(func(b *briskv1.EndpointBatch) { b.EmergencyWorkers, b.EmergencySet = list, true })
		case reconciler.RetryAt:
			c.armRetry(x.Function, x.At.Sub(c.clk.Now()))
		case reconciler.PersistWorker:
			c.persistWorker(x.Worker)
		case reconciler.SandboxFailed:
			c.metrics.sandboxFailures.WithLabelValues(x.Function).Inc()
			c.dash.Failed(c.clk.Now(), x)
			c.log.Warn("sandbox failed", "function", x.Function, "sandbox", x.ID, "state", x.State, "reason", x.Reason, "backoff", x.Backoff)
		}
	}
	if pf := c.r.Stats().PlacementFailures; pf != c.placementFailures {
		c.metrics.placementFailures.Add(float64(pf - c.placementFailures))
		c.placementFailures = pf
	}
	if ev := c.r.Stats().Evictions; ev != c.evictions {
		c.metrics.evictions.Add(float64(ev - c.evictions))
		c.evictions = ev
	}
}

func (c *Cluster) sessionOf(node string) *session {
	if l := c.links[node]; l != nil {
		return l.sess
	}
	return nil
}

// armRetry steps a Retry for fn after d on the cluster's clock.
func (c *Cluster) armRetry(fn string, d time.Duration) {
	ch := c.clk.After(max(d, 0))
	go func() {
		<-ch
		c.step(reconciler.Retry{Function: fn})
	}()
}

// persistWorker writes a node's record (its drain mark) durably, off the
// caller's lock.
func (c *Cluster) persistWorker(w store.Worker) {
	go func() {
		if err := c.store.PutWorker(&w); err != nil {
			c.log.Error("persisting drain mark", "node", w.ID, "err", err)
		}
	}()
}

// ---------------------------------------------------------------- events

func (c *Cluster) UpsertFunction(f *spec.Function) { c.step(reconciler.UpsertFunction{Spec: f}) }

func (c *Cluster) RemoveFunction(name string) { c.step(reconciler.RemoveFunction{Name: name}) }

func (c *Cluster) recordMetrics(r *briskv1.MetricsReport) {
	c.dash.Report(c.clk.Now(), r) // its own lock, not the cluster's
	c.step(reconciler.Metrics{Report: loadFromPB(r)})
}

func (c *Cluster) sampleLoad() { c.step(reconciler.SampleLoad{}) }

func (c *Cluster) SetQuotas(q map[string]spec.Quota) { c.step(reconciler.SetQuotas{Quotas: q}) }

// SetEgress makes e the namespaces' egress policies and sends them to every
// connected worker when they changed; they apply to running sandboxes too.
func (c *Cluster) SetEgress(e *briskv1.EgressPolicies) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.egress != nil && proto.Equal(c.egress, e) {
		return
	}
	c.egress = e
	for _, l := range c.links {
		if l.sess != nil {
			l.sess.setEgress(e)
		}
	}
}

func (c *Cluster) reportUnreachable(rep *briskv1.UnreachableReport) {
	c.step(reconciler.Unreachable{Report: unreachableFromPB(rep)})
}

// tickChunk bounds how many functions one tick handles per hold of the
// cluster lock: a tick over 10,000 functions held it for tens of
// milliseconds at once, and every cold start waiting for the lock then (the
// urgent report, the Ready update) took that long longer (the cold-start
// p99 of bench cold came from these stalls, every 2 s).
const tickChunk = 128

// tick runs one autoscaling round over every function, then the node checks.
func (c *Cluster) tick() {
	c.mu.Lock()
	names := c.r.FunctionNames()
	c.mu.Unlock()
	for i := 0; i < len(names); i += tickChunk {
		c.step(reconciler.Tick{Functions: names[i:min(i+tickChunk, len(names))]})
		// Let waiting reports and worker updates in: a mutex released and
		// taken again at once stays with its holder (Go mutexes hand over
		// only to waiters starved for 1 ms), so without this the chunks ran
		// back to back and cold starts waited out the whole tick.
		runtime.Gosched()
	}
	c.step(reconciler.CheckNodes{})
}

// registerNode creates or refreshes a node from its durable record.
func (c *Cluster) registerNode(w *store.Worker) (l *nodeLink, startLink bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stepLocked(reconciler.RegisterNode{Worker: w})
	l = c.links[w.ID]
	if l == nil {
		l = &nodeLink{id: w.ID}
		c.links[w.ID] = l
	}
	startLink = !l.managed
	l.managed = true
	return l, startLink
}

// ---------------------------------------------------------------- queries

func (c *Cluster) functionStatus(name string) (api.FunctionStatus, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.FunctionStatus(name)
}

func (c *Cluster) NodeStatus() []api.NodeStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.NodeStatus(c.clk.Now())
}

func (c *Cluster) Spec(name string) *spec.Function {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.Spec(name)
}

func (c *Cluster) Usage(ns string) api.NamespaceUsage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.Usage(ns)
}

func without(list []string, s string) []string {
	out := list[:0]
	for _, v := range list {
		if v != s {
			out = append(out, v)
		}
	}
	return out
}

func withoutFn(list []*briskv1.FunctionSpec, name string) []*briskv1.FunctionSpec {
	out := list[:0]
	for _, v := range list {
		if v.GetName() != name {
			out = append(out, v)
		}
	}
	return out
}

// namespaceOf is f's namespace.
func namespaceOf(f *spec.Function) string { return reconciler.NamespaceOf(f) }

// observeStartPhases splits a sandbox start into the phases the worker
// measured and the rest (brisk_controlplane_cold_start_phase_seconds).
func (c *Cluster) observeStartPhases(ep reconciler.Endpoint) {
	start, create := ep.Start, ep.Create
	if create <= 0 || start < 0 || start > create {
		return // a worker that does not report them
	}
	c.metrics.startPhases.WithLabelValues("creation").Observe(start.Seconds())
	c.metrics.startPhases.WithLabelValues("readiness").Observe((create - start).Seconds())
	if link := ep.ReadyAfter - create; link >= 0 {
		c.metrics.startPhases.WithLabelValues("link").Observe(link.Seconds())
	}
}

// Package reconciler is the control plane's decision core: the sandbox
// table, the autoscalers, placement, the worker handshake fold, node checks
// and the endpoint deltas for data planes, as one deterministic value.
//
// Like etcd's raft, it does no I/O and reads no clock: every input is an
// Event stepped with the time it happened, and every effect is a Command
// returned to the caller (send a Create to a worker, publish an endpoint,
// wake me at t). The control plane owns one Reconciler behind one mutex and
// carries its commands out; the simulator (internal/sim) steps the very
// same value on a virtual clock; table tests step it with no network.
package reconciler

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/policy/keepalive"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config is what the reconciler decides with.
type Config struct {
	// Autoscale holds the cluster-wide KPA defaults; functions override them.
	Autoscale         autoscale.Config
	TargetUtilization float64
	ScalingMode       string // default for specs that name none
	Placement         string // cluster placement policy ("" = kubernetes)
	KeepAlivePolicy   string // default for specs that name none ("" = gd)
	LoadBalancing     string // default for specs that name none ("" = the data plane's, least-loaded)
	// Predictor, when set, forecasts each function's concurrency at every
	// decision; a forecast can only raise the KPA's scale (pre-warming).
	Predictor autoscale.Predictor
	MaxScale  int // the operator's cap on one function's scale (0 = none)
	// TemplateFraction is the fraction of the live nodes that make each
	// function from source's template at deploy (templateset); 0 means
	// every node. Placement's locality prefers the nodes that hold one.
	TemplateFraction  float64
	DrainDelay        time.Duration
	NodeGrace         time.Duration
	FailureBackoff    time.Duration
	MaxFailureBackoff time.Duration
	// Seed makes placement's random choices repeatable (the simulator and
	// tests); IDPrefix prefixes sandbox ids, which must never repeat across
	// the control plane's lifetimes (the control plane draws it at random).
	Seed     uint64
	IDPrefix string
	Logger   *slog.Logger
}

// Reconciler is the control plane's state. It is not safe for concurrent
// use: its owner serialises Steps and queries.
type Reconciler struct {
	cfg Config
	log *slog.Logger

	fns map[string]*fnState
	// minStarved counts the functions below their scaling.min for want
	// of room (fnState.minStarved).
	minStarved int
	order      []*fnState // fns in a fixed order: commands come out the same on every run
	nodes      map[string]*nodeState
	nodeList   []*nodeState
	place      []placement.Node // parallel to nodeList
	placer     placement.Policy
	placers    map[string]placement.Policy // per-function overrides, by policy name
	rng        *rand.Rand
	// keep orders idle sandboxes for eviction.
	keep keepalive.Policy
	// hybrid learns the idle times of hybrid keep-alive functions.
	hybrid *keepalive.Hybrid

	quotas map[string]spec.Quota
	nsUse  map[string]*nsUsage
	// paused holds placement after a restart until workers have reported
	// what they run.
	paused bool

	idSeq        uint64
	emergencyKey string
	stats        Stats

	// draining: sandboxes withdrawn to be killed, waiting for their calls
	// to end (drainDue), in withdrawal order; drainWake: the wake-up asked
	// for the next drain delay's end.
	draining  []*sandboxRec
	drainWake time.Time
	// loaded: the functions with data planes' reports, which sampleLoad
	// visits (fnState.loaded marks them).
	loaded []*fnState
	// names holds each function's name at its position in order.
	names []string

	out []Command
}

// Stats are counters since the reconciler was made (Prometheus reads them).
type Stats struct {
	Creations         uint64
	PlacementFailures uint64
	Evictions         uint64 // idle sandboxes removed to make room (gd)
}

// New returns an empty reconciler. Paused says whether to hold placement
// until every registered worker has answered (a restart with known workers).
func New(cfg Config) (*Reconciler, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ScalingMode == "" {
		cfg.ScalingMode = spec.ModeAsync
	}
	if !slices.Contains(spec.ScalingModes, cfg.ScalingMode) {
		return nil, fmt.Errorf("scaling mode %q: want one of %v", cfg.ScalingMode, spec.ScalingModes)
	}
	if cfg.KeepAlivePolicy == "" {
		cfg.KeepAlivePolicy = spec.KeepAliveGD
	}
	if !slices.Contains(spec.KeepAlivePolicies, cfg.KeepAlivePolicy) {
		return nil, fmt.Errorf("keep-alive policy %q: want one of %v", cfg.KeepAlivePolicy, spec.KeepAlivePolicies)
	}
	if cfg.LoadBalancing != "" && !slices.Contains(spec.LoadBalancers, cfg.LoadBalancing) {
		return nil, fmt.Errorf("load balancing %q: want one of %v", cfg.LoadBalancing, spec.LoadBalancers)
	}
	if cfg.TargetUtilization <= 0 {
		cfg.TargetUtilization = 1
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	p, err := placement.New(cfg.Placement, rng)
	if err != nil {
		return nil, err
	}
	return &Reconciler{
		cfg: cfg, log: cfg.Logger, rng: rng,
		fns: make(map[string]*fnState), nodes: make(map[string]*nodeState), nsUse: make(map[string]*nsUsage),
		placer: p, placers: make(map[string]placement.Policy), keep: keepalive.NewGD(0), hybrid: keepalive.NewHybrid(keepalive.HybridConfig{}),
	}, nil
}

// Stats returns the counters.
func (c *Reconciler) Stats() Stats { return c.stats }

// Paused reports whether placement waits for workers (after a restart).
func (c *Reconciler) Paused() bool { return c.paused }

// Pause holds placement until every registered worker has answered or a
// Resume event comes: a restarted control plane must not place duplicates
// of sandboxes its workers are about to report.
func (c *Reconciler) Pause() { c.paused = true }

func (c *Reconciler) newID() string {
	c.idSeq++
	return c.cfg.IDPrefix + "-" + strconv.FormatUint(c.idSeq, 36)
}

func (c *Reconciler) emit(cmd Command) { c.out = append(c.out, cmd) }

// sortedRecs lists m's records by id: loops that emit commands must not
// follow Go's random map order.
func sortedRecs(m map[string]*sandboxRec) []*sandboxRec {
	out := make([]*sandboxRec, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *sandboxRec) int { return strings.Compare(a.id, b.id) })
	return out
}

// Step applies one event that happened at now and returns the commands it
// caused, in order. The slice is reused by the next Step: consume it first.
func (c *Reconciler) Step(now time.Time, ev Event) []Command {
	c.out = c.out[:0]
	switch e := ev.(type) {
	case UpsertFunction:
		c.upsertFunction(now, e.Spec)
	case RemoveFunction:
		c.removeFunction(now, e.Name)
	case Metrics:
		c.recordMetrics(now, &e.Report)
	case SampleLoad:
		c.sampleLoad(now)
	case Tick:
		c.tick(now, e.Functions)
	case CheckNodes:
		c.checkNodes(now)
	case RegisterNode:
		c.registerNode(e.Worker)
	case SessionUp:
		c.sessionUp(now, e)
	case SessionDown:
		c.sessionDown(now, e.Node, e.Withdraw)
	case WorkerUpdates:
		if n := c.nodes[e.Node]; n != nil && n.up {
			c.applyUpdates(now, n, &e.Updates)
		}
	case Unreachable:
		c.reportUnreachable(now, &e.Report)
	case SetQuotas:
		c.setQuotas(now, e.Quotas)
	case Retry:
		if fs := c.fns[e.Function]; fs != nil {
			fs.retryArmed = false
			c.reconcile(now, fs)
		}
	case ScaleTo:
		if fs := c.fns[e.Function]; fs != nil {
			fs.desired = e.Desired
			c.boundDesired(fs)
			c.reconcile(now, fs)
		}
	case Resume:
		c.resume(now, e.Why)
	case FenceSilent:
		c.fenceSilent(now)
	default:
		panic(fmt.Sprintf("reconciler: unknown event %T", ev))
	}
	if len(c.draining) > 0 {
		c.drainDue(now)
	}
	return c.out
}

// ---------------------------------------------------------------- events

// Event is an input to Step.
type Event interface{ event() }

// UpsertFunction installs a new or updated function (already durable).
type UpsertFunction struct{ Spec *spec.Function }

// RemoveFunction tombstones every sandbox of a deleted function.
type RemoveFunction struct{ Name string }

// Metrics is one data plane's load report; an urgent one (a request waits
// with no capacity) scales at once.
type Metrics struct{ Report LoadReport }

// SampleLoad records each function's load, summed over data planes, into
// its autoscaler: exactly once a second.
type SampleLoad struct{}

// Tick runs one autoscaling round over Functions (nil: every function).
type Tick struct{ Functions []string }

// CheckNodes fences nodes whose link has been down past NodeGrace and
// replaces their sandboxes.
type CheckNodes struct{}

// RegisterNode creates or refreshes a node from its durable record.
type RegisterNode struct{ Worker *nodes.Worker }

// SessionUp folds a worker's handshake: Versions lists every sandbox it
// holds, Records are the full records fetched (all of them in recover mode,
// the differing ones in reset mode), Early are updates that came during the
// handshake, Rebooted says the worker daemon restarted since the last
// session.
type SessionUp struct {
	Node     string
	Versions []Version
	Records  []Record
	BootID   string
	Rebooted bool
	// Drained says the Hello asked the worker to drain (it killed every
	// sandbox before answering): the node takes work again.
	Drained bool
	Early   []Updates
}

// SessionDown marks a node's link down; Withdraw takes its sandboxes out
// of load balancing (not when the control plane itself is stopping).
type SessionDown struct {
	Node     string
	Withdraw bool
}

// WorkerUpdates is one batch of a live session: records and a heartbeat.
type WorkerUpdates struct {
	Node    string
	Updates Updates
}

// Unreachable is a data plane's report of sandboxes it could not reach.
type Unreachable struct{ Report UnreachableReport }

// SetQuotas replaces the namespaces' quotas.
type SetQuotas struct{ Quotas map[string]spec.Quota }

// Retry is the wake-up a RetryAt command asked for (no function: the end
// of a drain delay).
type Retry struct{ Function string }

// ScaleTo sets a function's desired scale now (within its bounds); the
// autoscaler decides again at its next tick.
type ScaleTo struct {
	Function string
	Desired  int
}

// Resume ends the startup pause.
type Resume struct{ Why string }

// FenceSilent fences every worker that has not answered since the start
// (anomaly #2, docs/reliability.md case 2): PersistWorker commands carry
// the drain marks, which must be durable before a Resume.
type FenceSilent struct{}

func (UpsertFunction) event() {}
func (RemoveFunction) event() {}
func (Metrics) event()        {}
func (SampleLoad) event()     {}
func (Tick) event()           {}
func (CheckNodes) event()     {}
func (RegisterNode) event()   {}
func (SessionUp) event()      {}
func (SessionDown) event()    {}
func (WorkerUpdates) event()  {}
func (Unreachable) event()    {}
func (SetQuotas) event()      {}
func (Retry) event()          {}
func (Resume) event()         {}
func (ScaleTo) event()        {}
func (FenceSilent) event()    {}

// ---------------------------------------------------------------- commands

// Command is an effect for the owner to carry out.
type Command interface{ command() }

// Create asks node to create sandbox ID of Spec.
type Create struct {
	Node, ID string
	Spec     *spec.Function
}

// Offer sends node Spec alone (the dual track serves only offered specs).
type Offer struct {
	Node string
	Spec *spec.Function
}

// Tombstone asks node to terminate sandbox ID, After the drain delay.
type Tombstone struct {
	Node, ID string
	After    time.Duration
}

// Verify asks node to check a sandbox a data plane could not reach.
type Verify struct{ Node, ID string }

// AddEndpoint publishes a ready sandbox to data planes (its ReadyAfter is
// set when it just became ready).
type AddEndpoint struct{ Endpoint Endpoint }

// RemoveEndpoint withdraws a sandbox from data planes.
type RemoveEndpoint struct{ ID string }

// PublishFunction sends data planes a function's (new) spec.
type PublishFunction struct{ Function Published }

// DeleteFunction tells data planes a function is gone.
type DeleteFunction struct{ Name string }

// SetCondition tells data planes why a function lacks sandboxes ("" reason:
// nothing is wrong any more).
type SetCondition struct{ Condition Condition }

// SetEmergencyWorkers sends data planes the workers taking emergency calls.
type SetEmergencyWorkers struct{ Workers []EmergencyWorker }

// RetryAt asks for a Retry event for Function at At (Function empty: a
// wake-up at the end of a drain delay, answered by a Retry of no function).
type RetryAt struct {
	Function string
	At       time.Time
}

// PersistWorker writes a node's record (its drain mark) durably.
type PersistWorker struct{ Worker nodes.Worker }

// SandboxFailed reports a sandbox that failed or exited on its own, and
// the crash-loop backoff it caused.
type SandboxFailed struct {
	Function, ID, Node, State, Reason string
	Backoff                           time.Duration
}

func (Create) command()              {}
func (Offer) command()               {}
func (Tombstone) command()           {}
func (Verify) command()              {}
func (AddEndpoint) command()         {}
func (RemoveEndpoint) command()      {}
func (PublishFunction) command()     {}
func (DeleteFunction) command()      {}
func (SetCondition) command()        {}
func (SetEmergencyWorkers) command() {}
func (RetryAt) command()             {}
func (PersistWorker) command()       {}
func (SandboxFailed) command()       {}

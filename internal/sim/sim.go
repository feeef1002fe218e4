// Package sim is brisk's discrete-event simulator: a virtual clock drives
// the control plane's real reconciler (internal/controlplane/reconciler,
// with its autoscalers and placement policies) against emulated data
// planes and workers, so a policy is judged at 10,000 nodes by the same
// code that runs in the cluster.
//
// The emulation: one data plane per cluster holds each function's queue
// and picks a ready sandbox with a free slot through the data plane's own
// routing table and load-balancing policy (least-loaded by default); it
// reports load every second and at once when a call
// waits with no capacity, as the real data plane does. A worker's cores
// are processor-sharing: with n calls running on c cores each progresses
// at min(1, c/n), so load makes calls slower. A sandbox becomes ready a
// cold-start time after its Create, less where the node already holds the
// function's image, and a few milliseconds where the node holds the
// function's template (template.go). Nothing reads the wall clock: a run
// is a function of the schedule and the config.
package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/dataplane/endpoints"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
	"github.com/brisk-faas/brisk/internal/policy/prewarm"
	"github.com/brisk-faas/brisk/internal/policy/templateset"
	"github.com/brisk-faas/brisk/internal/workload"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config is one simulated cluster.
type Config struct {
	Nodes       int
	NodeCores   float64 // processor-sharing cores per node (default 16)
	NodeMemMB   int64   // memory per node for placement (default 65536)
	NodeMilliCP int64   // allocatable CPU for placement (default NodeCores×1000)
	// ColdStart is a sandbox's creation time where the node has never run
	// the function; CachedColdStart where it has (its image is unpacked).
	ColdStart, CachedColdStart time.Duration
	// Placement, ScalingMode, Autoscale, TargetUtilization, StableWindow
	// and Concurrency are the cluster's (and the functions') settings, as
	// `brisk replay` would deploy them.
	Placement string
	// LoadBalancing is the data plane's choice of sandbox for a call: a
	// policy of internal/policy/loadbalance by name ("": the data plane's
	// default, least-loaded with random ties), run as the data plane runs
	// it: on the data plane's routing table (internal/dataplane/endpoints),
	// a Tracker per endpoint, endpoints in sandbox id order, ties drawn
	// from the run's seed.
	LoadBalancing     string
	ScalingMode       string
	Autoscale         autoscale.Config
	TargetUtilization float64
	StableWindow      time.Duration
	Concurrency       int // per sandbox (default 1, as the trace functions)
	// KeepAlivePolicy (ttl or gd) and KeepAlive are the functions'
	// keep-alive (spec scaling.keep_alive_policy and keep_alive).
	KeepAlivePolicy string
	KeepAlive       time.Duration
	Seed            uint64
	// CallOverhead is added to every call's response time: the warm data
	// path (forwarding, the reply) and the runtime's timing slack, which
	// hold no core. Measure it on the system the run stands for. With more
	// than one value, each call draws one (seeded): a measured
	// distribution rather than its median.
	CallOverhead []time.Duration
	// Overhead, when set, replaces CallOverhead: a call draws its overhead
	// from the calls a real run of the same schedule sent at about the
	// same time. It carries that machine's load over time into the
	// simulation: a minute's first moments, when hundreds of calls and
	// sandbox creations start at once on its cores, cost every call then
	// more than a quiet second does.
	Overhead *OverheadProfile
	// Tick is the autoscaler period (default 2 s, Knative's).
	Tick time.Duration
	// The dual track (ScalingMode dual, PulseNet): a call that finds no
	// free regular sandbox is served at once by a one-shot emergency
	// sandbox on a node with a free one of its EmergencySlots (default two
	// per core, as the native runtime's workers offer), which starts in
	// EmergencyStart (default 10 ms: a native-runtime shell from the pool)
	// and is torn down after the call. It counts toward regular scaling
	// only when the function's keep-alive exceeds the
	// EmergencyPercentile-th (default 50) percentile of its inter-arrival
	// times over the last hour: the data plane's metric filter.
	EmergencySlots      int
	EmergencyStart      time.Duration
	EmergencyPercentile float64
	// Templates (functions deployed from Python source): a node holding a
	// function's template, a pre-initialised interpreter with the function
	// imported, forks a sandbox of it in TemplateStart (default 5 ms)
	// instead of starting one in ColdStart or CachedColdStart; an emergency
	// sandbox there starts in TemplateStart too, instead of
	// EmergencyStart. Each function's template is on
	// templateset.Count(TemplateFraction, Nodes) nodes, chosen by rendezvous
	// hashing of (function, node) (templateset.Nodes). 0: no templates, the
	// model without them; 1: every node holds every function's template.
	// Each node's first heartbeat lists the templates it holds, as a
	// worker's does: the locality placement policy prefers those nodes,
	// the others choose as they would without them (docs/policies.md,
	// "Templates on a fraction of the nodes").
	TemplateFraction float64
	TemplateStart    time.Duration
	// Triggers makes the trace's timer-triggered functions cron triggers
	// (triggers.go): their calls fire at their columns' starts, and,
	// unless NoPrewarm, the reconciler pre-warms them before each tick as
	// the control plane does for cron triggers.
	Triggers, NoPrewarm bool
	// Stop, when set, ends the run early (an interrupted `brisk sim`):
	// Run checks it every 64k events and returns ErrStopped.
	Stop <-chan struct{}
	// OnResult, when set, is called with the result just before Run
	// returns it: for callers that reach Run through a wrapper keeping
	// only a summary (bench.Sim), such as the CLI's template counts.
	OnResult func(*Result)
}

func (c *Config) defaults() {
	if c.Nodes <= 0 {
		c.Nodes = 1
	}
	if c.NodeCores <= 0 {
		c.NodeCores = 16
	}
	if c.NodeMemMB <= 0 {
		c.NodeMemMB = 64 << 10
	}
	if c.NodeMilliCP <= 0 {
		c.NodeMilliCP = int64(c.NodeCores * 1000)
	}
	if c.ColdStart <= 0 {
		c.ColdStart = 40 * time.Millisecond
	}
	if c.CachedColdStart <= 0 || c.CachedColdStart > c.ColdStart {
		c.CachedColdStart = c.ColdStart
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.Tick <= 0 {
		c.Tick = 2 * time.Second
	}
	if c.Autoscale == (autoscale.Config{}) {
		c.Autoscale = autoscale.DefaultConfig()
	}
	if !(c.TemplateFraction > 0) { // also NaN
		c.TemplateFraction = 0
	}
	c.TemplateFraction = min(c.TemplateFraction, 1)
	if c.TemplateFraction > 0 && c.TemplateStart <= 0 {
		c.TemplateStart = DefaultTemplateStart
	}
	if c.ScalingMode == spec.ModeDual {
		if c.EmergencySlots == 0 {
			c.EmergencySlots = int(2 * c.NodeCores)
		}
		if c.EmergencyStart <= 0 {
			c.EmergencyStart = 10 * time.Millisecond
		}
		if c.EmergencyPercentile <= 0 {
			c.EmergencyPercentile = 50
		}
	}
}

// Result is what a run produced.
type Result struct {
	Records          []workload.Record
	SandboxesCreated int64
	// EmergencyCalls were served by one-shot emergency sandboxes (dual).
	EmergencyCalls int64
	PeakSandboxes  int
	Memory         []workload.MemorySample
	// NodeBusy is each node's busy core-seconds: the spread of load.
	NodeBusy []float64
	Events   int64
	// Start is the virtual time of the schedule's offset 0.
	Start time.Time

	// TemplateNodes is how many nodes hold each function's template;
	// TemplateStarts counts the regular sandboxes created on a node holding
	// their function's template (TemplateStarts / SandboxesCreated is the
	// template hit rate), EmergencyTemplateStarts the emergency ones.
	TemplateNodes                           int
	TemplateStarts, EmergencyTemplateStarts int64

	// With Config.Triggers: how many functions are timer-triggered, and
	// their measured calls and cold starts.
	TimerFunctions              int
	TimerCalls, TimerColdStarts int64
}

// event kinds
const (
	evArrival = iota
	evComplete
	evReady
	evGone
	evRetry
	evSecond // metrics reports, load sample, memory sample
	evTick
	evQueueTimeout
	evEmergencyReady // an emergency sandbox is up: its call runs
	evUrgent         // the urgent report in flight is answered: send the next
)

type event struct {
	at   int64 // ns since start
	seq  uint64
	kind uint8
	i    int32 // arrival: invocation; complete: node; ready/gone: sandbox slot
	gen  uint64
	name string // retry: function
	c    *call  // queue timeout: the waiting call
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type call struct {
	inv     int32
	arrival int64
	start   int64 // dispatched to a sandbox
	finishV float64
	cold    bool
	queued  bool
	slot    bool // holds a slot of its sandbox's tracker (Config.LoadBalancing)
	sb      *sandbox
}

type sandbox struct {
	id        string
	fn        *function
	node      *node
	inflight  int
	ready     bool // an endpoint on the data plane
	gone      bool
	memMB     int64
	createdAt int64
	readyAt   int64 // when its endpoint reached the data plane
	// emergency: a one-shot sandbox of the dual track, gone with its call;
	// counted: its call counts toward regular scaling (the filter).
	emergency, counted bool
	tr                 *loadbalance.Tracker // its endpoint's in the routing table
}

// A sandbox is its own endpoint record in the routing table; its address
// is its id.
func (sb *sandbox) SandboxID() string                 { return sb.id }
func (sb *sandbox) Address() string                   { return sb.id }
func (sb *sandbox) LoadTracker() *loadbalance.Tracker { return sb.tr }

// WithTracker moves sb to tr. The table calls it only when a function's
// concurrency changes, which a simulated function's never does, so no
// call in flight holds the old tracker.
func (sb *sandbox) WithTracker(tr *loadbalance.Tracker) *sandbox {
	sb.tr = tr
	return sb
}

// fnConf is what the routing table keeps of a simulated function.
type fnConf struct {
	revision uint64
	slots    int
}

func (c fnConf) Revision() uint64 { return c.revision }
func (c fnConf) Concurrency() int { return c.slots }

type routes = endpoints.Table[fnConf, *sandbox]

type function struct {
	name string
	spec *spec.Function
	// set is its routing table entry: its Ready sandboxes by id, with
	// their trackers.
	set *endpoints.Set[fnConf, *sandbox]
	// lb picks among set's endpoints (Config.LoadBalancing).
	lb    loadbalance.Policy
	queue []*call
	// load accounting for the data plane's report: ∫(in flight + queued)dt
	area      float64
	level     int
	lastLevel int64
	requests  int64
	active    bool
	// tmpl is where its template is (template.go), set on first use.
	tmpl templateset.Cut
	// urgent: it is on simulator.urgent, for the next urgent report.
	urgent bool
	// inflight counts its calls running in regular sandboxes. sent is
	// (inflight, queued) as the last report carried them; changed: it is
	// on simulator.changed.
	inflight int
	sent     [2]int
	changed  bool
	// dual-mode functions: keep-alive and recent inter-arrival times for
	// the metric filter (the data plane's iatTracker).
	dual      bool
	keepAlive int64
	lastArr   int64 // the last arrival, once seen
	seen      bool
	iat       []iatEntry
}

// iatEntry is one inter-arrival time ending at at (ns).
type iatEntry struct{ at, gap int64 }

const (
	iatWindow = int64(time.Hour) // the data plane's
	iatKeep   = 256
)

// observeIAT records an arrival of a dual-mode function.
func (f *function) observeIAT(now int64) {
	if f.seen {
		if len(f.iat) == iatKeep {
			copy(f.iat, f.iat[1:])
			f.iat = f.iat[:iatKeep-1]
		}
		f.iat = append(f.iat, iatEntry{at: now, gap: now - f.lastArr})
	}
	f.lastArr, f.seen = now, true
}

// counts is the metric filter as the data plane applies it: the call counts
// when the keep-alive exceeds the pct-th percentile of the inter-arrival
// times of the last hour (no history: it counts).
func (f *function) counts(now int64, pct float64) bool {
	var gaps []int64
	for i := len(f.iat) - 1; i >= 0 && now-f.iat[i].at <= iatWindow; i-- {
		gaps = append(gaps, f.iat[i].gap)
	}
	if len(gaps) == 0 {
		return true
	}
	slices.Sort(gaps)
	i := min(len(gaps)-1, int(pct/100*float64(len(gaps)-1)+0.5))
	return f.keepAlive > gaps[i]
}

type node struct {
	id      string
	idx     int
	cores   float64
	v       float64 // virtual work done by every running call (ms)
	last    int64
	running callHeap
	epoch   uint64
	busy    float64 // core-seconds
	images  map[string]struct{}
	emFree  int // free emergency slots
}

type callHeap []*call

func (h callHeap) Len() int           { return len(h) }
func (h callHeap) Less(i, j int) bool { return h[i].finishV < h[j].finishV }
func (h callHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *callHeap) Push(x any)        { *h = append(*h, x.(*call)) }
func (h *callHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}

type simulator struct {
	cfg   Config
	s     *workload.Schedule
	r     *reconciler.Reconciler
	start time.Time
	now   int64
	q     eventQueue
	seq   uint64

	fns       map[string]*function
	fnByIdx   []*function
	nodes     map[string]*node
	nodeList  []*node
	sandboxes map[string]*sandbox
	routes    *routes // the data plane's routing table
	live      int
	version   uint64

	// changed lists the functions whose calls in flight or queued may have
	// changed since a report last carried them: an urgent report names
	// those that did (the data plane's collectUrgent).
	changed []*function
	// urgent lists the functions with a call waiting since the last urgent
	// report; urgentUntil is when the report in flight is answered, and
	// urgentNext says an evUrgent is pending for it (the data plane's
	// doorbell: one report at a time, later rings coalesce into the next).
	urgent      []*function
	urgentUntil int64
	urgentNext  bool

	rng *rand.Rand
	// near is the Overhead profile's nearest non-empty window of each.
	near []int
	// emNext is the round-robin start over nodes for emergency calls (the
	// data plane's candidates); emSeq names their sandboxes.
	emNext, emSeq int
	// tmpl says which nodes hold which function's template.
	tmpl templates

	res Result
}

// ErrStopped is Run's error when Config.Stop ended it.
var ErrStopped = errors.New("sim: stopped")

// Run simulates s on the cluster cfg describes.
func Run(s *workload.Schedule, cfg Config) (*Result, error) {
	cfg.defaults()
	var predictor autoscale.Predictor
	if cfg.Triggers {
		var ticks map[string]prewarm.Ticks
		s, ticks = timerSchedules(s)
		if !cfg.NoPrewarm {
			pw := prewarm.NewCron(2*cfg.Tick, 2*cfg.Tick+5*time.Second)
			pw.DefaultLead = cfg.ColdStart
			for fn, t := range ticks {
				pw.SetSchedules(fn, []prewarm.Ticks{t})
			}
			predictor = pw
		}
	}
	r, err := reconciler.New(reconciler.Config{Predictor: predictor, Autoscale: cfg.Autoscale, TargetUtilization: cfg.TargetUtilization,
		ScalingMode: cfg.ScalingMode, Placement: cfg.Placement, KeepAlivePolicy: cfg.KeepAlivePolicy, DrainDelay: 500 * time.Millisecond, NodeGrace: 10 * time.Second,
		FailureBackoff: 200 * time.Millisecond, MaxFailureBackoff: 30 * time.Second, Seed: cfg.Seed, IDPrefix: "sim"})
	if err != nil {
		return nil, err
	}
	sm := &simulator{cfg: cfg, s: s, r: r, start: simEpoch,
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x5157)), fns: make(map[string]*function), nodes: make(map[string]*node), sandboxes: make(map[string]*sandbox), routes: endpoints.New[fnConf, *sandbox]()}
	sm.res.Start = sm.start
	for i := range cfg.Nodes {
		n := &node{id: nodeID(i), idx: i, cores: cfg.NodeCores, images: make(map[string]struct{}), emFree: cfg.EmergencySlots}
		sm.nodes[n.id] = n
		sm.nodeList = append(sm.nodeList, n)
		sm.step(reconciler.RegisterNode{Worker: &nodes.Worker{ID: n.id, Address: n.id, Runtime: "sim",
			Capacity: spec.Resources{MilliCPU: cfg.NodeMilliCP, MemoryMB: cfg.NodeMemMB}}})
		sm.step(reconciler.SessionUp{Node: n.id})
	}
	sm.tmpl = newTemplates(sm.nodeList, cfg.TemplateFraction)
	sm.res.TemplateNodes = sm.tmpl.k
	lbRand := loadbalance.NewRand(cfg.Seed)
	sm.routes.Begin(false)
	for i := range s.Functions {
		f := &s.Functions[i]
		cpu, mem := workload.ResourceRequest(f)
		sp := &spec.Function{Name: f.Name(), Builtin: "trace", Concurrency: cfg.Concurrency, Revision: 1,
			Resources: spec.Resources{MilliCPU: cpu, MemoryMB: mem}, Scaling: spec.Scaling{Mode: cfg.ScalingMode}}
		if cfg.StableWindow > 0 {
			sp.Scaling.StableWindow = spec.Duration(cfg.StableWindow)
		}
		sp.Scaling.KeepAlive = spec.Duration(cfg.KeepAlive)
		fn := &function{name: sp.Name, spec: sp, dual: cfg.ScalingMode == spec.ModeDual && cfg.EmergencySlots > 0}
		if fn.lb, err = loadbalance.New(cfg.LoadBalancing, sp.Concurrency, lbRand); err != nil {
			return nil, err
		}
		sm.fns[sp.Name] = fn
		sm.fnByIdx = append(sm.fnByIdx, fn)
		sm.routes.Put(sp.Name, sp.Revision, func(fnConf, bool) fnConf { return fnConf{revision: sp.Revision, slots: sp.Concurrency} })
		sm.step(reconciler.UpsertFunction{Spec: sp})
		fn.keepAlive = int64(r.KeepAliveOf(sp))
	}
	sm.commitRoutes()
	sm.reportTemplates()
	sm.res.NodeBusy = make([]float64, len(sm.nodeList))
	var end int64
	for i := range s.Invocations {
		sm.push(event{at: int64(s.Invocations[i].Offset), kind: evArrival, i: int32(i)})
		end = max(end, int64(s.Invocations[i].Offset))
	}
	sm.push(event{at: int64(time.Second), kind: evSecond})
	sm.push(event{at: int64(cfg.Tick), kind: evTick})
	end += int64(2 * time.Minute) // let the last calls finish (runtimes are clamped to 60 s)
	done := 0
	for sm.q.Len() > 0 {
		e := heap.Pop(&sm.q).(event)
		sm.now = e.at
		sm.res.Events++
		if sm.res.Events&0xffff == 0 && cfg.Stop != nil {
			select {
			case <-cfg.Stop:
				return nil, ErrStopped
			default:
			}
		}
		switch e.kind {
		case evArrival:
			sm.arrive(e.i)
		case evComplete:
			n := sm.nodeList[e.i]
			if e.gen == n.epoch {
				done += sm.complete(n)
			}
		case evReady:
			sm.ready(e.name)
		case evGone:
			sm.gone(e.name)
		case evRetry:
			if sm.now > end {
				continue // a function that never found room would retry forever
			}
			sm.step(reconciler.Retry{Function: e.name})
		case evEmergencyReady:
			sm.dispatch(e.c, e.c.sb)
		case evUrgent:
			sm.urgentNext = false
			sm.reportUrgent()
		case evQueueTimeout:
			if e.c.queued {
				done++
				sm.timeout(e.c)
			}
		case evSecond:
			sm.second()
			if sm.now < end && (done < len(s.Invocations) || sm.live > 0) {
				sm.push(event{at: sm.now + int64(time.Second), kind: evSecond})
			}
		case evTick:
			sm.step(reconciler.Tick{})
			if sm.now < end && (done < len(s.Invocations) || sm.live > 0) {
				sm.push(event{at: sm.now + int64(cfg.Tick), kind: evTick})
			}
		}
	}
	for i, n := range sm.nodeList {
		sm.res.NodeBusy[i] = n.busy
	}
	sm.res.SandboxesCreated = int64(r.Stats().Creations)
	if cfg.Triggers {
		sm.res.TimerFunctions, sm.res.TimerCalls, sm.res.TimerColdStarts = s.TimerStats(sm.res.Records)
	}
	if cfg.OnResult != nil {
		cfg.OnResult(&sm.res)
	}
	return &sm.res, nil
}

// OverheadProfile is a real run's call overheads over time: Windows[i]
// holds the time beyond its runtime and its wait for a sandbox of each call
// scheduled in [i×Window, (i+1)×Window) from the run's start. An empty
// window borrows the nearest non-empty one's.
type OverheadProfile struct {
	Window  time.Duration
	Windows [][]time.Duration
}

// nearest maps each window to the nearest non-empty one (the earlier on a
// tie), or -1 when all are empty: two passes, so that a draw is O(1).
func (p *OverheadProfile) nearest() []int {
	n := len(p.Windows)
	near := make([]int, n)
	last := -1
	for i := range n {
		if len(p.Windows[i]) > 0 {
			last = i
		}
		near[i] = last
	}
	next := -1
	for i := n - 1; i >= 0; i-- {
		if len(p.Windows[i]) > 0 {
			next = i
		}
		if next >= 0 && (near[i] < 0 || next-i < i-near[i]) {
			near[i] = next
		}
	}
	return near
}

// draw is an overhead for a call arriving at offset at; near is nearest().
func (p *OverheadProfile) draw(at int64, rng *rand.Rand, near []int) int64 {
	i := min(max(int(at/int64(p.Window)), 0), len(p.Windows)-1)
	if near[i] < 0 {
		return 0
	}
	w := p.Windows[near[i]]
	return int64(w[rng.IntN(len(w))])
}

// overhead is the time added to the response of a call that arrived at
// offset at: drawn from the Overhead profile, or CallOverhead.
func (sm *simulator) overhead(at int64) int64 {
	if p := sm.cfg.Overhead; p != nil && p.Window > 0 && len(p.Windows) > 0 {
		if sm.near == nil {
			sm.near = p.nearest()
		}
		return p.draw(at, sm.rng, sm.near)
	}
	switch o := sm.cfg.CallOverhead; len(o) {
	case 0:
		return 0
	case 1:
		return int64(o[0])
	default:
		return int64(o[sm.rng.IntN(len(o))])
	}
}

func (sm *simulator) push(e event) {
	sm.seq++
	e.seq = sm.seq
	heap.Push(&sm.q, e)
}

func (sm *simulator) at() time.Time { return sm.start.Add(time.Duration(sm.now)) }

// step steps the reconciler and carries its commands out.
func (sm *simulator) step(ev reconciler.Event) {
	for _, cmd := range sm.r.Step(sm.at(), ev) {
		switch x := cmd.(type) {
		case reconciler.Create:
			n, fn := sm.nodes[x.Node], sm.fns[x.Spec.Name]
			if n == nil || fn == nil {
				continue
			}
			key := x.Spec.Name
			d := sm.cfg.ColdStart
			if _, ok := n.images[key]; ok {
				d = sm.cfg.CachedColdStart
			}
			if sm.tmpl.holds(fn, n) {
				d = sm.cfg.TemplateStart
				sm.res.TemplateStarts++
			}
			n.images[key] = struct{}{}
			sm.add(&sandbox{id: x.ID, fn: fn, node: n, memMB: x.Spec.Resources.MemoryMB, createdAt: sm.now})
			sm.push(event{at: sm.now + int64(d), kind: evReady, name: x.ID})
		case reconciler.Tombstone:
			if sb := sm.sandboxes[x.ID]; sb != nil && !sb.gone {
				sb.gone = true
				sm.unroute(sb)
				sm.push(event{at: sm.now + int64(x.After), kind: evGone, name: x.ID})
			}
		case reconciler.AddEndpoint:
			if sb := sm.sandboxes[x.Endpoint.SandboxID]; sb != nil && !sb.gone && !sb.ready {
				sb.ready, sb.readyAt = true, sm.now
				sm.routes.Begin(false)
				sm.routes.Add(sb.fn.name, sb.id, sb.id, func(slots int) *sandbox {
					sb.tr = loadbalance.NewTracker(slots)
					return sb
				})
				sm.commitRoutes()
				sm.drain(sb.fn)
			}
		case reconciler.RemoveEndpoint:
			if sb := sm.sandboxes[x.ID]; sb != nil {
				sm.unroute(sb)
			}
		case reconciler.RetryAt:
			sm.push(event{at: max(sm.now, x.At.Sub(sm.start).Nanoseconds()), kind: evRetry, name: x.Function})
		}
	}
}

// add counts a new sandbox, regular or emergency, toward memory and the peak.
func (sm *simulator) add(sb *sandbox) {
	sm.sandboxes[sb.id] = sb
	sm.live++
	sm.res.PeakSandboxes = max(sm.res.PeakSandboxes, sm.live)
}

func (sm *simulator) unroute(sb *sandbox) {
	if !sb.ready {
		return
	}
	sb.ready = false
	sm.routes.Begin(false)
	sm.routes.Remove(sb.id)
	sm.commitRoutes()
}

// commitRoutes commits the routing table's batch and points each changed
// function at its new set.
func (sm *simulator) commitRoutes() {
	for _, c := range sm.routes.Commit() {
		if fn := sm.fns[c.Name]; fn != nil {
			fn.set = c.New
		}
	}
}

// record tells the worker's state of sandbox id to the reconciler.
func (sm *simulator) record(sb *sandbox, st reconciler.SandboxState) {
	sm.version++
	sm.step(reconciler.WorkerUpdates{Node: sb.node.id, Updates: reconciler.Updates{Records: []reconciler.Record{{
		ID: sb.id, Function: sb.fn.name, Revision: sb.fn.spec.Revision, State: st, Version: sm.version, Address: sb.id}}}})
}

func (sm *simulator) ready(id string) {
	sb := sm.sandboxes[id]
	if sb == nil || sb.gone {
		return
	}
	sm.record(sb, reconciler.StateReady)
}

func (sm *simulator) gone(id string) {
	sb := sm.sandboxes[id]
	if sb == nil {
		return
	}
	delete(sm.sandboxes, id)
	sm.live--
	sm.record(sb, reconciler.StateGone)
}

// ---------------------------------------------------------------- data plane

func (f *function) setLevel(now int64, delta int) {
	f.area += float64(f.level) * float64(now-f.lastLevel) / 1e9
	f.lastLevel = now
	f.level += delta
	f.active = true
}

func (sm *simulator) arrive(i int32) {
	inv := &sm.s.Invocations[i]
	fn := sm.fnByIdx[inv.Func]
	c := &call{inv: i, arrival: sm.now}
	if fn.dual {
		fn.observeIAT(sm.now)
	}
	sb, slot := pick(fn)
	c.slot = slot
	if sb == nil && fn.dual && sm.emergency(c, fn) {
		return
	}
	fn.requests++
	fn.setLevel(sm.now, 1)
	if sb != nil {
		sm.dispatch(c, sb)
		return
	}
	fn.queue = append(fn.queue, c)
	c.queued = true
	sm.push(event{at: sm.now + int64(spec.DefaultQueueTimeout), kind: evQueueTimeout, c: c})
	sm.markUrgent(fn)
}

// urgentRTT is an urgent report's round trip to the control plane: while
// one is in flight, calls that wait meanwhile go into the next, as the data
// plane's doorbell coalesces them (link.reportUrgent).
const urgentRTT = int64(time.Millisecond)

// markUrgent puts fn, which has a call waiting with no free slot, into the
// next urgent report, sent now unless one is in flight.
func (sm *simulator) markUrgent(fn *function) {
	if !fn.urgent {
		fn.urgent = true
		sm.urgent = append(sm.urgent, fn)
	}
	switch {
	case sm.urgentNext:
	case sm.now >= sm.urgentUntil:
		sm.reportUrgent()
	default:
		sm.urgentNext = true
		sm.push(event{at: sm.urgentUntil, kind: evUrgent})
	}
}

// reportUrgent sends the urgent report: the marked functions still waiting,
// and every other function whose calls in flight or queued changed since a
// report last carried them (the data plane's collectUrgent).
func (sm *simulator) reportUrgent() {
	var fms []reconciler.FunctionLoad
	for _, fn := range sm.urgent {
		fn.urgent = false
		if len(fn.queue) > 0 { // else served meanwhile
			fn.sent = [2]int{fn.inflight, len(fn.queue)}
			fms = append(fms, reconciler.FunctionLoad{Function: fn.name, Queued: len(fn.queue), NoCapacity: true, InFlight: fn.inflight})
		}
	}
	clear(sm.urgent)
	sm.urgent = sm.urgent[:0]
	if len(fms) == 0 {
		return
	}
	for _, fn := range sm.changed {
		fn.changed = false
		if now := [2]int{fn.inflight, len(fn.queue)}; now != fn.sent {
			fn.sent = now
			fms = append(fms, reconciler.FunctionLoad{Function: fn.name, InFlight: fn.inflight, Queued: len(fn.queue)})
		}
	}
	clear(sm.changed)
	sm.changed = sm.changed[:0]
	sm.urgentUntil = sm.now + urgentRTT
	sm.step(reconciler.Metrics{Report: reconciler.LoadReport{DataPlane: "sim-dp", Urgent: true, Functions: fms}})
}

// running counts a call starting (+1) or ending (-1) in one of fn's
// regular sandboxes.
func (sm *simulator) running(fn *function, delta int) {
	fn.inflight += delta
	sm.change(fn)
}

// change notes that fn's calls in flight or queued changed.
func (sm *simulator) change(fn *function) {
	if !fn.changed {
		fn.changed = true
		sm.changed = append(sm.changed, fn)
	}
}

// emergency serves c on a one-shot sandbox of the next node (round robin)
// with a free emergency slot; false when none has one (the call queues).
func (sm *simulator) emergency(c *call, fn *function) bool {
	var n *node
	for k := range len(sm.nodeList) {
		if cand := sm.nodeList[(sm.emNext+k)%len(sm.nodeList)]; cand.emFree > 0 {
			n = cand
			sm.emNext = (cand.idx + 1) % len(sm.nodeList)
			break
		}
	}
	if n == nil {
		return false
	}
	n.emFree--
	sm.emSeq++
	sb := &sandbox{id: fmt.Sprintf("ei-%d", sm.emSeq), fn: fn, node: n, memMB: fn.spec.Resources.MemoryMB, createdAt: sm.now,
		emergency: true, counted: fn.counts(sm.now, sm.cfg.EmergencyPercentile)}
	if sb.counted {
		fn.requests++
		fn.setLevel(sm.now, 1)
	}
	start := sm.cfg.EmergencyStart
	if sm.tmpl.holds(fn, n) { // a fork of the function's template
		start = sm.cfg.TemplateStart
		sm.res.EmergencyTemplateStarts++
	}
	sb.readyAt = sm.now + int64(start)
	sm.add(sb)
	sm.res.EmergencyCalls++
	c.sb = sb
	sm.push(event{at: sb.readyAt, kind: evEmergencyReady, c: c})
	return true
}

// pick chooses the sandbox for a call of fn with its policy, as the data
// plane does: nil when none has a free slot. The choice holds a slot of
// its tracker (slot), released when the call finishes.
func pick(fn *function) (sb *sandbox, slot bool) {
	sb, ok := fn.set.Pick(fn.lb)
	return sb, ok
}

// hasFree says whether a sandbox of fn has a free slot (no slot taken).
func hasFree(fn *function) bool {
	for _, sb := range fn.set.Endpoints {
		if sb.inflight < fn.spec.Concurrency {
			return true
		}
	}
	return false
}

func (sm *simulator) drain(fn *function) {
	for len(fn.queue) > 0 {
		sb, slot := pick(fn)
		if sb == nil {
			return
		}
		c := fn.queue[0]
		fn.queue[0] = nil
		fn.queue = fn.queue[1:]
		c.queued, c.slot = false, slot
		sm.dispatch(c, sb)
	}
}

func (sm *simulator) dispatch(c *call, sb *sandbox) {
	// Cold as the data plane counts it: served by a sandbox whose endpoint
	// arrived after the call did.
	c.sb, c.start, c.cold = sb, sm.now, sb.readyAt > c.arrival
	sb.inflight++
	if !sb.emergency {
		sm.running(sb.fn, 1)
	}
	n := sb.node
	sm.advance(n)
	c.finishV = n.v + float64(sm.s.Invocations[c.inv].RuntimeMs)
	heap.Push(&n.running, c)
	sm.schedule(n)
}

// rate is how fast each running call progresses on n (work ms per ms).
func (n *node) rate() float64 {
	k := float64(len(n.running))
	if k <= n.cores {
		return 1
	}
	return n.cores / k
}

// advance brings n's virtual work up to now.
func (sm *simulator) advance(n *node) {
	dt := float64(sm.now-n.last) / 1e6 // ms
	if dt > 0 && len(n.running) > 0 {
		n.v += dt * n.rate()
		n.busy += dt / 1000 * min(float64(len(n.running)), n.cores)
	}
	n.last = sm.now
}

// schedule sets n's next completion event (older ones are void).
func (sm *simulator) schedule(n *node) {
	n.epoch++
	if len(n.running) == 0 {
		return
	}
	left := max(n.running[0].finishV-n.v, 0) / n.rate() // ms
	sm.push(event{at: sm.now + int64(math.Ceil(left*1e6)), kind: evComplete, i: int32(n.idx), gen: n.epoch})
}

// complete finishes n's calls that are done at now; it returns how many.
func (sm *simulator) complete(n *node) int {
	sm.advance(n)
	done := 0
	for len(n.running) > 0 && n.running[0].finishV <= n.v+1e-6 {
		c := heap.Pop(&n.running).(*call)
		done++
		sm.finish(c)
	}
	sm.schedule(n)
	return done
}

func (sm *simulator) finish(c *call) {
	inv := &sm.s.Invocations[c.inv]
	sb := c.sb
	fn := sb.fn
	sb.inflight--
	if c.slot {
		sb.tr.Release()
	}
	if !sb.emergency {
		sm.running(fn, -1)
	}
	if !sb.emergency || sb.counted {
		fn.setLevel(sm.now, -1)
	}
	sm.res.Records = append(sm.res.Records, workload.Record{
		Phase: sm.s.Phase(inv), Instance: sb.id, InvocationID: sm.s.InvocationID(inv),
		StartTime:   sm.start.Add(time.Duration(c.arrival)).UnixMicro(),
		RequestedUs: int64(inv.RuntimeMs) * 1000, ConnUs: (c.start - c.arrival) / 1000,
		ResponseUs: (sm.now - c.arrival + sm.overhead(c.arrival)) / 1000, ActualUs: (sm.now - c.start) / 1000,
		MemoryMB: int(inv.MemoryMB), Function: fn.name, Status: 200, Cold: c.cold,
		QueueUs: (c.start - c.arrival) / 1000, Sandbox: sb.id,
	})
	if sb.emergency { // one-shot: torn down with its call
		delete(sm.sandboxes, sb.id)
		sm.live--
		sb.node.emFree++
		return
	}
	if len(fn.queue) > 0 && !sb.gone && sb.ready {
		sm.drain(fn)
	}
}

// timeout fails a call that waited the queue timeout for a sandbox (the
// data plane's 504), as the real data plane does.
func (sm *simulator) timeout(c *call) {
	fn := sm.fnByIdx[sm.s.Invocations[c.inv].Func]
	for i, q := range fn.queue {
		if q == c {
			if i == 0 { // the usual case: FIFO, the oldest times out first
				fn.queue[0] = nil
				fn.queue = fn.queue[1:]
			} else {
				fn.queue = append(fn.queue[:i], fn.queue[i+1:]...)
			}
			break
		}
	}
	c.queued = false
	sm.change(fn)
	fn.setLevel(sm.now, -1)
	inv := &sm.s.Invocations[c.inv]
	sm.res.Records = append(sm.res.Records, workload.Record{
		Phase: sm.s.Phase(inv), InvocationID: sm.s.InvocationID(inv),
		StartTime:   sm.start.Add(time.Duration(c.arrival)).UnixMicro(),
		RequestedUs: int64(inv.RuntimeMs) * 1000, ResponseUs: (sm.now - c.arrival) / 1000,
		MemoryMB: int(inv.MemoryMB), Function: fn.name, Status: 504, QueueUs: (sm.now - c.arrival) / 1000,
		Error: "no sandbox within the queue timeout",
	})
}

// second is the data plane's periodic report, the control plane's
// once-a-second load sample, and a memory sample.
func (sm *simulator) second() {
	var fms []reconciler.FunctionLoad
	for _, fn := range sm.fnByIdx {
		if !fn.active {
			continue
		}
		fn.setLevel(sm.now, 0)
		fn.sent = [2]int{fn.inflight, len(fn.queue)}
		fms = append(fms, reconciler.FunctionLoad{Function: fn.name, AvgConcurrency: fn.area, Requests: fn.requests,
			Queued: len(fn.queue), NoCapacity: len(fn.queue) > 0 && !hasFree(fn), InFlight: fn.inflight})
		fn.active = fn.level > 0
		fn.area, fn.requests = 0, 0
	}
	if len(fms) > 0 {
		sm.step(reconciler.Metrics{Report: reconciler.LoadReport{DataPlane: "sim-dp", Interval: time.Second, Functions: fms}})
	}
	sm.step(reconciler.SampleLoad{})
	if sm.now%int64(5*time.Second) == 0 { // heartbeats: the load the locality policies bound
		for _, n := range sm.nodeList {
			sm.advance(n)
			used := int64(min(float64(len(n.running)), n.cores) * 1000)
			sm.step(reconciler.WorkerUpdates{Node: n.id, Updates: reconciler.Updates{Heartbeat: &reconciler.Heartbeat{
				Capacity: spec.Resources{MilliCPU: int64(n.cores * 1000)}, Used: spec.Resources{MilliCPU: used}}}})
		}
	}
	var reserved, busy float64
	for _, sb := range sm.sandboxes {
		reserved += float64(sb.memMB)
		if sb.inflight > 0 {
			busy += float64(sb.memMB)
		}
	}
	sm.res.Memory = append(sm.res.Memory, workload.MemorySample{At: float64(sm.now) / 1e9, ReservedMB: reserved, BusyMB: busy})
}

package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Resources is an amount of CPU and memory, as a request or a capacity.
// MemoryMB is in mebibytes (the kube-scheduler default of 200Mi is 200 here).
type Resources struct {
	MilliCPU int64
	MemoryMB int64
}

// Defaults that kube-scheduler substitutes for a zero request when it scores
// (pkg/scheduler/util DefaultMilliCPURequest / DefaultMemoryRequest). Without
// them a node full of request-less sandboxes would look empty to
// LeastAllocated and attract every new one.
const (
	DefaultMilliCPURequest int64 = 100
	DefaultMemoryMBRequest int64 = 200
)

// NonZero returns r with each zero field replaced by its scoring default.
// Callers that maintain Node.NonZeroRequested add NonZero(req) per sandbox.
func (r Resources) NonZero() Resources {
	if r.MilliCPU == 0 {
		r.MilliCPU = DefaultMilliCPURequest
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = DefaultMemoryMBRequest
	}
	return r
}

// Node is the placement view of one worker. Policies only read it.
type Node struct {
	ID          string
	Allocatable Resources
	// Requested is the sum of the requests of sandboxes placed on the node,
	// including ones still starting. Placement works on requests, never on
	// measured usage, like kube-scheduler (its cache counts assumed pods).
	Requested Resources
	// NonZeroRequested is the sum of NonZero(request) over the node's
	// sandboxes: kube-scheduler's NodeInfo.NonZeroRequested, used only by the
	// LeastAllocated and MostAllocated scores. Leave it zero if untracked; the
	// scorers use max(Requested, NonZeroRequested) per resource, which is exact
	// when it is tracked (it can never be below Requested) and falls back to
	// Requested when it is not.
	NonZeroRequested Resources
	Sandboxes        int
	MaxSandboxes     int  // 0 = unlimited
	Schedulable      bool // false: draining or unhealthy; never chosen
	// Load is the node's measured load per core (1.0 = every core busy):
	// from the worker's heartbeats in the real system, the run queue in the
	// simulator; 0 when unknown. Only the load-bounded policies read it
	// (ch-bl, ch-rlu); NaN and negative values count as 0 (nodeLoad).
	Load float64
}

// ErrNoCapacity is returned when no node can take the sandbox. It is a normal
// result (the caller queues or reports it), never a reason to panic.
var ErrNoCapacity = errors.New("placement: no node has capacity")

// ErrUnknownPolicy is wrapped by New for a name it does not know.
var ErrUnknownPolicy = errors.New("placement: unknown policy")

// Policy chooses a node for one sandbox.
//
// Implementations may keep state between calls (a round-robin cursor, the
// kube-scheduler sampling offset) and share the injected *rand.Rand, so a
// Policy is not safe for concurrent use: the placer serialises calls, which
// also keeps decisions reproducible for a given seed and call order.
type Policy interface {
	// Place returns the index in nodes of the node for a sandbox requesting
	// req, or ErrNoCapacity. It never modifies nodes; the caller records the
	// placement (Requested, Sandboxes) before the next call.
	Place(nodes []Node, req Request) (int, error)
}

// Request is one sandbox to place: what it requests, and what the locality
// policies (sharding, CH-BL, CH-RLU, locality) need to know about its
// function. Policies that do not use a field ignore it.
type Request struct {
	Resources
	// Key identifies the function ("namespace/name"): hashing policies map
	// it to its home node.
	Key string
	// Now is the control plane's (or the simulator's) clock: policies that
	// age what they learn read time only from here.
	Now time.Time
	// Rate is the function's recent invocation rate (calls/s; 0 unknown):
	// CH-RLU detects popular functions from it.
	Rate float64
	// ColdWarmRatio is the function's cold-start time over its warm
	// execution time (0 unknown): CH-RLU's cold/warm-aware load bound.
	ColdWarmRatio float64
	// Locality, when set, tells how much of the function node i already
	// holds (its image, an idle sandbox); nil means nothing is known.
	Locality func(i int) Locality
}

// Locality is what a node already holds of a function: the more, the
// cheaper a new sandbox of it starts there.
type Locality uint8

const (
	LocalityNone     Locality = iota // nothing: pull and unpack the image
	LocalityImage                    // the image is unpacked there
	LocalityTemplate                 // its template is loaded there: a sandbox forks in ms
	LocalityWarm                     // a sandbox of the function runs there
)

// Policy names accepted by New.
const (
	NameKubernetes = "kubernetes"
	NameRandom     = "random"
	NameRoundRobin = "round-robin"
	NameBinPacking = "bin-packing"
	NameSharding   = "sharding" // OpenWhisk's ShardingContainerPoolBalancer (sharding.go)
	NameCHBL       = "ch-bl"    // consistent hashing with bounded loads (chbl.go)
	NameCHRLU      = "ch-rlu"   // consistent hashing with random load updates (chrlu.go)
	NameLocality   = "locality" // kubernetes scoring ranked by locality class (locality.go)
)

// Names lists the policy names New accepts, default first.
func Names() []string {
	return []string{NameKubernetes, NameRandom, NameRoundRobin, NameBinPacking,
		NameSharding, NameCHBL, NameCHRLU, NameLocality}
}

// New returns the policy called name with its default parameters; ""
// selects the default, "kubernetes". rng may be nil only for the policies
// that use no randomness: "round-robin", "sharding" and "ch-bl".
func New(name string, rng *rand.Rand) (Policy, error) {
	switch name {
	case NameRoundRobin:
		return NewRoundRobin(), nil
	case NameSharding:
		return NewSharding(), nil
	case NameCHBL:
		return NewCHBL(CHBLConfig{}), nil
	case "", NameKubernetes, NameRandom, NameBinPacking, NameCHRLU, NameLocality:
	default:
		return nil, fmt.Errorf("%w %q (allowed: %s)", ErrUnknownPolicy, name, strings.Join(Names(), ", "))
	}
	if rng == nil {
		return nil, fmt.Errorf("placement: policy %q needs a non-nil *rand.Rand", name)
	}
	switch name {
	case NameRandom:
		return NewRandom(rng), nil
	case NameBinPacking:
		return NewBinPack(rng), nil
	case NameCHRLU:
		return NewCHRLU(rng, CHRLUConfig{}), nil
	case NameLocality:
		return NewLocality(rng), nil
	default:
		return NewKubernetes(rng), nil
	}
}

// Feasible reports whether n can take a sandbox requesting req: it is
// schedulable, below its sandbox limit, and req fits in what is not yet
// requested. This is kube-scheduler's NodeResourcesFit filter; as there, a
// zero request always fits that resource, even on an overcommitted node.
func Feasible(n *Node, req Resources) bool {
	if !n.Schedulable {
		return false
	}
	if n.MaxSandboxes > 0 && n.Sandboxes >= n.MaxSandboxes {
		return false
	}
	if req.MilliCPU > 0 && req.MilliCPU > n.Allocatable.MilliCPU-n.Requested.MilliCPU {
		return false
	}
	if req.MemoryMB > 0 && req.MemoryMB > n.Allocatable.MemoryMB-n.Requested.MemoryMB {
		return false
	}
	return true
}

func mustRNG(rng *rand.Rand, constructor string) {
	if rng == nil {
		// A nil source is a wiring bug; failing here beats a nil dereference
		// in the middle of a placement.
		panic("placement: " + constructor + " needs a non-nil *rand.Rand")
	}
}

// maxLoad caps Node.Load so that sums and averages over many nodes stay
// finite: no real node has a million runnable tasks per core.
const maxLoad = 1e6

// nodeLoad is n.Load as the load-aware policies use it: NaN and values
// below 0 (a missing or broken report) read as 0, +Inf and huge values as
// maxLoad.
func nodeLoad(n *Node) float64 {
	l := n.Load
	if !(l > 0) { // also NaN
		return 0
	}
	return min(l, maxLoad)
}

package reconciler

import (
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// The reconciler's own vocabulary for what workers and data planes report
// and what it publishes. The control plane translates the wire's protobuf
// messages to and from these (internal/controlplane/wire.go), so the core
// links no gRPC or protobuf and the simulator and tests build plain values.

// SandboxState is a sandbox's state as its worker reports it.
type SandboxState uint8

const (
	StateUnknown     SandboxState = iota
	StateCreating                 // accepted, being started
	StateReady                    // answering on its port
	StateTerminating              // being stopped: irreversible
	StateGone                     // torn down
	StateFailed                   // could not start (gone)
	StateExited                   // died on its own (gone)
)

var stateNames = [...]string{"unknown", "creating", "ready", "terminating", "gone", "failed", "exited"}

func (s SandboxState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// terminal says the sandbox is gone for good.
func (s SandboxState) terminal() bool { return s == StateGone || s == StateFailed || s == StateExited }

// Record is a worker's (authoritative) record of one sandbox.
type Record struct {
	ID, Function string
	Revision     uint64
	State        SandboxState
	// Version is bumped by the worker on every state change.
	Version uint64
	Address string // host:port once ready
	Message string // why it failed or exited
	// Start is accept → the runtime's create returned, Create accept →
	// ready (0 when the worker does not say).
	Start, Create time.Duration
}

// Version is one sandbox's record version, as a handshake lists them.
type Version struct {
	ID      string
	Version uint64
}

// Updates is one batch a worker sends on a live session.
type Updates struct {
	Records   []Record
	Heartbeat *Heartbeat // nil: none in this batch
}

// Heartbeat is a worker's periodic account of its node.
type Heartbeat struct {
	Capacity, Used spec.Resources // Used: regular and emergency sandboxes
	Sandboxes      int            // regular sandboxes
	Emergency      EmergencyStats
	// Templates is the memory the node's templates hold, which no
	// sandbox's request covers.
	Templates spec.Resources
	// HeldSet says Held is the node's whole set of loaded templates,
	// replacing the last one; otherwise the set is unchanged.
	HeldSet bool
	Held    []HeldTemplate
}

// EmergencyStats is a worker's dual-track (emergency) slots.
type EmergencyStats struct {
	Slots, InUse    int
	Started, Failed int64   // since the worker daemon started
	MemoryMBSeconds float64 // Σ MiB × lifetime of the ended ones
}

// HeldTemplate is a function revision whose template a node holds.
type HeldTemplate struct {
	Function string
	Revision uint64
}

// LoadReport is a data plane's report of its calls.
type LoadReport struct {
	DataPlane string
	Interval  time.Duration
	// Urgent: a call waits with no capacity; such a report also lists
	// every function whose calls in flight or queued changed since its
	// data plane last reported them (the others stand as last reported).
	Urgent    bool
	Functions []FunctionLoad
	// Draining lists the sandboxes withdrawn from the data plane that
	// still run calls it sent (every report repeats the whole list).
	Draining []string
}

// FunctionLoad is one function's part of a LoadReport.
type FunctionLoad struct {
	Function       string
	AvgConcurrency float64 // time-weighted in flight and queued over the interval
	Requests       int64
	Queued         int  // waiting now
	NoCapacity     bool // a call waits with no sandbox to take it
	InFlight       int  // running in its sandboxes now
}

// UnreachableEndpoint is a sandbox a data plane could not connect to.
type UnreachableEndpoint struct {
	SandboxID, Function, Address string
	Error                        string // the connect error, for the log
}

// UnreachableReport is one data plane's list of them.
type UnreachableReport struct {
	DataPlane string
	Endpoints []UnreachableEndpoint
}

// Endpoint is a routable sandbox as data planes get it.
type Endpoint struct {
	SandboxID, Function, Address, Node string
	// How the sandbox started, when it just became ready (0 otherwise):
	// placement to ready as the reconciler saw it, and the worker's own
	// phases (Record.Start, Record.Create).
	ReadyAfter, Start, Create time.Duration
}

// Condition says why a function lacks sandboxes ("" Reason: nothing is
// wrong any more). FailFast: data planes answer its calls that find no
// sandbox at once.
type Condition struct {
	Function, Reason, Message string
	FailFast                  bool
}

// EmergencyWorker is a worker taking emergency calls.
type EmergencyWorker struct {
	Node, Address string // Address: the worker's gRPC address
	Free          int    // free emergency slots at its last heartbeat
}

// HandshakeMode is how a worker's handshake folds into the table.
type HandshakeMode uint8

const (
	// HandshakeRecover: the table holds nothing of the worker; adopt all.
	HandshakeRecover HandshakeMode = iota + 1
	// HandshakeReset: the table has the worker's sandboxes; diff by versions.
	HandshakeReset
)

// Published is a function as data planes and workers get it: its spec
// and the policies in effect for it.
type Published struct {
	Spec          *spec.Function
	ScalingMode   string
	KeepAlive     time.Duration // of an idle regular sandbox
	LoadBalancing string
}

// Snapshot is the full state a data plane starts from.
type Snapshot struct {
	Functions        []Published
	Conditions       []Condition // the functions that have one
	Endpoints        []Endpoint
	EmergencyWorkers []EmergencyWorker
}

package api

import (
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Dashboard is the cluster at a glance (GET /v1/dashboard), what the web
// dashboard at /ui/ shows: the table's state now, and rates, latencies and
// failures over the last WindowSeconds.
type Dashboard struct {
	Time         time.Time `json:"time"`
	ControlPlane string    `json:"control_plane"`
	// WindowSeconds is the span the rates and latencies are over: the
	// last 30 s or so (less just after the control plane started).
	WindowSeconds float64          `json:"window_seconds"`
	Summary       DashboardSummary `json:"summary"`
	// Sandboxes counts the cluster's sandboxes by state.
	Sandboxes SandboxCounts   `json:"sandboxes"`
	Nodes     []DashboardNode `json:"nodes"`
	// Functions are at most ?limit= of them (default 500), by name: those
	// with a condition first, then the busiest. Summary.Functions counts
	// them all.
	Functions []DashboardFunction `json:"functions"`
	// Failures are the most recent sandbox failures and condition changes
	// (the last 50), newest first.
	Failures []DashboardFailure `json:"failures"`
	// Triggers are at most ?limit= of them, failing ones first, then by
	// namespace and name; Summary.Triggers counts them all.
	Triggers []TriggerView `json:"triggers"`
}

// DashboardSummary is the cluster's totals.
type DashboardSummary struct {
	Nodes          int `json:"nodes"`
	NodesConnected int `json:"nodes_connected"`
	// DataPlanes is how many data planes follow the endpoint stream now.
	DataPlanes int `json:"data_planes"`
	Functions  int `json:"functions"`
	Triggers   int `json:"triggers"`
	// FunctionsFailing is how many functions have a condition
	// (function-failing, no-capacity, quota-exceeded).
	FunctionsFailing int `json:"functions_failing"`
	// SandboxFailures is how many sandboxes failed to start or exited on
	// their own within the window.
	SandboxFailures uint64 `json:"sandbox_failures"`
	// CallsPerSecond: calls that reached the data planes; ColdStarts:
	// sandboxes the control plane placed. Both over the window.
	CallsPerSecond      float64 `json:"calls_per_second"`
	ColdStartsPerSecond float64 `json:"cold_starts_per_second"`
	// Calls and ColdStarts are the window's counts; the totals count
	// since this control plane started.
	Calls           uint64         `json:"calls"`
	ColdStarts      uint64         `json:"cold_starts"`
	CallsTotal      uint64         `json:"calls_total"`
	ColdStartsTotal uint64         `json:"cold_starts_total"`
	Latency         LatencySummary `json:"latency"`
}

// LatencySummary is the latency of the calls that ended within the window,
// from arrival at a data plane to its reply (queueing included), estimated
// from histogram buckets (FunctionMetric.latency_buckets); 0 when Count is.
type LatencySummary struct {
	Count uint64  `json:"count"`
	P50   float64 `json:"p50_seconds"`
	P90   float64 `json:"p90_seconds"`
	P99   float64 `json:"p99_seconds"`
}

// SandboxCounts counts sandboxes by state, as FunctionStatus names them:
// assumed (placed, not yet acknowledged by the worker), pending (being
// created), ready (serving) and tombstoned (terminating).
type SandboxCounts struct {
	Assumed    int `json:"assumed"`
	Pending    int `json:"pending"`
	Ready      int `json:"ready"`
	Tombstoned int `json:"tombstoned"`
}

// DashboardNode is one worker node.
type DashboardNode struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Runtime string `json:"runtime"`
	// State is ready, draining or disconnected.
	State       string         `json:"state"`
	Capacity    spec.Resources `json:"capacity"`
	Requested   spec.Resources `json:"requested"`
	Used        spec.Resources `json:"used"`
	Templates   spec.Resources `json:"templates"`        // held by templates, off the capacity placement uses
	HeartbeatMs int64          `json:"heartbeat_age_ms"` // -1: none yet
	Sandboxes   SandboxCounts  `json:"sandboxes"`
}

// DashboardFunction is one function.
type DashboardFunction struct {
	Name        string `json:"name"`
	Namespace   string `json:"namespace"`
	Revision    uint64 `json:"revision"`
	Desired     int    `json:"desired"`
	Ready       int    `json:"ready"`
	Pending     int    `json:"pending"`
	Terminating int    `json:"terminating"`
	// Condition and Message: why it lacks sandboxes (FunctionStatus).
	Condition string `json:"condition,omitempty"`
	Message   string `json:"message,omitempty"`
	// Failures counts its sandbox starts that failed in a row.
	Failures            int            `json:"failures,omitempty"`
	Sandboxes           SandboxCounts  `json:"sandboxes"`
	CallsPerSecond      float64        `json:"calls_per_second"`
	ColdStartsPerSecond float64        `json:"cold_starts_per_second"`
	Calls               uint64         `json:"calls"`
	SandboxFailures     uint64         `json:"sandbox_failures"`
	Latency             LatencySummary `json:"latency"`
}

// DashboardFailure is a sandbox that failed (Kind sandbox-failed: it did
// not start, or exited on its own) or a function that entered a condition
// (Kind function-failing, no-capacity or quota-exceeded).
type DashboardFailure struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`
	Function string    `json:"function"`
	Node     string    `json:"node,omitempty"`
	Sandbox  string    `json:"sandbox,omitempty"`
	Reason   string    `json:"reason"`
}

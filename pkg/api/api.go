// Package api holds the types of brisk's admin API and of its
// asynchronous calls' status, as clients see them (pkg/client). The
// function spec itself is pkg/spec.
package api

import (
	"net/http"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// FunctionView is a function as the admin API returns it: its spec and its
// scaling status.
type FunctionView struct {
	*spec.Function
	Status FunctionStatus `json:"status"`
}

// RollbackRequest names the revision POST /v1/functions/NAME/rollback
// restores; 0: the one before the current.
type RollbackRequest struct {
	Revision uint64 `json:"revision,omitempty"`
}

// TrafficRequest is the body of PUT /v1/functions/NAME/traffic: the new
// split (empty: every call to the current revision).
type TrafficRequest struct {
	Traffic []spec.TrafficTarget `json:"traffic"`
}

// TrafficStatus is one target of a function's split as it runs: the
// function serving it (NAME for the current revision, NAME_rREV for a
// pinned earlier one) and its sandboxes.
type TrafficStatus struct {
	spec.TrafficTarget
	Function         string `json:"function"`
	ServedRevision   uint64 `json:"served_revision"`
	ServedGeneration uint64 `json:"served_generation,omitempty"` // the served revision's number (spec.Function.Generation)
	Desired          int    `json:"desired"`
	Ready            int    `json:"ready"`
	// Missing: the pinned revision is no longer kept; its share goes to
	// the current revision.
	Missing bool `json:"missing,omitempty"`
}

// HeaderContinue carries the token of a list's next page (GET
// /v1/functions?limit=N): pass it as ?continue= to get the functions after
// this page's; absent on the last page.
const HeaderContinue = "X-Brisk-Continue"

// HeaderNotForwarded marks a 503 from a control-plane replica that acted
// on nothing and passed nothing on (it knows no leader, could not dial
// it, or no longer leads): a client may send the same request, whatever
// its method, to another replica.
const HeaderNotForwarded = "X-Brisk-Not-Forwarded"

// FunctionStatus is a function's scaling state.
type FunctionStatus struct {
	Desired     int    `json:"desired"`
	Ready       int    `json:"ready"`
	Pending     int    `json:"pending"`
	Terminating int    `json:"terminating"`
	LastFailure string `json:"last_failure,omitempty"`
	// Failures counts the sandbox starts that failed in a row.
	Failures int `json:"failures,omitempty"`
	// Condition is why the function lacks sandboxes ("no-capacity",
	// "function-failing"; empty: nothing wrong), Message the detail. Calls
	// that find no sandbox carry the same reason in X-Brisk-Error.
	Condition string `json:"condition,omitempty"`
	Message   string `json:"message,omitempty"`
	// Policies are the ones in effect: the spec's choices, or the
	// cluster's defaults where it names none.
	Policies  *Policies       `json:"policies,omitempty"`
	Sandboxes []SandboxStatus `json:"sandboxes"`
	// Traffic is the function's split as it runs (none: every call to
	// the current revision).
	Traffic []TrafficStatus `json:"traffic,omitempty"`
	// Triggers are the triggers that call it (docs/triggers.md).
	Triggers []TriggerRef `json:"triggers,omitempty"`
	// Calls counts the calls its data planes reported to this control
	// plane since it started or the function was registered (OpenFaaS's
	// invocationCount); a leader change starts it again.
	Calls uint64 `json:"calls"`
}

// Policies are a function's effective policies (docs/policies.md).
type Policies struct {
	ScalingMode     string `json:"scaling_mode"`      // async, sync or dual
	Autoscaler      string `json:"autoscaler"`        // kpa, or sync (a sandbox per waiting call, peaks held)
	Placement       string `json:"placement"`         // the control plane's choice of node
	LoadBalancing   string `json:"load_balancing"`    // the data plane's choice of sandbox
	KeepAlivePolicy string `json:"keep_alive_policy"` // ttl or gd
	// KeepAlive is how long an idle sandbox lives without memory pressure.
	KeepAlive string `json:"keep_alive"`
}

// SandboxStatus is one sandbox as the control plane sees it.
type SandboxStatus struct {
	ID       string `json:"id"`
	Node     string `json:"node"`
	State    string `json:"state"`
	Address  string `json:"address,omitempty"`
	Revision uint64 `json:"revision"`
}

// StatusView is the cluster overview of GET /v1/status.
type StatusView struct {
	ControlPlane string            `json:"control_plane"`
	Nodes        []NodeStatus      `json:"nodes"`
	DataPlanes   []DataPlaneStatus `json:"data_planes"`
	Functions    []FunctionSummary `json:"functions"`
}

// NodeStatus is one worker node.
type NodeStatus struct {
	ID          string         `json:"id"`
	Address     string         `json:"address"`
	Runtime     string         `json:"runtime"`
	Connected   bool           `json:"connected"`
	Drain       bool           `json:"drain"`
	Sandboxes   int            `json:"sandboxes"`
	Capacity    spec.Resources `json:"capacity"`
	Requested   spec.Resources `json:"requested"`
	HeartbeatMs int64          `json:"heartbeat_age_ms"`
	// Used is what the worker's last heartbeat said its regular and
	// emergency sandboxes use; Emergency is its emergency track (the dual
	// track's one-shot sandboxes, which are in no table).
	Used      spec.Resources   `json:"used"`
	Emergency *EmergencyStatus `json:"emergency,omitempty"`
	// Templates is the memory the node's templates (pre-initialised
	// language runtimes) held at its last heartbeat. No request covers
	// it: placement takes it off the node's capacity.
	Templates spec.Resources `json:"templates"`
}

// EmergencyStatus is a worker node's emergency track at its last heartbeat.
type EmergencyStatus struct {
	Slots   int   `json:"slots"`
	InUse   int   `json:"in_use"`
	Started int64 `json:"started"`
	Failed  int64 `json:"failed"`
	// MemoryMBSeconds is Σ requested MiB × lifetime of the ended ones.
	MemoryMBSeconds float64 `json:"memory_mb_seconds"`
}

// CodeUpload answers POST /v1/code: the archive's digest, which a spec's
// code.digest names, and what it holds.
type CodeUpload struct {
	Digest       string `json:"digest"`
	Size         int64  `json:"size"`          // the zip's bytes
	Files        int    `json:"files"`         // regular files in it
	UnpackedSize int64  `json:"unpacked_size"` // their bytes
}

// DataPlane is a registered data plane.
type DataPlane struct {
	ID           string    `json:"id"`
	Address      string    `json:"address"`
	RegisteredAt time.Time `json:"registered_at"`
	KeyID        string    `json:"key_id,omitempty"` // the key its certificate was issued for
}

// DataPlaneStatus is one registered data plane and whether it follows the
// endpoint stream now.
type DataPlaneStatus struct {
	*DataPlane
	Connected    bool  `json:"connected"`
	LastReportMs int64 `json:"last_report_age_ms"` // -1: never reported
}

// FunctionSummary is one line of the status overview.
type FunctionSummary struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	Desired  int    `json:"desired"`
	Ready    int    `json:"ready"`
	Pending  int    `json:"pending"`
	// Condition: why the function lacks sandboxes (FunctionStatus).
	Condition string `json:"condition,omitempty"`
	Message   string `json:"message,omitempty"`
}

// AdminTokenFile is the file in a control plane's data dir where it writes
// the first admin token (mode 0600) when it finds no token at all; the CLI
// and client.FromEnv read it when given no other token.
const AdminTokenFile = "admin.token"

// NamespaceRequest creates or changes a namespace (PUT /v1/namespaces/NAME).
type NamespaceRequest struct {
	// Quota replaces the namespace's quota; absent (null) keeps it (a new
	// namespace's: unlimited).
	Quota *spec.Quota `json:"quota,omitempty"`
	// Egress replaces the namespace's egress policy; absent (null) keeps
	// it, {} removes it.
	Egress *spec.EgressPolicy `json:"egress,omitempty"`
}

// NamespaceView is a namespace with its quota and current use.
type NamespaceView struct {
	Name      string            `json:"name"`
	Quota     spec.Quota        `json:"quota"`
	Egress    spec.EgressPolicy `json:"egress,omitzero"`
	Usage     NamespaceUsage    `json:"usage"`
	CreatedAt time.Time         `json:"created_at,omitzero"`
}

// NamespaceUsage is what a namespace's functions hold now.
type NamespaceUsage struct {
	Functions int   `json:"functions"`
	Sandboxes int   `json:"sandboxes"`
	MilliCPU  int64 `json:"cpu_milli"`
	MemoryMB  int64 `json:"memory_mb"`
}

// SecretRequest creates (POST /v1/secrets) or replaces (PUT
// /v1/secrets/NAME) a secret. Exactly one of Value (text) and RawValue
// (bytes, base64 in JSON) is set; an empty value is allowed.
type SecretRequest struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Value     string `json:"value,omitempty"`
	RawValue  []byte `json:"raw_value,omitempty"`
}

// SecretView is a secret as the admin API shows it: never its value.
type SecretView struct {
	Name      string    `json:"name"`
	Namespace string    `json:"namespace"`
	Size      int       `json:"size"` // bytes
	UsedBy    []string  `json:"used_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// TokenRequest creates an API token (POST /v1/tokens).
type TokenRequest struct {
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes"`
	Functions []string `json:"functions,omitempty"`
	Namespace string   `json:"namespace,omitempty"`
}

// TokenView is a token as the admin API shows it: never its secret, but
// for the answer to its creation (Token).
type TokenView struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Scopes    []string  `json:"scopes"`
	Functions []string  `json:"functions,omitempty"`
	Namespace string    `json:"namespace,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Token     string    `json:"token,omitempty"`
}

// CallStatus is where an asynchronous call is.
type CallStatus string

// A call is queued (waiting, or waiting for its next attempt), running,
// then succeeded (a 2xx or 3xx reply), failed (the function's own error,
// not retried) or dead (retries used up, too old, or its function gone).
// Failed and dead calls are also in the dead-letter stream.
const (
	CallQueued    CallStatus = "queued"
	CallRunning   CallStatus = "running"
	CallSucceeded CallStatus = "succeeded"
	CallFailed    CallStatus = "failed"
	CallDead      CallStatus = "dead"
)

// Final reports whether s is an end state.
func (s CallStatus) Final() bool {
	return s == CallSucceeded || s == CallFailed || s == CallDead
}

// CallRecord is an asynchronous call's status (GET /v1/calls/ID).
type CallRecord struct {
	ID       string `json:"id"`
	Function string `json:"function"`
	// FunctionUID is the identity of the function it was submitted to
	// (spec.Function.UID): a function made later under the same name is
	// another, and neither sees nor runs this call.
	FunctionUID   string     `json:"function_uid,omitempty"`
	Status        CallStatus `json:"status"`
	Attempts      int        `json:"attempts"`
	SubmittedAt   time.Time  `json:"submitted_at"`
	StartedAt     *time.Time `json:"started_at,omitempty"`  // of the last attempt
	FinishedAt    *time.Time `json:"finished_at,omitempty"` // of the last attempt
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// Error says why the last attempt failed (or why the call is dead).
	Error       string      `json:"error,omitempty"`
	Result      *CallResult `json:"result,omitempty"`
	CallbackURL string      `json:"callback_url,omitempty"`
	// Callback is "delivered" or why the last callback try failed.
	Callback string `json:"callback,omitempty"`
}

// CallResult is the reply of a call's last attempt.
type CallResult struct {
	Status    int         `json:"status"`
	Header    http.Header `json:"headers,omitempty"`
	Body      []byte      `json:"body,omitempty"` // base64 in JSON
	Truncated bool        `json:"body_truncated,omitempty"`
	// BodyBytes is the body's length where the status record does not
	// hold it: a body above 4 KiB is kept apart, in its namespace's result
	// budget (lists leave it out; a call's own record has it).
	BodyBytes int `json:"body_bytes,omitempty"`
	// BodyDropped says the body is gone: its namespace's result budget
	// (--async-namespace-result-bytes) dropped it for newer ones.
	BodyDropped bool `json:"body_dropped,omitempty"`
	// PlatformError is brisk's reason (X-Brisk-Error) when brisk, not the
	// function, answered: no-capacity, queue-timeout, sandbox-failed, ...
	PlatformError string  `json:"platform_error,omitempty"`
	Seconds       float64 `json:"duration_seconds"`
}

// LogLine is one line of a sandbox's output (GET /v1/functions/NAME/logs,
// NDJSON). Time is when the worker read it: for lines already in a log,
// the log's last write (lines carry no time of their own).
type LogLine struct {
	Function string    `json:"function"`
	Sandbox  string    `json:"sandbox"`
	Node     string    `json:"node"`
	Time     time.Time `json:"time"`
	Text     string    `json:"text"`
}

// TriggerView is a trigger as the admin API shows it: its spec and what
// it has done (counts since this control plane became leader).
type TriggerView struct {
	spec.Trigger
	Status TriggerStatus `json:"status"`
}

// TriggerStatus is a trigger's state.
type TriggerStatus struct {
	// State: "active", "paused", or "failing" (its last firing or
	// subscription failed: LastError says why).
	State string `json:"state"`
	// LastTick is the last scheduled tick fired (cron); Next the next one.
	LastTick time.Time `json:"last_tick,omitzero"`
	Next     time.Time `json:"next,omitzero"`
	// Fired counts calls queued, Failed firings that could not be.
	Fired     uint64 `json:"fired"`
	Failed    uint64 `json:"failed"`
	LastError string `json:"last_error,omitempty"`
}

// TriggerRef names a trigger of a function (GET /v1/functions/NAME).
type TriggerRef struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Paused bool   `json:"paused,omitempty"`
}

// Package spec defines a registered function: its user-facing JSON form, its
// defaults and validation, and its conversion to the wire form.
package spec

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
)

// ErrInvalid marks a spec that failed validation; the message names the field.
var ErrInvalid = errors.New("invalid function spec")

// Builtins are the functions a worker can run without any artifact.
// "watchdog" is OpenFaaS's classic watchdog: it forks the command in the
// env variable fprocess for each request (process runtime).
var Builtins = []string{"trace", "watchdog"}

// BuiltinImagePrefix names a built-in function where a client's format
// wants an image (OpenFaaS, Knative): "brisk.dev/builtin/trace".
const BuiltinImagePrefix = "brisk.dev/builtin/"

// Function is a registered function as users see it in the admin API.
type Function struct {
	Name string `json:"name"`
	// Namespace is the tenant the function belongs to (DefaultNamespace
	// when empty): tokens bound to a namespace see and touch only its
	// functions, and its quota bounds them. Outside the default namespace
	// a function's name is NAME.NAMESPACE (Qualify), as OpenFaaS addresses
	// it, so that each namespace has names of its own.
	Namespace string   `json:"namespace,omitempty"`
	Builtin   string   `json:"builtin,omitempty"`
	Command   []string `json:"command,omitempty"`
	Image     string   `json:"image,omitempty"`
	// Code is source code brisk runs in a managed language runtime
	// (Python, Node): the fourth kind of function, after builtin, command
	// and image.
	Code          *Code             `json:"code,omitempty"`
	Port          int               `json:"port,omitempty"`
	Env           map[string]string `json:"env,omitempty"`
	Resources     Resources         `json:"resources"`
	Limits        Resources         `json:"limits,omitzero"`
	Concurrency   int               `json:"concurrency"`
	Scaling       Scaling           `json:"scaling"`
	Queue         Queue             `json:"queue"`
	Timeout       Duration          `json:"timeout"`
	LoadBalancing string            `json:"load_balancing,omitempty"`
	// Placement chooses the worker for each new sandbox (one of
	// Placements; "" = the cluster's policy). The locality policies
	// (sharding, ch-bl, ch-rlu, locality) keep a function's sandboxes where
	// its image and sandboxes already are.
	Placement string `json:"placement,omitempty"`
	// WritableRoot gives a container a writable root file system (its own
	// copy-on-write layer); by default the root is read-only and only /tmp
	// is writable. Process and emulated sandboxes ignore it.
	WritableRoot bool `json:"writable_root,omitempty"`
	// StreamRequests sends request bodies to the function as they arrive,
	// so a client and the function can talk over one call (a chunked body
	// up, a chunked reply down). By default a body is read before the call
	// takes a sandbox slot, so that a slow client holds only its
	// connection; a streaming function's slow clients hold its sandboxes.
	StreamRequests bool `json:"stream_requests,omitempty"`
	// Auth says who may call the function: AuthToken (the default: a token
	// with the invoke scope for it) or AuthPublic (anyone who reaches a
	// data plane).
	Auth string `json:"auth,omitempty"`
	// Async is how the function's asynchronous calls are retried.
	Async Async `json:"async,omitzero"`
	// Labels and Annotations are the user's metadata, kept as given (the
	// OpenFaaS API's labels and annotations; brisk reads none of them
	// except where docs/compatibility.md says).
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Secrets names secrets of the function's namespace that its sandboxes
	// see as read-only files, /var/openfaas/secrets/NAME (OpenFaaS's path;
	// SecretsDir). Each must exist when the function is deployed.
	Secrets []string `json:"secrets,omitempty"`
	// SecretData holds the named secrets' values on their way to a worker
	// (the link's spec, never the admin API's or a data plane's): the
	// runtimes write them into the sandbox. Never serialised as JSON.
	SecretData map[string][]byte `json:"-"`
	// Traffic splits calls between revisions (Knative's traffic block):
	// empty sends every call to the current revision. It is not part of a
	// revision: an update keeps it, and changing it makes no revision
	// (PUT /v1/functions/NAME/traffic).
	Traffic []TrafficTarget `json:"traffic,omitempty"`

	// Set by the control plane. Revision identifies this version of the
	// spec everywhere (workers, data planes, pinned revisions' functions):
	// unique across deletes and re-creates of the name. Generation numbers
	// the function's revisions 1, 2, 3, ...: what people call "revision N"
	// (fn list, fn revisions, fn rollback N, traffic rev-N); 0 for a
	// revision made before generations existed.
	// UID is the function's identity, made at its creation and kept by its
	// revisions, never reused: a function made again under a deleted
	// one's name (in any namespace) has another, and sees none of the
	// deleted one's calls or results. Empty for functions made before uids.
	UID        string    `json:"uid,omitempty"`
	Revision   uint64    `json:"revision,omitempty"`
	Generation uint64    `json:"generation,omitempty"`
	CreatedAt  time.Time `json:"created_at,omitzero"`
	UpdatedAt  time.Time `json:"updated_at,omitzero"`
}

// RevisionNumber is f's revision as people read it: its generation, or
// its revision id where it has none.
func (f *Function) RevisionNumber() uint64 {
	if f.Generation > 0 {
		return f.Generation
	}
	return f.Revision
}

// Resources are what one sandbox requests from its node (placement counts
// them) or, as Limits, the most it may use.
type Resources struct {
	MilliCPU int64 `json:"cpu_milli"`
	MemoryMB int64 `json:"memory_mb"`
}

// Scaling holds the per-function autoscaler overrides (Knative KPA names).
// Zero values mean "the cluster default".
type Scaling struct {
	Min               int      `json:"min"`
	Max               int      `json:"max"`
	Target            float64  `json:"target,omitempty"`             // in-flight per sandbox before utilization
	TargetUtilization float64  `json:"target_utilization,omitempty"` // (0,1]
	StableWindow      Duration `json:"stable_window,omitzero"`
	PanicWindowPct    float64  `json:"panic_window_percent,omitempty"`
	PanicThreshold    float64  `json:"panic_threshold,omitempty"` // ratio, e.g. 2.0
	ScaleToZeroGrace  Duration `json:"scale_to_zero_grace,omitzero"`
	MaxScaleUpRate    float64  `json:"max_scale_up_rate,omitempty"`
	MaxScaleDownRate  float64  `json:"max_scale_down_rate,omitempty"`
	// Mode is how calls meet capacity: ModeAsync, ModeSync or ModeDual; ""
	// means the cluster default (the control plane's --scaling-mode).
	Mode string `json:"mode,omitempty"`
	// KeepAlive is how long an idle sandbox is kept after its function's
	// demand falls (0: the policy's default: ttl keeps it for the stable
	// window plus the scale-to-zero grace, gd for DefaultGDKeepAlive unless
	// its memory is needed first). Whole seconds, at most 1h.
	KeepAlive Duration `json:"keep_alive,omitzero"`
	// KeepAlivePolicy is KeepAliveTTL, KeepAliveGD or KeepAliveHybrid; "" means the
	// cluster's (the control plane's --keep-alive-policy, default gd).
	KeepAlivePolicy string `json:"keep_alive_policy,omitempty"`
}

// Keep-alive policies (docs/policies.md, Keep-alive).
const (
	// KeepAliveTTL: an idle sandbox leaves once its function's demand has
	// been below it for the keep-alive.
	KeepAliveTTL = "ttl"
	// KeepAliveGD (the default): idle sandboxes stay for KeepAlive
	// (DefaultGDKeepAlive) unless a new sandbox finds no room first; then
	// FaasCache's Greedy-Dual-Size-Frequency order picks which to evict.
	KeepAliveGD = "gd"
	// KeepAliveHybrid: Shahrad et al.'s hybrid histogram policy (Azure
	// Functions'): from the function's idle times, a pre-warm window (it
	// is unloaded after a call and brought back before the next is due)
	// and a keep-alive window per function; KeepAlive (default
	// DefaultGDKeepAlive) while its histogram does not yet say.
	KeepAliveHybrid = "hybrid"
)

// DefaultGDKeepAlive is the longest gd keeps an idle sandbox when neither
// the spec nor the cluster sets a keep-alive: on azure_500 it creates fewer
// sandboxes than Dirigent with half the slowdown of Knative's 90 s
// (docs/policies.md, "Keep-alive and sandbox churn").
const DefaultGDKeepAlive = 15 * time.Minute

// KeepAlivePolicies are the keep-alive policies a spec or a cluster may choose.
var KeepAlivePolicies = []string{KeepAliveTTL, KeepAliveGD, KeepAliveHybrid}

// Scaling modes.
const (
	// ModeAsync: every call waits for a regular sandbox, which the
	// autoscaler adds asynchronously (Knative).
	ModeAsync = "async"
	// ModeSync: Lambda-like: a waiting call gets a sandbox at once, and
	// the function keeps the most sandboxes any second's demand needed for
	// its keep-alive (the stable window plus the scale-to-zero grace).
	ModeSync = "sync"
	// ModeDual: a call that finds no free regular sandbox is served at once
	// by a one-shot emergency sandbox on a worker, while regular sandboxes
	// keep scaling asynchronously (PulseNet).
	ModeDual = "dual"
)

// ScalingModes are the modes a spec or a cluster may choose.
var ScalingModes = []string{ModeAsync, ModeSync, ModeDual}

// Async is a function's policy for asynchronous calls (POST
// /async-function/NAME, Prefer: respond-async). Zero fields take the
// defaults below (Async.WithDefaults).
type Async struct {
	// MaxAttempts counts every attempt, the first included.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// MaxAge: a call older than this (from its submit) is not tried again.
	MaxAge Duration `json:"max_age,omitzero"`
	// Backoff is the delay before the second attempt; it doubles after
	// each failed attempt up to BackoffMax.
	Backoff    Duration `json:"backoff,omitzero"`
	BackoffMax Duration `json:"backoff_max,omitzero"`
	// RetryFunctionErrors retries the function's own 5xx replies too; by
	// default only the platform's failures (no capacity, queue timeout, a
	// sandbox that failed, 429) are retried.
	RetryFunctionErrors bool `json:"retry_function_errors,omitempty"`
	// Concurrency bounds the function's asynchronous calls running at once
	// per data plane; they wait behind synchronous calls in its queue.
	Concurrency int `json:"concurrency,omitempty"`
}

// Async defaults.
const (
	DefaultAsyncMaxAttempts = 5
	DefaultAsyncMaxAge      = 6 * time.Hour
	DefaultAsyncBackoff     = time.Second
	DefaultAsyncBackoffMax  = 5 * time.Minute
	DefaultAsyncConcurrency = 100
)

// WithDefaults returns a with zero fields set to the defaults.
func (a Async) WithDefaults() Async {
	if a.MaxAttempts == 0 {
		a.MaxAttempts = DefaultAsyncMaxAttempts
	}
	if a.MaxAge == 0 {
		a.MaxAge = Duration(DefaultAsyncMaxAge)
	}
	if a.Backoff == 0 {
		a.Backoff = Duration(DefaultAsyncBackoff)
	}
	if a.BackoffMax == 0 {
		a.BackoffMax = Duration(DefaultAsyncBackoffMax)
	}
	if a.Concurrency == 0 {
		a.Concurrency = DefaultAsyncConcurrency
	}
	return a
}

func (a Async) validate(bad func(field, format string, args ...any) error) error {
	switch {
	case a.MaxAttempts < 0 || a.MaxAttempts > 1000:
		return bad("async.max_attempts", "%d out of range [0, 1000] (0 = %d)", a.MaxAttempts, DefaultAsyncMaxAttempts)
	case a.MaxAge < 0 || a.MaxAge > Duration(7*24*time.Hour):
		return bad("async.max_age", "%s out of range [0, 168h]", a.MaxAge)
	case a.Backoff < 0 || a.Backoff > Duration(time.Hour):
		return bad("async.backoff", "%s out of range [0, 1h]", a.Backoff)
	case a.BackoffMax < 0 || a.BackoffMax > Duration(24*time.Hour):
		return bad("async.backoff_max", "%s out of range [0, 24h]", a.BackoffMax)
	case a.Backoff > 0 && a.BackoffMax > 0 && a.BackoffMax < a.Backoff:
		return bad("async.backoff_max", "%s is below async.backoff %s", a.BackoffMax, a.Backoff)
	case a.Concurrency < 0 || a.Concurrency > 100_000:
		return bad("async.concurrency", "%d out of range [0, 100000] (0 = %d)", a.Concurrency, DefaultAsyncConcurrency)
	}
	return nil
}

// Queue bounds the requests one data plane holds for a function while no
// sandbox slot is free.
type Queue struct {
	Depth   int      `json:"depth"`
	Timeout Duration `json:"timeout"`
}

// Defaults applied to fields left zero.
const (
	DefaultPort         = 8080
	DefaultMilliCPU     = 250
	DefaultMemoryMB     = 128
	DefaultConcurrency  = 1
	DefaultQueueDepth   = 1000
	DefaultQueueTimeout = 30 * time.Second
	DefaultTimeout      = 5 * time.Minute
)

// DefaultNamespace holds the functions deployed without a namespace; it
// exists in every cluster and has no quota unless one is set.
const DefaultNamespace = "default"

// Quota bounds what one namespace's functions may hold; zero fields are
// unlimited.
type Quota struct {
	MaxFunctions int   `json:"max_functions,omitempty"`
	MaxSandboxes int   `json:"max_sandboxes,omitempty"` // at once, all its functions'
	MaxMilliCPU  int64 `json:"max_cpu_milli,omitempty"` // requested by its sandboxes at once
	MaxMemoryMB  int64 `json:"max_memory_mb,omitempty"` // requested by its sandboxes at once
	MaxScale     int   `json:"max_scale,omitempty"`     // one function's scaling.min/max
}

// Validate checks a quota's fields.
func (q Quota) Validate() error {
	if q.MaxFunctions < 0 || q.MaxSandboxes < 0 || q.MaxMilliCPU < 0 || q.MaxMemoryMB < 0 || q.MaxScale < 0 {
		return fmt.Errorf("%w: quota: fields must not be negative (0 = unlimited)", ErrInvalid)
	}
	return nil
}

// NamespaceOf is f's namespace (records stored before namespaces existed
// have none: the default one).
func NamespaceOf(f *Function) string {
	if f.Namespace == "" {
		return DefaultNamespace
	}
	return f.Namespace
}

// ValidNamespace reports whether ns may name a namespace (a DNS label).
func ValidNamespace(ns string) bool { return len(ns) <= 63 && isLabel(ns) }

// ValidName reports whether name may name a function: a DNS label, or
// LABEL.NAMESPACE (Qualify), at most 63 characters in all so that it stays
// a valid host name and Kubernetes label value.
func ValidName(name string) bool {
	if len(name) > 63 {
		return false
	}
	short, ns, ok := strings.Cut(name, ".")
	return isLabel(short) && (!ok || isLabel(ns))
}

// Qualify is the full name of function name in namespace ns: name itself
// in the default namespace or when it is qualified already, else
// NAME.NAMESPACE. Names are per namespace this way: two tenants' "api"
// are api.team-a and api.team-b, and a tenant cannot learn from a refused
// create that a name exists in another namespace.
func Qualify(name, ns string) string {
	if name == "" || ns == "" || ns == DefaultNamespace || strings.IndexByte(name, '.') >= 0 {
		return name
	}
	return name + "." + ns
}

// NameNamespace is the namespace a function's full name says: NAMESPACE of
// NAME.NAMESPACE, "" for a bare name.
func NameNamespace(name string) string {
	_, ns, _ := strings.Cut(name, ".")
	return ns
}

// ShortName is a function's name without its namespace: NAME of
// NAME.NAMESPACE (what OpenFaaS and Kubernetes call it within its
// namespace).
func ShortName(name string) string {
	short, _, _ := strings.Cut(name, ".")
	return short
}

// Invocation auth modes (Function.Auth).
const (
	AuthToken  = "token"
	AuthPublic = "public"
)

// isLabel reports whether s is a DNS label's characters,
// ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ (TestIsLabel holds it to that pattern):
// lower-case letters, digits and inner hyphens. By hand: every registration checks two or three names,
// and the regexp was a tenth of the admin API's validation cost.
func isLabel(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// ApplyDefaults fills fields left zero with brisk's defaults.
func (f *Function) ApplyDefaults() {
	if f.Port == 0 {
		f.Port = DefaultPort
	}
	if f.Resources.MilliCPU == 0 {
		f.Resources.MilliCPU = DefaultMilliCPU
	}
	if f.Resources.MemoryMB == 0 {
		f.Resources.MemoryMB = DefaultMemoryMB
	}
	if f.Concurrency == 0 {
		f.Concurrency = DefaultConcurrency
	}
	if f.Queue.Depth == 0 {
		f.Queue.Depth = DefaultQueueDepth
	}
	if f.Queue.Timeout == 0 {
		f.Queue.Timeout = Duration(DefaultQueueTimeout)
	}
	if f.Timeout == 0 {
		f.Timeout = Duration(DefaultTimeout)
	}
	if f.Auth == "" {
		f.Auth = AuthToken
	}
	if f.Namespace == "" {
		f.Namespace = cmp.Or(NameNamespace(f.Name), DefaultNamespace)
	}
	if f.Code != nil {
		f.Code.applyDefaults()
	}
}

// Validate checks a spec after ApplyDefaults. The error wraps ErrInvalid and
// names the offending field.
func (f *Function) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
	}
	if f.Name == "" {
		return bad("name", "required")
	}
	if !ValidName(f.Name) {
		return bad("name", "%q must be a DNS label (lowercase letters, digits and '-'), or LABEL.NAMESPACE, at most 63 characters", f.Name)
	}
	if ns := NameNamespace(f.Name); ns != "" && ns != f.Namespace {
		return bad("name", "%q is a name of namespace %q, not of %q", f.Name, ns, f.Namespace)
	} else if ns == DefaultNamespace {
		return bad("name", "%q: the default namespace's functions have bare names (%q)", f.Name, ShortName(f.Name))
	}
	kinds := 0
	for _, set := range []bool{f.Builtin != "", len(f.Command) > 0, f.Image != "", f.Code != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return bad("builtin/command/image/code", "exactly one must be set (got %d)", kinds)
	}
	if f.Code != nil {
		if err := f.Code.validate(bad); err != nil {
			return err
		}
	}
	if f.Builtin != "" && !contains(Builtins, f.Builtin) {
		return bad("builtin", "%q is not one of %s", f.Builtin, strings.Join(Builtins, ", "))
	}
	if f.Builtin == "watchdog" && strings.TrimSpace(f.Env["fprocess"]) == "" {
		return bad("env.fprocess", "the watchdog built-in runs the command in env fprocess: it is required")
	}
	if len(f.Command) > 0 && strings.TrimSpace(f.Command[0]) == "" {
		return bad("command", "first element (the program) is empty")
	}
	if f.Port < 1 || f.Port > 65535 {
		return bad("port", "%d out of range [1, 65535]", f.Port)
	}
	for k := range f.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return bad("env", "invalid variable name %q", k)
		}
	}
	if err := f.validateStrings(bad); err != nil {
		return err
	}
	if f.Resources.MilliCPU < 0 || f.Resources.MilliCPU > 1_000_000 {
		return bad("resources.cpu_milli", "%d out of range [0, 1000000]", f.Resources.MilliCPU)
	}
	if f.Resources.MemoryMB < 0 || f.Resources.MemoryMB > 1<<20 {
		return bad("resources.memory_mb", "%d out of range [0, 1048576]", f.Resources.MemoryMB)
	}
	if f.Limits.MilliCPU < 0 || f.Limits.MilliCPU > 1_000_000 {
		return bad("limits.cpu_milli", "%d out of range [0, 1000000] (0 = no CPU cap)", f.Limits.MilliCPU)
	}
	if f.Limits.MemoryMB < 0 || f.Limits.MemoryMB > 1<<20 {
		return bad("limits.memory_mb", "%d out of range [0, 1048576] (0 = resources.memory_mb)", f.Limits.MemoryMB)
	}
	if f.Concurrency < 0 || f.Concurrency > 10000 {
		return bad("concurrency", "%d out of range [0, 10000] (0 = the default, 1)", f.Concurrency)
	}
	if err := f.Scaling.validate(bad); err != nil {
		return err
	}
	if err := f.Async.validate(bad); err != nil {
		return err
	}
	if f.Queue.Depth < 0 || f.Queue.Depth > 1_000_000 {
		return bad("queue.depth", "%d out of range [0, 1000000]", f.Queue.Depth)
	}
	if f.Queue.Timeout < 0 {
		return bad("queue.timeout", "%s must not be negative", f.Queue.Timeout)
	}
	if f.Timeout < 0 || time.Duration(f.Timeout) > time.Hour {
		return bad("timeout", "%s out of range [0, 1h]", f.Timeout)
	}
	if !ValidNamespace(f.Namespace) {
		return bad("namespace", "%q must be a DNS label: lowercase letters, digits and '-', at most 63 characters", f.Namespace)
	}
	if f.Auth != AuthToken && f.Auth != AuthPublic {
		return bad("auth", "%q is not %q or %q", f.Auth, AuthToken, AuthPublic)
	}
	if f.LoadBalancing != "" && !contains(LoadBalancers, f.LoadBalancing) {
		return bad("load_balancing", "%q is not one of %s", f.LoadBalancing, strings.Join(LoadBalancers, ", "))
	}
	if f.Placement != "" && !contains(Placements, f.Placement) {
		return bad("placement", "%q is not one of %s", f.Placement, strings.Join(Placements, ", "))
	}
	if err := ValidateTraffic(f.Traffic); err != nil {
		return err
	}
	if len(f.Secrets) > MaxSecretsPerFunction {
		return bad("secrets", "%d secrets, at most %d", len(f.Secrets), MaxSecretsPerFunction)
	}
	seen := make(map[string]bool, len(f.Secrets))
	for _, n := range f.Secrets {
		if !ValidSecretName(n) {
			return bad("secrets", "%q: %s", n, SecretNameRule)
		}
		if seen[n] {
			return bad("secrets", "%q is listed twice", n)
		}
		seen[n] = true
	}
	return nil
}

// SecretsDir is where a sandbox finds its function's secrets, one file per
// secret: OpenFaaS's path, so that its functions run unchanged.
const SecretsDir = "/var/openfaas/secrets"

// Secret limits: a value as large as a Kubernetes Secret's, a bound on
// what one sandbox start must carry, and bounds on what one namespace may
// hold (the control plane keeps every value in memory).
const (
	MaxSecretSize              = 1 << 20
	MaxSecretsPerFunction      = 32
	MaxSecretsPerNamespace     = 256
	MaxSecretBytesPerNamespace = 64 << 20
)

// SecretNameRule says what ValidSecretName accepts.
const SecretNameRule = "a secret name is 1-253 lowercase letters, digits, '-', '_' and '.', starting with a letter or digit"

// ValidSecretName accepts names that are safe as one file name in
// SecretsDir (Kubernetes' key characters, lowercased).
func ValidSecretName(s string) bool {
	if s == "" || len(s) > 253 || s[0] == '.' || s[0] == '-' || s[0] == '_' {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// SandboxLimits are the hard limits a runtime enforces on one sandbox. Memory
// defaults to the requested memory (as in Lambda, the memory size is the
// limit). CPU is capped only when limits.cpu_milli is set: a quota equal to
// a small request would throttle every call in 100 ms steps, so by default
// the request only weighs the sandbox's share of a busy CPU.
func (f *Function) SandboxLimits() Resources {
	l := f.Limits
	if l.MemoryMB == 0 {
		l.MemoryMB = f.Resources.MemoryMB
	}
	return l
}

// Placements are the placement policy names a spec may choose.
var Placements = []string{"kubernetes", "random", "round-robin", "bin-packing", "sharding", "ch-bl", "ch-rlu", "locality"}

// LoadBalancers are the data-plane policy names a spec may choose.
var LoadBalancers = []string{"least-loaded", "knative", "round-robin", "first-available", "power-of-two", "random"}

func (s *Scaling) validate(bad func(field, format string, args ...any) error) error {
	switch {
	case s.Min < 0:
		return bad("scaling.min", "%d must not be negative", s.Min)
	case s.Max < 0:
		return bad("scaling.max", "%d must not be negative (0 = unbounded)", s.Max)
	case s.Max > 0 && s.Min > s.Max:
		return bad("scaling.min", "%d is above scaling.max %d", s.Min, s.Max)
	case s.Target < 0 || s.Target > 1e6:
		return bad("scaling.target", "%g out of range [0, 1000000]", s.Target)
	case s.TargetUtilization < 0 || s.TargetUtilization > 1:
		return bad("scaling.target_utilization", "%g out of range (0, 1]", s.TargetUtilization)
	case s.StableWindow != 0 && (s.StableWindow < Duration(time.Second) || s.StableWindow > Duration(time.Hour)):
		return bad("scaling.stable_window", "%s out of range [1s, 1h]", s.StableWindow)
	case s.StableWindow%Duration(time.Second) != 0:
		// The autoscaler counts its windows in whole seconds (Knative's rule).
		return bad("scaling.stable_window", "%s is not a whole number of seconds", s.StableWindow)
	case s.PanicWindowPct != 0 && (s.PanicWindowPct < 1 || s.PanicWindowPct > 100):
		return bad("scaling.panic_window_percent", "%g out of range [1, 100]", s.PanicWindowPct)
	case s.PanicThreshold != 0 && (s.PanicThreshold <= 1 || s.PanicThreshold > 1000):
		return bad("scaling.panic_threshold", "%g out of range (1, 1000]", s.PanicThreshold)
	case s.ScaleToZeroGrace < 0 || s.ScaleToZeroGrace > Duration(24*time.Hour):
		return bad("scaling.scale_to_zero_grace", "%s out of range [0, 24h]", s.ScaleToZeroGrace)
	case s.MaxScaleUpRate != 0 && (s.MaxScaleUpRate <= 1 || s.MaxScaleUpRate > 1e6):
		return bad("scaling.max_scale_up_rate", "%g out of range (1, 1000000]", s.MaxScaleUpRate)
	case s.MaxScaleDownRate != 0 && (s.MaxScaleDownRate <= 1 || s.MaxScaleDownRate > 1e6):
		return bad("scaling.max_scale_down_rate", "%g out of range (1, 1000000]", s.MaxScaleDownRate)
	case s.Mode != "" && !contains(ScalingModes, s.Mode):
		return bad("scaling.mode", "%q: want one of %v", s.Mode, ScalingModes)
	case s.KeepAlive < 0 || s.KeepAlive > Duration(time.Hour) || time.Duration(s.KeepAlive)%time.Second != 0:
		return bad("scaling.keep_alive", "%s: want whole seconds in [0, 1h]", s.KeepAlive)
	case s.KeepAlivePolicy != "" && !contains(KeepAlivePolicies, s.KeepAlivePolicy):
		return bad("scaling.keep_alive_policy", "%q: want one of %v", s.KeepAlivePolicy, KeepAlivePolicies)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Decode parses a JSON spec strictly: unknown fields, keys given twice and
// trailing data are errors that wrap ErrInvalid.
func Decode(data []byte) (*Function, error) {
	// The fast path: one pass of the JSON v2 decoder, which is
	// case-sensitive and refuses duplicate and unknown names as the rules
	// below do, at 1/16 of their cost (BenchmarkDecode). Whatever it
	// refuses goes the slow way, which says precisely what is wrong (and
	// accepts what only v2 refuses, such as invalid UTF-8, as before):
	// FuzzDecode checks that both agree on what the fast path accepts.
	var f Function
	if jsonv2.Unmarshal(data, &f, jsonv2.RejectUnknownMembers(true)) == nil {
		return &f, nil
	}
	return decodeStrict(data)
}

// decodeStrict is Decode with encoding/json and the checks it lacks: no
// key twice in one object, field names spelled exactly, no unknown
// fields, nothing after the object.
func decodeStrict(data []byte) (*Function, error) {
	if k, err := duplicateKey(data); err != nil {
		return nil, fmt.Errorf("%w: malformed JSON: %v", ErrInvalid, err)
	} else if k != "" {
		return nil, fmt.Errorf("%w: malformed JSON: key %q appears twice in one object", ErrInvalid, k)
	}
	if k, field := inexactKey(data, reflect.TypeFor[Function]()); k != "" {
		return nil, fmt.Errorf("%w: unknown field %q (field names are case-sensitive: %q)", ErrInvalid, k, field)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f Function
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: malformed JSON: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: malformed JSON: trailing data after the object", ErrInvalid)
	}
	return &f, nil
}

// Duration is a time.Duration that reads and writes JSON as "30s".
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the quoted String, which needs no escaping (digits,
// '.', units): json.Marshal of it was a tenth of a registration's encoding.
func (d Duration) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 24)
	b = append(b, '"')
	b = append(b, time.Duration(d).String()...)
	return append(b, '"'), nil
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if n := len(b); n >= 2 && b[0] == '"' && b[n-1] == '"' && bytes.IndexByte(b[1:n-1], '\\') < 0 && bytes.IndexByte(b[1:n-1], '"') < 0 {
		s = string(b[1 : n-1]) // no escapes: the string is its bytes
	} else if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %v", s, err)
	}
	*d = Duration(v)
	return nil
}

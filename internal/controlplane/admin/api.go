// Package admin is the control plane's admin surface: the REST API
// (functions, code, revisions and traffic, namespaces and quotas, secrets,
// tokens, triggers, logs, status, backup), the dashboard and Dirigent's
// registration API. It reads and changes the cluster only through Cluster,
// which the control plane's cluster implements, and keeps its records in
// the registry (store.Registry). The link to workers and data planes, the
// gRPC service, is the control plane's (internal/controlplane).
package admin

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/policy/prewarm"
	"github.com/brisk-faas/brisk/internal/trigger"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Config is what the admin surface takes of the control plane's
// configuration (controlplane.Config documents each field).
type Config struct {
	// ID is the control plane's, as status and the dashboard show it.
	ID      string
	DataDir string
	Logger  *slog.Logger
	// Registry is the control plane's metrics registry: GET /metrics
	// serves it, and the triggers' metrics join it. Functions is its
	// gauge of registered functions.
	Registry  *prometheus.Registry
	Functions prometheus.Gauge

	AuthDisabled                              bool
	BootstrapAdminToken, BootstrapDeployToken string
	TrustedProxies                            []string
	Caps                                      spec.Caps
	DirigentImages                            string
	DirigentKeepAlive                         time.Duration
	// Replica, when set, is GET /v1/replica's answer; VerifyLeader, when
	// set, is the read barrier (readBarrier).
	Replica      func() any
	VerifyLeader func() error
	// Async and TriggerNATSAllow are the triggers' (nil Async: triggers
	// are refused).
	Async            *async.Queue
	TriggerNATSAllow []netip.Prefix
	// DataPlaneSeen is when data plane id last reported (status).
	DataPlaneSeen func(id string) (time.Time, bool)
}

// Cluster is the cluster as the admin surface sees it: each method takes
// the cluster's lock for one consistent read or change, so that the admin
// API never holds it (nor reads the reconciler) itself.
type Cluster interface {
	Now() time.Time
	// Dash keeps the dashboard's call counts, which the cluster feeds.
	Dash() *DashStats

	Spec(name string) *spec.Function
	FunctionView(name string) (api.FunctionView, bool)
	EachFunction(visit func(*spec.Function, api.FunctionStatus))
	UpsertFunction(f *spec.Function)
	RemoveFunction(name string)
	TableState(now time.Time) (nodes []api.NodeStatus, fns []DashRow, sbxs []DashSandbox, dataPlanes int)
	NodeStatus() []api.NodeStatus
	WatchedDataPlanes() map[string]bool
	WorkerConns() map[string]*grpc.ClientConn

	Quota(ns string) (spec.Quota, bool)
	SetQuotas(q map[string]spec.Quota)
	Usage(ns string) api.NamespaceUsage
	SetEgress(e *briskv1.EgressPolicies)
	SetAuth(enabled bool, grants []auth.Grant)
	SetPrewarmSchedules(scheds map[string][]prewarm.Ticks)

	Secret(ns, name string) *store.Secret
	PutSecret(key string, s *store.Secret)
	SetSecrets(secs []*store.Secret)
	SecretUsers(ns, name string) []string
	SecretUsage(ns, skip string) (n int, bytes int64, exists bool)
	SecretsIn(ns string) []*store.Secret
	MissingSecrets(ns string, names []string) []string
}

// API is the admin surface over one control plane's cluster and registry.
type API struct {
	cfg     Config
	log     *slog.Logger
	cluster Cluster
	store   store.Registry
	// tokens are the registry's tokens: the admin API's and the join
	// tokens workers and data planes present (the link checks those).
	tokens *auth.Checker
	// tokensMu orders token table loads: without it, two writes' loads
	// could publish their reads of the registry in the wrong order and
	// leave the older table in force.
	tokensMu sync.Mutex
	// authThrottle slows token guessing on the admin API: 20 failures at
	// once per client address, then one a second.
	authThrottle *auth.Throttle
	proxyAddrs   atomic.Pointer[[]netip.Addr] // Config.TrustedProxies resolved
	proxyAddrsAt atomic.Int64                 // when (unix ns)
	nameLocks    [64]sync.Mutex
	revMu        sync.Mutex
	lastRev      uint64
	// secretMu orders secret writes and namespace deletions (held)
	// against deploys (read-held): secrets.go, namespaces.go.
	secretMu sync.RWMutex
	// namespaceMu orders namespace updates (one keeps the stored egress
	// policy when its request leaves it out).
	namespaceMu sync.Mutex
	// splits: function name -> the revision functions its traffic split
	// runs (traffic.go).
	splitMu sync.Mutex
	splits  map[string]map[string]bool
	// triggers runs the triggers while this control plane runs (nil
	// without Config.Async); triggerRecs is the registry's triggers by
	// key, written under triggerMu (triggers.go).
	triggers    *trigger.Runner
	triggerMu   sync.Mutex
	triggerRecs map[string]*store.Trigger
}

// New makes the admin surface; it serves nothing until Handler is
// mounted, and reads the registry only after Open. Config fields left nil
// get a logger, a metrics registry and gauge, and data planes never seen,
// of its own.
func New(cfg Config, cluster Cluster, tokens *auth.Checker) *API {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Functions == nil {
		cfg.Functions = prometheus.NewGauge(prometheus.GaugeOpts{Name: "brisk_controlplane_functions", Help: "Registered functions."})
	}
	if cfg.DataPlaneSeen == nil {
		cfg.DataPlaneSeen = func(string) (time.Time, bool) { return time.Time{}, false }
	}
	return &API{cfg: cfg, log: cfg.Logger, cluster: cluster, tokens: tokens,
		authThrottle: auth.NewThrottle(20, time.Second), splits: map[string]map[string]bool{}}
}

// Open gives the admin surface the registry, once the control plane has
// opened it.
func (srv *API) Open(st store.Registry) { srv.store = st }

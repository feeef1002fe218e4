// Package replica is the control plane's registry replicated over a static
// set of control-plane replicas with hashicorp/raft.
//
// A single control plane is a single point of failure: while it is down no
// function can be registered or scaled. Raft keeps the registry on every
// replica and lets a majority elect a new leader within about a second of
// losing the old one, without losing any write that was acknowledged: a
// write returns only once a majority has it in its log and the local replica
// has applied it.
//
// What is replicated is exactly what store.Store keeps durable: functions,
// worker records and data-plane records. Sandbox state is never replicated:
// workers are its source of truth, and a new leader rebuilds it from their
// reports as a restarted single control plane does.
//
// Writes go through the leader; reads are served from the local copy, which
// on a follower may lag the leader by a few milliseconds. A replica that has
// just become leader calls WaitLeader before serving reads, so that it has
// applied everything its predecessor committed.
package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ErrNotLeader marks a write sent to a replica that is not the leader. The
// error is a NotLeaderError naming the leader when this replica knows it.
var ErrNotLeader = errors.New("not the leader")

// ErrClosed marks an operation on a closed Registry.
var ErrClosed = errors.New("replica: closed")

// NotLeaderError is the error of a write on a non-leader;
// errors.Is(err, ErrNotLeader) holds. Get it with errors.As to redirect the
// client to Leader.AdminAddr or Leader.GRPCAddr.
type NotLeaderError struct {
	Leader Peer // valid if Known
	Known  bool // false while an election is under way
}

func (e NotLeaderError) Error() string {
	if !e.Known {
		return "replica: not the leader (no leader elected yet)"
	}
	return fmt.Sprintf("replica: not the leader (leader is %s, admin %s, grpc %s)", e.Leader.ID, e.Leader.AdminAddr, e.Leader.GRPCAddr)
}

func (e NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Default timeouts, tuned for replicas on one LAN or loopback: a dead leader
// is noticed after 300-600 ms without heartbeats (raft randomises up to
// twice the timeout), far above LAN round trips and GC pauses.
const (
	DefaultHeartbeatTimeout   = 300 * time.Millisecond
	DefaultElectionTimeout    = 300 * time.Millisecond
	DefaultLeaderLeaseTimeout = 250 * time.Millisecond
	DefaultCommitTimeout      = 5 * time.Millisecond
)

// Limits of the raft layer.
const (
	// maxAppendEntries bounds one replication batch and one FSM batch.
	// Concurrent writers share log fsyncs and round trips up to this many.
	maxAppendEntries = 256
	transportPool    = 3
	transportTimeout = 2 * time.Second
	retainSnapshots  = 2
	logCacheSize     = 512
	// enqueueTimeout bounds only the wait to hand a write to raft; once
	// queued, a write ends when it commits or the leader steps down.
	enqueueTimeout = 5 * time.Second
)

// Config configures one replica.
type Config struct {
	ID     string       // this replica's id; must be one of Peers
	Peers  []Peer       // the full static membership (3 or 5 replicas; 1 allowed)
	Dir    string       // data dir: raft.db (log and stable store) and snapshots/
	Logger *slog.Logger // nil: slog.Default()
	// TLS, when set, puts the raft stream between replicas under mutual
	// TLS (every peer needs a certificate the other side accepts).
	TLS *Identity

	// Raft timeouts; zero means the Default above. LeaderLeaseTimeout must
	// not exceed HeartbeatTimeout, nor HeartbeatTimeout ElectionTimeout.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration

	// listener, if set, is the already bound raft listener for this
	// replica's RaftAddr (tests bind port 0 first, then build the peers).
	listener net.Listener
	// trailingLogs, if set, is how many log entries a snapshot leaves
	// behind (tests force followers onto the snapshot install path).
	trailingLogs uint64
}

// Registry is a raft-replicated store.Registry. It is safe for concurrent use.
type Registry struct {
	self  Peer
	peers map[string]Peer
	log   *slog.Logger
	fsm   *fsm
	raft  *raft.Raft
	logs  *raftboltdb.BoltStore

	leaderCh chan bool // capacity 1, latest value wins; only watch sends
	stop     chan struct{}
	watchers sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every leadership change

	closeOnce sync.Once
	closeErr  error
	closing   atomic.Bool   // set first in Close: no new writes reach raft
	down      chan struct{} // closed once raft has shut down
}

var _ store.Registry = (*Registry)(nil)

// Open starts this replica: it opens or creates the raft state in cfg.Dir,
// binds the raft transport on its RaftAddr and joins the cluster. A fresh
// data dir bootstraps the configuration from cfg.Peers; every replica may
// do so, since they all bootstrap the identical configuration. A data dir
// with raft state is never bootstrapped again: its log already holds the
// membership.
func Open(cfg Config) (*Registry, error) {
	if err := validatePeers(cfg.Peers); err != nil {
		return nil, err
	}
	var self Peer
	peers := make(map[string]Peer, len(cfg.Peers))
	for _, p := range cfg.Peers {
		peers[p.ID] = p
		if p.ID == cfg.ID {
			self = p
		}
	}
	if self.ID == "" {
		return nil, fmt.Errorf("replica: id %q is not in the peer list", cfg.ID)
	}
	if cfg.Dir == "" {
		return nil, fmt.Errorf("replica: no data dir")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("replica", self.ID)
	hlog := newRaftLogger(logger)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(self.ID)
	rc.Logger = hlog
	rc.HeartbeatTimeout = orDefault(cfg.HeartbeatTimeout, DefaultHeartbeatTimeout)
	rc.ElectionTimeout = orDefault(cfg.ElectionTimeout, DefaultElectionTimeout)
	rc.LeaderLeaseTimeout = orDefault(cfg.LeaderLeaseTimeout, DefaultLeaderLeaseTimeout)
	rc.CommitTimeout = orDefault(cfg.CommitTimeout, DefaultCommitTimeout)
	// Keep a partly set Config valid: defaults yield to explicit values.
	if cfg.LeaderLeaseTimeout == 0 && rc.LeaderLeaseTimeout > rc.HeartbeatTimeout {
		rc.LeaderLeaseTimeout = rc.HeartbeatTimeout
	}
	if cfg.ElectionTimeout == 0 && rc.ElectionTimeout < rc.HeartbeatTimeout {
		rc.ElectionTimeout = rc.HeartbeatTimeout
	}
	rc.MaxAppendEntries = maxAppendEntries
	if cfg.trailingLogs > 0 {
		rc.TrailingLogs = cfg.trailingLogs
	}
	rc.BatchApplyCh = true
	// Unbuffered would block raft's leader loop until watch reads; a small
	// buffer keeps raft moving while watch logs.
	notify := make(chan bool, 8)
	rc.NotifyCh = notify
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}

	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	path := filepath.Join(cfg.Dir, "raft.db")
	boltStore, err := raftboltdb.New(raftboltdb.Options{
		Path:        path,
		BoltOptions: &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType},
	})
	if err != nil {
		return nil, fmt.Errorf("replica: open %s: %w (is another control plane using this data dir?)", path, err)
	}
	cleanup := []func(){func() { boltStore.Close() }}
	fail := func(err error) (*Registry, error) {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		return nil, err
	}
	logs, err := raft.NewLogCache(logCacheSize, boltStore)
	if err != nil {
		return fail(fmt.Errorf("replica: %w", err))
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, retainSnapshots, hlog)
	if err != nil {
		return fail(fmt.Errorf("replica: snapshots: %w", err))
	}

	ln := cfg.listener
	if ln == nil {
		if ln, err = listenOwn(net.Listen, self.RaftAddr, ownNameWait, logger); err != nil {
			return fail(fmt.Errorf("replica: raft transport: %w", err))
		}
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  &streamLayer{Listener: ln, advertise: self.RaftAddr, tls: cfg.TLS},
		MaxPool: transportPool,
		Timeout: transportTimeout,
		Logger:  hlog,
	})
	cleanup = append(cleanup, func() { trans.Close() })

	existing, err := raft.HasExistingState(logs, boltStore, snaps)
	if err != nil {
		return fail(fmt.Errorf("replica: %w", err))
	}
	if !existing {
		var servers []raft.Server
		for _, p := range cfg.Peers {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr)})
		}
		if err := raft.BootstrapCluster(rc, logs, boltStore, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			return fail(fmt.Errorf("replica: bootstrap: %w", err))
		}
		logger.Info("replica: bootstrapped cluster", "peers", len(servers))
	}

	r := &Registry{
		self:     self,
		peers:    peers,
		log:      logger,
		fsm:      newFSM(),
		logs:     boltStore,
		leaderCh: make(chan bool, 1),
		stop:     make(chan struct{}),
		changed:  make(chan struct{}),
		down:     make(chan struct{}),
	}
	r.raft, err = raft.NewRaft(rc, r.fsm, logs, boltStore, snaps, trans)
	if err != nil {
		return fail(fmt.Errorf("replica: start raft: %w", err))
	}
	// Observe leader changes seen from any role, for the log. The observer
	// never blocks raft: a full channel drops the observation.
	obs := make(chan raft.Observation, 16)
	observer := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.raft.RegisterObserver(observer)
	r.watchers.Add(1)
	go func() {
		defer r.watchers.Done()
		defer r.raft.DeregisterObserver(observer)
		r.watch(notify, obs)
	}()
	return r, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// watch turns raft's leadership notifications into LeaderCh values, wakes
// WaitLeader and logs leader changes.
func (r *Registry) watch(notify <-chan bool, obs <-chan raft.Observation) {
	for {
		select {
		case leader := <-notify:
			if leader {
				r.log.Info("replica: became leader")
			} else {
				r.log.Warn("replica: lost leadership")
			}
			// Coalesce: drop an unread value so the latest always fits.
			// Only this goroutine sends, so the send cannot block.
			select {
			case <-r.leaderCh:
			default:
			}
			r.leaderCh <- leader
			r.mu.Lock()
			close(r.changed)
			r.changed = make(chan struct{})
			r.mu.Unlock()
		case o := <-obs:
			lo := o.Data.(raft.LeaderObservation)
			if lo.LeaderID == "" {
				r.log.Info("replica: no leader")
			} else {
				r.log.Info("replica: leader changed", "leader", string(lo.LeaderID), "term", o.Raft.CurrentTerm())
			}
		case <-r.stop:
			return
		}
	}
}

// Close stops this replica: raft shuts down (it does not wait for peers,
// so it returns promptly when they are gone), then the log store closes.
// Reads keep working from the last applied state; writes fail with ErrClosed.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		r.closing.Store(true)
		err := r.raft.Shutdown().Error()
		close(r.down)
		close(r.stop)
		r.watchers.Wait()
		r.closeErr = errors.Join(err, r.logs.Close())
		r.log.Info("replica: closed")
	})
	return r.closeErr
}

// Self returns this replica's peer entry.
func (r *Registry) Self() Peer { return r.self }

// VerifyLeader confirms with a majority that this replica still leads (a
// round of heartbeats): after it, the replica's state holds every write
// acknowledged before the call, so a read served from it is not stale. A
// leader that was cut off or stalled (and replaced meanwhile) gets an error.
func (r *Registry) VerifyLeader() error { return r.raft.VerifyLeader().Error() }

// IsLeader reports whether this replica is the leader right now.
func (r *Registry) IsLeader() bool { return r.raft.State() == raft.Leader }

// Leader returns the current leader as this replica knows it; false while
// none is known (an election is under way or this replica is cut off).
func (r *Registry) Leader() (Peer, bool) {
	addr, id := r.raft.LeaderWithID()
	if id == "" {
		return Peer{}, false
	}
	if p, ok := r.peers[string(id)]; ok {
		return p, true
	}
	// Not in the static list (cannot happen without membership changes):
	// still name it.
	return Peer{ID: string(id), RaftAddr: string(addr)}, true
}

// LeaderCh receives true when this replica becomes leader and false when it
// stops being leader. Unread values are replaced by newer ones, so a slow
// reader sees the latest state, not every transition.
func (r *Registry) LeaderCh() <-chan bool { return r.leaderCh }

// WaitLeader returns once this replica is leader and has applied every
// entry committed before (a raft barrier), so its reads reflect every
// acknowledged write. It waits through elections until ctx ends.
func (r *Registry) WaitLeader(ctx context.Context) error {
	for {
		r.mu.Lock()
		changed := r.changed
		r.mu.Unlock()
		if r.IsLeader() {
			done := make(chan error, 1)
			go func() { done <- r.raft.Barrier(0).Error() }()
			var err error
			select {
			case err = <-done:
			case <-ctx.Done():
				return ctx.Err()
			case <-r.down:
				return ErrClosed
			}
			switch {
			case err == nil && r.IsLeader():
				return nil
			case errors.Is(err, raft.ErrRaftShutdown):
				return ErrClosed
			}
		}
		// Leadership changes wake us; the timer covers the moment between
		// raft taking leadership and its notification reaching watch.
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-r.down:
			t.Stop()
			return ErrClosed
		}
		t.Stop()
	}
}

// Stats returns raft's internal counters (state, term, indexes, peers).
func (r *Registry) Stats() map[string]string { return r.raft.Stats() }

// apply replicates one command and returns once it is committed and applied
// here, with the FSM's verdict (ErrExists, ErrNotFound) for the command.
func (r *Registry) apply(c command) error {
	data, merr := json.Marshal(&c)
	if merr != nil {
		return merr
	}
	if r.closing.Load() {
		return ErrClosed
	}
	f := r.raft.Apply(data, enqueueTimeout)
	// raft never resolves a future still queued for its leader loop when
	// it shuts down (the futures it returns have no shutdown channel), so
	// waiting on f alone could hang a writer racing Close forever. The
	// waiter goroutine leaks in that case only; it holds nothing else.
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-r.down:
		select {
		case err = <-done: // resolved as raft stopped: prefer its verdict
		default:
			return fmt.Errorf("%w before the write was confirmed; it may or may not be applied", ErrClosed)
		}
	}
	if err != nil {
		return r.writeError(err)
	}
	if err, ok := f.Response().(error); ok {
		return err
	}
	return nil
}

func (r *Registry) writeError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return r.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost):
		// The entry may still commit under the next leader: a retry can
		// meet ErrExists for its own create.
		return fmt.Errorf("replica: leadership lost before the write committed; it may or may not be applied: %w: %w", r.notLeader(), err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return fmt.Errorf("replica: write: %w", err)
}

func (r *Registry) notLeader() NotLeaderError {
	p, ok := r.Leader()
	if ok && p.ID == r.self.ID {
		// raft still names us while stepping down: no useful redirect.
		return NotLeaderError{}
	}
	return NotLeaderError{Leader: p, Known: ok}
}

func (r *Registry) put(o op, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return r.apply(command{Op: o, Key: key, Value: data})
}

// CreateFunction stores a new function; ErrExists if the name is taken.
func (r *Registry) CreateFunction(f *spec.Function) ([]byte, error) {
	data, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return data, r.apply(command{Op: opCreateFunction, Key: f.Name, Value: data})
}

// UpdateFunction replaces a stored function; ErrNotFound if absent.
func (r *Registry) UpdateFunction(f *spec.Function) error {
	return r.put(opUpdateFunction, f.Name, f)
}

// DeleteFunction removes a function; ErrNotFound if absent.
func (r *Registry) DeleteFunction(name string) error {
	return r.apply(command{Op: opDeleteFunction, Key: name})
}

// PutWorker creates or replaces a worker record.
func (r *Registry) PutWorker(w *store.Worker) error { return r.put(opPutWorker, w.ID, w) }

// PutDataPlane creates or replaces a data-plane record.
func (r *Registry) PutDataPlane(d *store.DataPlane) error {
	return r.put(opPutDataPlane, d.ID, d)
}

// CreateToken stores a new token; ErrExists if its id is taken.
func (r *Registry) CreateToken(t *store.Token) error { return r.put(opCreateToken, t.ID, t) }

// DeleteToken removes a token; ErrNotFound if absent.
func (r *Registry) DeleteToken(id string) error {
	return r.apply(command{Op: opDeleteToken, Key: id})
}

// Tokens returns every token this replica has applied, by id.
func (r *Registry) Tokens() ([]*store.Token, error) {
	return decodeAll[store.Token](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.tokens }), "token")
}

// PutNamespace creates or replaces a namespace record.
func (r *Registry) PutNamespace(n *store.Namespace) error { return r.put(opPutNamespace, n.Name, n) }

// DeleteNamespace removes a namespace; ErrNotFound if absent.
func (r *Registry) DeleteNamespace(name string) error {
	return r.apply(command{Op: opDeleteNamespace, Key: name})
}

// CreateSecret stores a new secret; ErrExists if its name is taken.
func (r *Registry) CreateSecret(s *store.Secret) error { return r.put(opCreateSecret, s.Key(), s) }

// UpdateSecret replaces a secret; ErrNotFound if absent.
func (r *Registry) UpdateSecret(s *store.Secret) error { return r.put(opUpdateSecret, s.Key(), s) }

// DeleteSecret removes namespace's secret name; ErrNotFound if absent.
func (r *Registry) DeleteSecret(namespace, name string) error {
	return r.apply(command{Op: opDeleteSecret, Key: store.SecretKey(namespace, name)})
}

// Secrets returns every secret this replica has applied, by key.
func (r *Registry) Secrets() ([]*store.Secret, error) {
	return decodeAll[store.Secret](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.secrets }), "secret")
}

// CreateTrigger stores a new trigger; ErrExists if its name is taken.
func (r *Registry) CreateTrigger(t *store.Trigger) error { return r.put(opCreateTrigger, t.Key(), t) }

// UpdateTrigger replaces a trigger; ErrNotFound if absent.
func (r *Registry) UpdateTrigger(t *store.Trigger) error { return r.put(opUpdateTrigger, t.Key(), t) }

// DeleteTrigger removes namespace's trigger name; ErrNotFound if absent.
func (r *Registry) DeleteTrigger(namespace, name string) error {
	return r.apply(command{Op: opDeleteTrigger, Key: store.TriggerKey(namespace, name)})
}

// Triggers returns every trigger this replica has applied, by key.
func (r *Registry) Triggers() ([]*store.Trigger, error) {
	return decodeAll[store.Trigger](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.triggers }), "trigger")
}

// PutRevision keeps a replaced spec in its function's history.
func (r *Registry) PutRevision(f *spec.Function) error {
	return r.put(opPutRevision, store.RevisionKey(f.Name, f.Revision), f)
}

// Revisions returns the kept revisions of function name, oldest first.
func (r *Registry) Revisions(name string) ([]*spec.Function, error) {
	return decodeAll[spec.Function](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.revisions[name] }), "revision")
}

// DeleteRevisions forgets function name's history.
func (r *Registry) DeleteRevisions(name string) error {
	return r.apply(command{Op: opDeleteRevisions, Key: name})
}

// PutCode keeps a code archive under its digest, once.
func (r *Registry) PutCode(digest string, zip []byte) error { return r.put(opPutCode, digest, zip) }

// Code returns the archive this replica holds under digest.
func (r *Registry) Code(digest string) ([]byte, error) {
	r.fsm.mu.RLock()
	raw, ok := r.fsm.code[digest]
	r.fsm.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("code %q: %w", digest, store.ErrNotFound)
	}
	var zip []byte
	if err := json.Unmarshal(raw, &zip); err != nil {
		return nil, fmt.Errorf("replica: code %s: corrupt record: %w", digest, err)
	}
	return zip, nil
}

// DeleteCode forgets an archive; ErrNotFound if absent.
func (r *Registry) DeleteCode(digest string) error {
	return r.apply(command{Op: opDeleteCode, Key: digest})
}

// CodeDigests lists the archives this replica holds, sorted.
func (r *Registry) CodeDigests() ([]string, error) {
	r.fsm.mu.RLock()
	defer r.fsm.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.fsm.code)), nil
}

// CodeBytes is the size of the archives this replica holds, together
// (as their JSON: base64, a third more than the archives).
func (r *Registry) CodeBytes() (int64, error) {
	r.fsm.mu.RLock()
	defer r.fsm.mu.RUnlock()
	var n int64
	for _, v := range r.fsm.code {
		n += int64(len(v))
	}
	return n, nil
}

// Namespaces returns every namespace this replica has applied, by name.
func (r *Registry) Namespaces() ([]*store.Namespace, error) {
	return decodeAll[store.Namespace](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.namespaces }), "namespace")
}

// Functions returns every function this replica has applied, by name.
func (r *Registry) Functions() ([]*spec.Function, error) {
	return decodeAll[spec.Function](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.functions }), "function")
}

// Workers returns every worker record this replica has applied, by id.
func (r *Registry) Workers() ([]*store.Worker, error) {
	return decodeAll[store.Worker](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.workers }), "worker")
}

// DataPlanes returns every data-plane record this replica has applied, by id.
func (r *Registry) DataPlanes() ([]*store.DataPlane, error) {
	return decodeAll[store.DataPlane](r.fsm.records(func(f *fsm) map[string]json.RawMessage { return f.dataplanes }), "data plane")
}

func decodeAll[T any](raw []json.RawMessage, kind string) ([]*T, error) {
	var out []*T
	for _, b := range raw {
		v := new(T)
		if err := json.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("replica: %s: corrupt record: %w", kind, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Term is raft's current term. A leader stamps it on its worker sessions,
// so that workers refuse a deposed leader that has not noticed yet.
func (r *Registry) Term() uint64 { return r.raft.CurrentTerm() }

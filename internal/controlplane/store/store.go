// Package store is the control plane's durable registry: functions, worker
// nodes and data planes in an embedded bbolt database behind a write-ahead
// log that is fsynced before a write is acknowledged. Sandbox state is never stored: workers are its source of truth.
package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Sentinel errors; callers map them to HTTP and gRPC codes at the edge.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrClosed   = errors.New("store: closed")
)

var (
	bucketFunctions  = []byte("functions")
	bucketWorkers    = []byte("workers")
	bucketDataPlanes = []byte("dataplanes")
	bucketTokens     = []byte("tokens")
	bucketNamespaces = []byte("namespaces")
	bucketSecrets    = []byte("secrets")
	bucketRevisions  = []byte("revisions")
	bucketCode       = []byte("code")
	bucketTriggers   = []byte("triggers")
)

// Worker is a registered worker node (package nodes, which the
// reconciler imports without the store's bbolt and raft).
type Worker = nodes.Worker

// Token is the durable record of an API token. The secret itself is never
// stored: only its SHA-256 (the secret is 256 random bits, so a plain hash
// is as hard to reverse as a slow one, and cheap enough to check per call).
type Token struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	Scopes    []string `json:"scopes"`
	Functions []string `json:"functions,omitempty"` // invoke only these; empty: any
	Namespace string   `json:"namespace,omitempty"` // only this namespace's functions; empty: any
	Hash      string   `json:"hash"`                // hex SHA-256 of the secret
	// SigningKey is the token's SigV4 secret key (auth.SigningKeyOf), for
	// the Lambda API; empty for tokens made before it.
	SigningKey string    `json:"signing_key,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
}

// DataPlane is the durable record of a data plane (pkg/api's type: the
// admin API shows it as it is stored).
type DataPlane = api.DataPlane

// Namespace is the durable record of a tenant's namespace and its quota.
type Namespace struct {
	Name      string            `json:"name"`
	Quota     spec.Quota        `json:"quota"`
	Egress    spec.EgressPolicy `json:"egress,omitzero"`
	CreatedAt time.Time         `json:"created_at"`
}

// Secret is the durable record of a secret: a value functions of its
// namespace see as a file (spec.SecretsDir). The registry is its only
// durable copy; the admin API never returns the value, and only workers
// receive it, with the specs of the functions that name it.
type Secret struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Value     []byte    `json:"value"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Key is the secret's registry key: names are unique per namespace.
func (s *Secret) Key() string { return SecretKey(s.Namespace, s.Name) }

// SecretKey is the registry key of namespace's secret name.
func SecretKey(namespace, name string) string { return namespace + "/" + name }

// Trigger is the durable record of a trigger (spec.Trigger) and how far
// it has fired.
type Trigger struct {
	spec.Trigger
	// LastTick is the last cron tick whose call the queue accepted (or,
	// for a trigger not yet fired or just resumed, the time from which
	// its ticks count).
	LastTick time.Time `json:"last_tick,omitzero"`
}

// Key is the trigger's registry key: names are unique per namespace.
func (t *Trigger) Key() string { return TriggerKey(spec.TriggerNamespace(&t.Trigger), t.Name) }

// TriggerKey is the registry key of namespace's trigger name.
func TriggerKey(namespace, name string) string { return namespace + "/" + name }

// Store is a bbolt-backed registry. It is safe for concurrent use; concurrent
// writes are group-committed: one write-ahead-log fsync for many writers.
type Store struct {
	db     *bolt.DB
	log    *wal
	writes chan *write
	done   chan struct{}
	// closeMu orders sends on writes before Close closes it; closed makes
	// calls after Close (an admin request that outlived shutdown) fail
	// with ErrClosed instead of panicking.
	closeMu  sync.RWMutex
	closed   bool
	closeErr error // the final checkpoint's

	// Checkpoint pacing: bbolt commits the logged writes once the registry
	// has been idle for checkpointIdle, or every checkpointEvery under load.
	// A checkpoint holds up the writes behind it (~1 ms at 16,000
	// registrations/s with 25 ms); 100 ms doubled p99 registration latency.
	checkpointIdle, checkpointEvery time.Duration
}

// write is one caller's update waiting for the next group commit; a nil fn
// asks for a checkpoint, so that a read sees every acknowledged write.
type write struct {
	fn  func(t *txn) error
	err chan error
}

// txn is the view a write gets of the shared transaction: its changes go to
// bbolt and, encoded, to the group's log record.
type txn struct {
	tx  *bolt.Tx
	ops []byte
}

func (t *txn) get(bucket byte, key []byte) []byte { return t.tx.Bucket(buckets[bucket]).Get(key) }

func (t *txn) put(bucket byte, key, val []byte) error {
	if err := t.tx.Bucket(buckets[bucket]).Put(key, val); err != nil {
		return err
	}
	t.ops = appendOp(t.ops, opPut, bucket, key, val)
	return nil
}

func (t *txn) del(bucket byte, key []byte) error {
	if err := t.tx.Bucket(buckets[bucket]).Delete(key); err != nil {
		return err
	}
	t.ops = appendOp(t.ops, opDel, bucket, key, nil)
	return nil
}

// Bucket indexes, as written in log records.
const (
	bFunctions byte = iota
	bWorkers
	bDataPlanes
	bTokens
	bNamespaces
	bSecrets
	bRevisions
	bCode
	bTriggers
)

var (
	buckets    = [][]byte{bFunctions: bucketFunctions, bWorkers: bucketWorkers, bDataPlanes: bucketDataPlanes, bTokens: bucketTokens, bNamespaces: bucketNamespaces, bSecrets: bucketSecrets, bRevisions: bucketRevisions, bCode: bucketCode, bTriggers: bucketTriggers}
	bucketMeta = []byte("meta")
	keyLogSeq  = []byte("wal_seq") // last log record bbolt holds
)

// Open opens (creating if needed) the registry in dir, replaying the
// write-ahead log over the last checkpoint.
func Open(dir string) (*Store, error) {
	return open(dir, options{logSize: walSize, checkpointIdle: 5 * time.Millisecond, checkpointEvery: 25 * time.Millisecond})
}

// options are Open's fixed choices; tests vary them.
type options struct {
	logSize                         int64
	checkpointIdle, checkpointEvery time.Duration
}

func open(dir string, o options) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	path := filepath.Join(dir, "registry.db")
	// The freelist is rebuilt at open instead of written at every commit:
	// less I/O on the registration path.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType,
		// Address space only: a growing registry is not remapped (a remap
		// waits for every reader) until it passes 256 MiB.
		InitialMmapSize: 256 << 20})
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w (is another control plane using this data dir?)", path, err)
	}
	log, err := openWAL(filepath.Join(dir, "registry.wal"), o.logSize)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: open write-ahead log: %w", err)
	}
	fail := func(err error) (*Store, error) {
		log.close()
		db.Close()
		return nil, fmt.Errorf("store: init %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range append([][]byte{bucketMeta}, buckets...) {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		var applied uint64
		if v := meta.Get(keyLogSeq); len(v) == 8 {
			applied = binary.BigEndian.Uint64(v)
		}
		last, err := scanWAL(log.f, log.size, applied, func(ops []byte) error {
			return eachOp(ops, func(kind, bucket byte, key, val []byte) error {
				if int(bucket) >= len(buckets) {
					return errBadOps
				}
				b := tx.Bucket(buckets[bucket])
				if kind == opPut {
					return b.Put(key, val)
				}
				return b.Delete(key)
			})
		})
		if err != nil {
			return err
		}
		log.seq = last
		return meta.Put(keyLogSeq, binary.BigEndian.AppendUint64(nil, last))
	})
	if err != nil {
		return fail(err)
	}
	log.restart()
	s := &Store{db: db, log: log, writes: make(chan *write, 4096), done: make(chan struct{}),
		checkpointIdle: o.checkpointIdle, checkpointEvery: o.checkpointEvery}
	go s.committer()
	return s, nil
}

// Close closes the database after the writes already queued and a final
// checkpoint. Later calls return ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return ErrClosed
	}
	s.closed = true
	close(s.writes)
	s.closeMu.Unlock()
	<-s.done
	return errors.Join(s.closeErr, s.log.close(), s.db.Close())
}

// maxGroup bounds one group commit, so a flood of writers still sees
// commits (and answers) at a steady pace.
const maxGroup = 4096

// committer is the group commit: while one group's record syncs, new writes
// queue up, and the next record takes all of them. Unlike a timer-based
// batch, a lone write commits at once and a busy registry amortises each
// fsync over every writer that arrived meanwhile.
//
// The bbolt transaction stays open across groups until a checkpoint; a
// write is acknowledged once its record is in the log. If the log or a
// checkpoint fails, the open transaction is lost, so the store refuses
// every later write (restart replays the log).
func (s *Store) committer() {
	defer close(s.done)
	var (
		tx     *bolt.Tx
		opened time.Time
		failed error
		group  = make([]*write, 0, 64)
		errs   = make([]error, 0, 64)
		t      txn
		idle   = time.NewTimer(time.Hour)
	)
	idle.Stop()
	checkpoint := func() {
		if tx == nil {
			return
		}
		err := tx.Bucket(bucketMeta).Put(keyLogSeq, binary.BigEndian.AppendUint64(nil, s.log.seq))
		if err == nil {
			err = tx.Commit()
		} else {
			tx.Rollback()
		}
		tx = nil
		if err != nil {
			failed = fmt.Errorf("store: checkpoint failed, writes refused until restart: %w", err)
			return
		}
		s.log.restart()
	}
	defer func() {
		checkpoint()
		s.closeErr = failed
	}()
	for {
		var w *write
		var ok bool
		select {
		case w, ok = <-s.writes:
		case <-idle.C:
			checkpoint()
			continue
		}
		if !ok {
			return
		}
		group = append(group[:0], w)
	drain:
		for len(group) < maxGroup {
			select {
			case w, ok := <-s.writes:
				if !ok {
					break drain
				}
				group = append(group, w)
			default:
				break drain
			}
		}
		errs = errs[:0]
		flush, writes := false, false
		for _, w := range group {
			writes = writes || w.fn != nil
		}
		if failed == nil && tx == nil && writes {
			var err error
			if tx, err = s.db.Begin(true); err != nil {
				failed = fmt.Errorf("store: %w", err)
			}
			opened = time.Now()
		}
		t.tx, t.ops = tx, t.ops[:0]
		for _, w := range group {
			switch {
			case failed != nil:
				errs = append(errs, failed)
			case w.fn == nil:
				flush = true
				errs = append(errs, nil)
			default:
				errs = append(errs, w.fn(&t))
			}
		}
		// groupErr answers every write of the group (errs[i] otherwise);
		// flushErr answers the reads.
		var groupErr, flushErr error
		switch {
		case failed != nil || len(t.ops) == 0:
		case !s.log.fits(len(t.ops)):
			// Past the log's tail: bbolt's own commit makes the group durable.
			checkpoint()
			groupErr = failed
		default:
			if err := s.log.append(t.ops); err != nil {
				tx.Rollback()
				tx = nil
				failed = fmt.Errorf("store: write-ahead log failed, writes refused until restart: %w", err)
				// The record may have reached the disk before the sync
				// failed: a restart may or may not replay it.
				groupErr = fmt.Errorf("store: write-ahead log failed, outcome unknown until restart: %w", err)
			}
		}
		if flush || (tx != nil && time.Since(opened) >= s.checkpointEvery) {
			checkpoint()
			flushErr = failed // the group's record, if any, is durable anyway
		}
		for i, w := range group {
			switch {
			case groupErr != nil:
				w.err <- groupErr
			case w.fn == nil && flushErr != nil:
				w.err <- flushErr
			default:
				w.err <- errs[i]
			}
		}
		if tx != nil {
			idle.Reset(s.checkpointIdle)
		}
		if cap(t.ops) > 1<<20 {
			t.ops = nil
		}
	}
}

// update runs fn in the next group commit and returns once it is durable.
// fn must return any error before it writes: writes of other callers share
// the transaction, so a failing fn cannot roll back only its own changes.
func (s *Store) update(fn func(t *txn) error) error {
	w := &write{fn: fn, err: make(chan error, 1)}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	s.writes <- w
	s.closeMu.RUnlock()
	return <-w.err
}

// view runs fn on a read transaction that sees every acknowledged write. It
// checkpoints first (two fsyncs): reads are rare (start-up, status), so
// this beats keeping a read path through the open write transaction.
func (s *Store) view(fn func(tx *bolt.Tx) error) error {
	if err := s.update(nil); err != nil {
		return err
	}
	return s.db.View(fn)
}

// Backup writes a consistent copy of the registry as a bbolt file: a
// checkpoint first, so that the copy holds every acknowledged write and
// records the log position it covers. Restore it as registry.db in an
// empty data directory (with no registry.wal: an old log's later records
// would be replayed over it).
func (s *Store) Backup(w io.Writer, size func(int64)) (int64, error) {
	var n int64
	err := s.view(func(tx *bolt.Tx) error {
		if size != nil {
			size(tx.Size())
		}
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	return n, err
}

// CreateFunction stores a new function; ErrExists if the name is taken.
func (s *Store) CreateFunction(f *spec.Function) ([]byte, error) {
	data, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return data, s.createRecord(bFunctions, "function", f.Name, data)
}

// UpdateFunction replaces a stored function; ErrNotFound if absent.
func (s *Store) UpdateFunction(f *spec.Function) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.update(func(t *txn) error {
		if t.get(bFunctions, []byte(f.Name)) == nil {
			return fmt.Errorf("function %q: %w", f.Name, ErrNotFound)
		}
		return t.put(bFunctions, []byte(f.Name), data)
	})
}

// DeleteFunction removes a function; ErrNotFound if absent.
func (s *Store) DeleteFunction(name string) error { return s.remove(bFunctions, "function", name) }

// Functions returns every stored function.
func (s *Store) Functions() ([]*spec.Function, error) {
	var out []*spec.Function
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketFunctions).ForEach(func(k, v []byte) error {
			var f spec.Function
			if err := json.Unmarshal(v, &f); err != nil {
				return fmt.Errorf("function %q: corrupt record: %w", k, err)
			}
			out = append(out, &f)
			return nil
		})
	})
	return out, err
}

// PutWorker creates or replaces a worker record.
func (s *Store) PutWorker(w *Worker) error { return s.put(bWorkers, w.ID, w) }

// Workers returns every stored worker.
func (s *Store) Workers() ([]*Worker, error) { return records[Worker](s, bucketWorkers) }

// PutDataPlane creates or replaces a data-plane record.
func (s *Store) PutDataPlane(d *DataPlane) error { return s.put(bDataPlanes, d.ID, d) }

// DataPlanes returns every stored data plane.
func (s *Store) DataPlanes() ([]*DataPlane, error) { return records[DataPlane](s, bucketDataPlanes) }

// PutNamespace creates or replaces a namespace record.
func (s *Store) PutNamespace(n *Namespace) error { return s.put(bNamespaces, n.Name, n) }

// DeleteNamespace removes a namespace; ErrNotFound if absent.
func (s *Store) DeleteNamespace(name string) error { return s.remove(bNamespaces, "namespace", name) }

// Namespaces returns every namespace, by name.
func (s *Store) Namespaces() ([]*Namespace, error) { return records[Namespace](s, bucketNamespaces) }

// CreateToken stores a new token; ErrExists if its id is taken.
func (s *Store) CreateToken(t *Token) error { return s.create(bTokens, "token", t.ID, t) }

// DeleteToken removes a token; ErrNotFound if absent.
func (s *Store) DeleteToken(id string) error { return s.remove(bTokens, "token", id) }

// Tokens returns every stored token, by id.
func (s *Store) Tokens() ([]*Token, error) { return records[Token](s, bucketTokens) }

// CreateSecret stores a new secret; ErrExists if its name is taken in its
// namespace.
func (s *Store) CreateSecret(sec *Secret) error { return s.create(bSecrets, "secret", sec.Key(), sec) }

// UpdateSecret replaces a stored secret; ErrNotFound if absent.
func (s *Store) UpdateSecret(sec *Secret) error {
	data, err := json.Marshal(sec)
	if err != nil {
		return err
	}
	return s.update(func(t *txn) error {
		if t.get(bSecrets, []byte(sec.Key())) == nil {
			return fmt.Errorf("secret %q: %w", sec.Key(), ErrNotFound)
		}
		return t.put(bSecrets, []byte(sec.Key()), data)
	})
}

// DeleteSecret removes namespace's secret name; ErrNotFound if absent.
func (s *Store) DeleteSecret(namespace, name string) error {
	return s.remove(bSecrets, "secret", SecretKey(namespace, name))
}

// Secrets returns every stored secret, by namespace and name.
func (s *Store) Secrets() ([]*Secret, error) { return records[Secret](s, bucketSecrets) }

// CreateTrigger stores a new trigger; ErrExists if its name is taken in
// its namespace.
func (s *Store) CreateTrigger(t *Trigger) error { return s.create(bTriggers, "trigger", t.Key(), t) }

// UpdateTrigger replaces a stored trigger; ErrNotFound if absent.
func (s *Store) UpdateTrigger(t *Trigger) error {
	data, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return s.update(func(tx *txn) error {
		if tx.get(bTriggers, []byte(t.Key())) == nil {
			return fmt.Errorf("trigger %q: %w", t.Key(), ErrNotFound)
		}
		return tx.put(bTriggers, []byte(t.Key()), data)
	})
}

// DeleteTrigger removes namespace's trigger name; ErrNotFound if absent.
func (s *Store) DeleteTrigger(namespace, name string) error {
	return s.remove(bTriggers, "trigger", TriggerKey(namespace, name))
}

// Triggers returns every stored trigger, by namespace and name.
func (s *Store) Triggers() ([]*Trigger, error) { return records[Trigger](s, bucketTriggers) }

// MaxRevisions is how many replaced revisions of a function are kept.
const MaxRevisions = 20

// RevisionKey is the registry key of function name's revision rev: in
// revision order under the name (names hold no '/').
func RevisionKey(name string, rev uint64) string { return fmt.Sprintf("%s/%020d", name, rev) }

// PutRevision keeps f, a spec an update replaced, in its function's
// history, dropping the oldest beyond MaxRevisions.
func (s *Store) PutRevision(f *spec.Function) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.update(func(t *txn) error {
		if err := t.put(bRevisions, []byte(RevisionKey(f.Name, f.Revision)), data); err != nil {
			return err
		}
		keys := t.keys(bRevisions, f.Name+"/")
		for len(keys) > MaxRevisions {
			if err := t.del(bRevisions, keys[0]); err != nil {
				return err
			}
			keys = keys[1:]
		}
		return nil
	})
}

// Revisions returns the kept revisions of function name, oldest first.
func (s *Store) Revisions(name string) ([]*spec.Function, error) {
	var out []*spec.Function
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRevisions).Cursor()
		prefix := []byte(name + "/")
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			f := new(spec.Function)
			if err := json.Unmarshal(v, f); err != nil {
				return err
			}
			out = append(out, f)
		}
		return nil
	})
	return out, err
}

// DeleteRevisions forgets function name's history.
func (s *Store) DeleteRevisions(name string) error {
	return s.update(func(t *txn) error {
		for _, k := range t.keys(bRevisions, name+"/") {
			if err := t.del(bRevisions, k); err != nil {
				return err
			}
		}
		return nil
	})
}

// keys returns the keys of bucket that start with prefix, in order.
func (t *txn) keys(bucket byte, prefix string) [][]byte {
	var out [][]byte
	c := t.tx.Bucket(buckets[bucket]).Cursor()
	p := []byte(prefix)
	for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
		out = append(out, bytes.Clone(k))
	}
	return out
}

// PutCode keeps a code archive under its digest (spec.Code); putting one
// that is there already changes nothing.
func (s *Store) PutCode(digest string, zip []byte) error {
	return s.update(func(t *txn) error {
		if t.get(bCode, []byte(digest)) != nil {
			return nil
		}
		return t.put(bCode, []byte(digest), zip)
	})
}

// Code returns the archive stored under digest; ErrNotFound if absent.
func (s *Store) Code(digest string) ([]byte, error) {
	var out []byte
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketCode).Get([]byte(digest))
		if v == nil {
			return fmt.Errorf("code %q: %w", digest, ErrNotFound)
		}
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

// DeleteCode forgets an archive; ErrNotFound if absent.
func (s *Store) DeleteCode(digest string) error { return s.remove(bCode, "code", digest) }

// CodeDigests lists the stored archives' digests, sorted.
func (s *Store) CodeDigests() ([]string, error) {
	var out []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCode).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}

// CodeBytes is the size of the stored archives, together.
func (s *Store) CodeBytes() (int64, error) {
	var n int64
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCode).ForEach(func(_, v []byte) error {
			n += int64(len(v))
			return nil
		})
	})
	return n, err
}

// create stores v under key, a new one (ErrExists if taken); remove
// deletes key (ErrNotFound if absent). kind names the record in errors.
func (s *Store) create(bucket byte, kind, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.createRecord(bucket, kind, key, data)
}

func (s *Store) createRecord(bucket byte, kind, key string, data []byte) error {
	return s.update(func(t *txn) error {
		if t.get(bucket, []byte(key)) != nil {
			return fmt.Errorf("%s %q: %w", kind, key, ErrExists)
		}
		return t.put(bucket, []byte(key), data)
	})
}

func (s *Store) remove(bucket byte, kind, key string) error {
	return s.update(func(t *txn) error {
		if t.get(bucket, []byte(key)) == nil {
			return fmt.Errorf("%s %q: %w", kind, key, ErrNotFound)
		}
		return t.del(bucket, []byte(key))
	})
}

func (s *Store) put(bucket byte, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.update(func(t *txn) error { return t.put(bucket, []byte(key), data) })
}

// records decodes every record of a bucket, in key order.
func records[T any](s *Store, bucket []byte) ([]*T, error) {
	var out []*T
	err := s.each(bucket, func(v []byte) error {
		r := new(T)
		if err := json.Unmarshal(v, r); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

func (s *Store) each(bucket []byte, fn func(v []byte) error) error {
	return s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(_, v []byte) error { return fn(v) })
	})
}

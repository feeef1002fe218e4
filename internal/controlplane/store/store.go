// Package store is the control plane's durable registry: functions, worker
// nodes and data planes in an embedded bbolt database, fsynced before a write
// is acknowledged. Sandbox state is never stored: workers are its source of truth.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/brisk-faas/brisk/internal/spec"
)

// Sentinel errors; callers map them to HTTP and gRPC codes at the edge.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
)

var (
	bucketFunctions  = []byte("functions")
	bucketWorkers    = []byte("workers")
	bucketDataPlanes = []byte("dataplanes")
)

// Worker is the durable record of a worker node.
type Worker struct {
	ID           string         `json:"id"`
	Address      string         `json:"address"`
	Capacity     spec.Resources `json:"capacity"`
	MaxSandboxes int            `json:"max_sandboxes"`
	Runtime      string         `json:"runtime"`
	// Drain fences a node the control plane gave up on: its sandboxes were
	// replaced, so it must kill them all before it takes new work.
	Drain        bool      `json:"drain"`
	RegisteredAt time.Time `json:"registered_at"`
}

// DataPlane is the durable record of a data plane.
type DataPlane struct {
	ID           string    `json:"id"`
	Address      string    `json:"address"`
	RegisteredAt time.Time `json:"registered_at"`
}

// Store is a bbolt-backed registry. It is safe for concurrent use; concurrent
// writes are group-committed (one fsync for many).
type Store struct {
	db     *bolt.DB
	writes chan *write
	done   chan struct{}
}

// write is one caller's update waiting for the next group commit.
type write struct {
	fn  func(tx *bolt.Tx) error
	err chan error
}

// Open opens (creating if needed) the registry in dir.
func Open(dir string) (*Store, error) {
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
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketFunctions, bucketWorkers, bucketDataPlanes} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: init %s: %w", path, err)
	}
	s := &Store{db: db, writes: make(chan *write, 4096), done: make(chan struct{})}
	go s.committer()
	return s, nil
}

// Close closes the database after the writes already queued.
func (s *Store) Close() error {
	close(s.writes)
	<-s.done
	return s.db.Close()
}

// maxGroup bounds one group commit, so a flood of writers still sees
// commits (and answers) at a steady pace.
const maxGroup = 4096

// committer is the group commit: while one transaction syncs, new writes
// queue up, and the next transaction takes all of them. Unlike a timer-based
// batch, a lone write commits at once and a busy registry amortises each
// fsync over every writer that arrived meanwhile.
func (s *Store) committer() {
	defer close(s.done)
	group := make([]*write, 0, 64)
	errs := make([]error, 0, 64)
	for w := range s.writes {
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
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, w := range group {
				errs = append(errs, w.fn(tx))
			}
			return nil
		})
		for i, w := range group {
			if err != nil {
				w.err <- err
			} else {
				w.err <- errs[i]
			}
		}
	}
}

// update runs fn in the next group commit and returns once it is durable.
// fn must return any error before it writes: writes of other callers share
// the transaction, so a failing fn cannot roll back only its own changes.
func (s *Store) update(fn func(tx *bolt.Tx) error) error {
	w := &write{fn: fn, err: make(chan error, 1)}
	s.writes <- w
	return <-w.err
}

// CreateFunction stores a new function; ErrExists if the name is taken.
func (s *Store) CreateFunction(f *spec.Function) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketFunctions)
		if b.Get([]byte(f.Name)) != nil {
			return fmt.Errorf("function %q: %w", f.Name, ErrExists)
		}
		return b.Put([]byte(f.Name), data)
	})
}

// UpdateFunction replaces a stored function; ErrNotFound if absent.
func (s *Store) UpdateFunction(f *spec.Function) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketFunctions)
		if b.Get([]byte(f.Name)) == nil {
			return fmt.Errorf("function %q: %w", f.Name, ErrNotFound)
		}
		return b.Put([]byte(f.Name), data)
	})
}

// DeleteFunction removes a function; ErrNotFound if absent.
func (s *Store) DeleteFunction(name string) error {
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketFunctions)
		if b.Get([]byte(name)) == nil {
			return fmt.Errorf("function %q: %w", name, ErrNotFound)
		}
		return b.Delete([]byte(name))
	})
}

// Functions returns every stored function.
func (s *Store) Functions() ([]*spec.Function, error) {
	var out []*spec.Function
	err := s.db.View(func(tx *bolt.Tx) error {
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
func (s *Store) PutWorker(w *Worker) error { return s.put(bucketWorkers, w.ID, w) }

// Workers returns every stored worker.
func (s *Store) Workers() ([]*Worker, error) {
	var out []*Worker
	err := s.each(bucketWorkers, func(v []byte) error {
		var w Worker
		if err := json.Unmarshal(v, &w); err != nil {
			return err
		}
		out = append(out, &w)
		return nil
	})
	return out, err
}

// PutDataPlane creates or replaces a data-plane record.
func (s *Store) PutDataPlane(d *DataPlane) error { return s.put(bucketDataPlanes, d.ID, d) }

// DataPlanes returns every stored data plane.
func (s *Store) DataPlanes() ([]*DataPlane, error) {
	var out []*DataPlane
	err := s.each(bucketDataPlanes, func(v []byte) error {
		var d DataPlane
		if err := json.Unmarshal(v, &d); err != nil {
			return err
		}
		out = append(out, &d)
		return nil
	})
	return out, err
}

func (s *Store) put(bucket []byte, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), data) })
}

func (s *Store) each(bucket []byte, fn func(v []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(_, v []byte) error { return fn(v) })
	})
}

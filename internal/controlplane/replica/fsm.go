package replica

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/brisk-faas/brisk/internal/controlplane/store"
)

// op names one registry mutation in the raft log. The values are persisted:
// never renumber them, only add.
type op uint8

const (
	opCreateFunction op = iota + 1
	opUpdateFunction
	opDeleteFunction
	opPutWorker
	opPutDataPlane
	opCreateToken
	opDeleteToken
	opPutNamespace
	opDeleteNamespace
	opCreateSecret
	opUpdateSecret
	opDeleteSecret
	opPutRevision
	opDeleteRevisions
	opPutCode
	opDeleteCode
	opCreateTrigger
	opUpdateTrigger
	opDeleteTrigger
)

// command is one raft log entry. Value is the record's JSON as the writer
// encoded it; the FSM keeps those bytes as they are, so every replica holds
// the same bytes and a read decodes a private copy for its caller.
type command struct {
	Op    op              `json:"op"`
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value,omitempty"`
}

// fsm is the replicated state: the three registry tables as JSON records
// keyed by function name, worker id and data-plane id. raft applies entries
// from one goroutine; readers take the read lock.
type fsm struct {
	mu         sync.RWMutex
	functions  map[string]json.RawMessage
	workers    map[string]json.RawMessage
	dataplanes map[string]json.RawMessage
	tokens     map[string]json.RawMessage
	namespaces map[string]json.RawMessage
	secrets    map[string]json.RawMessage
	triggers   map[string]json.RawMessage
	// revisions: function name -> RevisionKey -> spec, at most
	// store.MaxRevisions per function.
	revisions map[string]map[string]json.RawMessage
	// code: digest -> the archive as a JSON string (base64).
	code map[string]json.RawMessage
}

var _ raft.BatchingFSM = (*fsm)(nil)

func newFSM() *fsm {
	return &fsm{
		functions:  map[string]json.RawMessage{},
		workers:    map[string]json.RawMessage{},
		dataplanes: map[string]json.RawMessage{},
		tokens:     map[string]json.RawMessage{},
		namespaces: map[string]json.RawMessage{},
		secrets:    map[string]json.RawMessage{},
		triggers:   map[string]json.RawMessage{},
		revisions:  map[string]map[string]json.RawMessage{},
		code:       map[string]json.RawMessage{},
	}
}

// Apply applies one committed entry (raft uses ApplyBatch; this is the
// plain raft.FSM path).
func (f *fsm) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applyLocked(l)
}

// ApplyBatch applies committed entries under one lock acquisition. The
// response for each entry is nil or an error; it depends only on the state
// and the entry, so every replica reaches the same result.
func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, l := range logs {
		out[i] = f.applyLocked(l)
	}
	return out
}

func (f *fsm) applyLocked(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil // configuration changes and no-ops carry no registry state
	}
	var c command
	if err := json.Unmarshal(l.Data, &c); err != nil {
		return fmt.Errorf("replica: corrupt log entry %d: %w", l.Index, err)
	}
	switch c.Op {
	case opCreateFunction:
		return create(f.functions, "function", c)
	case opUpdateFunction:
		return update(f.functions, "function", c)
	case opDeleteFunction:
		return remove(f.functions, "function", c)
	case opPutWorker:
		f.workers[c.Key] = c.Value
	case opPutDataPlane:
		f.dataplanes[c.Key] = c.Value
	case opCreateToken:
		return create(f.tokens, "token", c)
	case opDeleteToken:
		return remove(f.tokens, "token", c)
	case opPutNamespace:
		f.namespaces[c.Key] = c.Value
	case opDeleteNamespace:
		return remove(f.namespaces, "namespace", c)
	case opCreateSecret:
		return create(f.secrets, "secret", c)
	case opUpdateSecret:
		return update(f.secrets, "secret", c)
	case opDeleteSecret:
		return remove(f.secrets, "secret", c)
	case opPutRevision:
		name, _, _ := strings.Cut(c.Key, "/")
		revs := f.revisions[name]
		if revs == nil {
			revs = map[string]json.RawMessage{}
			f.revisions[name] = revs
		}
		revs[c.Key] = c.Value
		if len(revs) > store.MaxRevisions {
			keys := slices.Sorted(maps.Keys(revs))
			for _, k := range keys[:len(keys)-store.MaxRevisions] {
				delete(revs, k)
			}
		}
	case opDeleteRevisions:
		delete(f.revisions, c.Key)
	case opPutCode:
		if _, ok := f.code[c.Key]; !ok {
			f.code[c.Key] = c.Value
		}
	case opDeleteCode:
		return remove(f.code, "code", c)
	case opCreateTrigger:
		return create(f.triggers, "trigger", c)
	case opUpdateTrigger:
		return update(f.triggers, "trigger", c)
	case opDeleteTrigger:
		return remove(f.triggers, "trigger", c)
	default:
		// A newer replica wrote an op this binary does not know. Every
		// replica of this version skips it the same way.
		return fmt.Errorf("replica: log entry %d: unknown op %d", l.Index, c.Op)
	}
	return nil
}

// create, update and remove apply c to table with the registry's verdicts:
// ErrExists for a key taken, ErrNotFound for one missing (as store.Store).
func create(table map[string]json.RawMessage, kind string, c command) error {
	if _, ok := table[c.Key]; ok {
		return fmt.Errorf("%s %q: %w", kind, c.Key, store.ErrExists)
	}
	table[c.Key] = c.Value
	return nil
}

func update(table map[string]json.RawMessage, kind string, c command) error {
	if _, ok := table[c.Key]; !ok {
		return fmt.Errorf("%s %q: %w", kind, c.Key, store.ErrNotFound)
	}
	table[c.Key] = c.Value
	return nil
}

func remove(table map[string]json.RawMessage, kind string, c command) error {
	if _, ok := table[c.Key]; !ok {
		return fmt.Errorf("%s %q: %w", kind, c.Key, store.ErrNotFound)
	}
	delete(table, c.Key)
	return nil
}

// records returns the table's values sorted by key. The byte slices are
// never modified after they are stored, so they can be decoded unlocked.
func (f *fsm) records(table func(*fsm) map[string]json.RawMessage) []json.RawMessage {
	f.mu.RLock()
	m := table(f)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]json.RawMessage, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	f.mu.RUnlock()
	return out
}

// snapshotData is the snapshot format: the three tables as JSON objects.
type snapshotData struct {
	Functions  map[string]json.RawMessage            `json:"functions"`
	Workers    map[string]json.RawMessage            `json:"workers"`
	DataPlanes map[string]json.RawMessage            `json:"dataplanes"`
	Tokens     map[string]json.RawMessage            `json:"tokens,omitempty"`
	Namespaces map[string]json.RawMessage            `json:"namespaces,omitempty"`
	Secrets    map[string]json.RawMessage            `json:"secrets,omitempty"`
	Revisions  map[string]map[string]json.RawMessage `json:"revisions,omitempty"`
	Code       map[string]json.RawMessage            `json:"code,omitempty"`
	Triggers   map[string]json.RawMessage            `json:"triggers,omitempty"`
}

// Snapshot copies the maps (not the immutable records) so Persist can write
// them while Apply goes on.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &fsmSnapshot{data: snapshotData{
		Functions:  maps.Clone(f.functions),
		Workers:    maps.Clone(f.workers),
		DataPlanes: maps.Clone(f.dataplanes),
		Tokens:     maps.Clone(f.tokens),
		Namespaces: maps.Clone(f.namespaces),
		Secrets:    maps.Clone(f.secrets),
		Revisions:  cloneRevisions(f.revisions),
		Code:       maps.Clone(f.code),
		Triggers:   maps.Clone(f.triggers),
	}}, nil
}

// Restore replaces the whole state with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var d snapshotData
	if err := json.NewDecoder(rc).Decode(&d); err != nil {
		return fmt.Errorf("replica: restore snapshot: %w", err)
	}
	if d.Functions == nil {
		d.Functions = map[string]json.RawMessage{}
	}
	if d.Workers == nil {
		d.Workers = map[string]json.RawMessage{}
	}
	if d.DataPlanes == nil {
		d.DataPlanes = map[string]json.RawMessage{}
	}
	if d.Tokens == nil {
		d.Tokens = map[string]json.RawMessage{}
	}
	if d.Namespaces == nil {
		d.Namespaces = map[string]json.RawMessage{}
	}
	if d.Secrets == nil {
		d.Secrets = map[string]json.RawMessage{}
	}
	if d.Revisions == nil {
		d.Revisions = map[string]map[string]json.RawMessage{}
	}
	if d.Code == nil {
		d.Code = map[string]json.RawMessage{}
	}
	if d.Triggers == nil {
		d.Triggers = map[string]json.RawMessage{}
	}
	f.mu.Lock()
	f.revisions, f.code, f.triggers = d.Revisions, d.Code, d.Triggers
	f.functions, f.workers, f.dataplanes, f.tokens, f.namespaces, f.secrets = d.Functions, d.Workers, d.DataPlanes, d.Tokens, d.Namespaces, d.Secrets
	f.mu.Unlock()
	return nil
}

type fsmSnapshot struct{ data snapshotData }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	// encoding/json sorts map keys: equal states give equal snapshots.
	if err := json.NewEncoder(sink).Encode(&s.data); err != nil {
		sink.Cancel()
		return fmt.Errorf("replica: persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// cloneRevisions copies the maps (the records are immutable).
func cloneRevisions(m map[string]map[string]json.RawMessage) map[string]map[string]json.RawMessage {
	out := make(map[string]map[string]json.RawMessage, len(m))
	for k, v := range m {
		out[k] = maps.Clone(v)
	}
	return out
}

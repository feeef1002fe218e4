package store

import (
	"io"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Registry is the durable registry the control plane writes through: the
// single-node bbolt Store or the raft-replicated one (package replica).
//
// Both report a taken name with ErrExists and a missing one with ErrNotFound
// (test with errors.Is), with the same messages, and list records sorted by
// name or id.
type Registry interface {
	// CreateFunction returns the record it stored: f as JSON, which the
	// admin API answers with rather than encoding f again.
	CreateFunction(f *spec.Function) (record []byte, err error)
	UpdateFunction(f *spec.Function) error
	DeleteFunction(name string) error
	Functions() ([]*spec.Function, error)
	PutWorker(w *Worker) error
	Workers() ([]*Worker, error)
	PutDataPlane(d *DataPlane) error
	DataPlanes() ([]*DataPlane, error)
	CreateToken(t *Token) error
	DeleteToken(id string) error
	Tokens() ([]*Token, error)
	PutNamespace(n *Namespace) error
	DeleteNamespace(name string) error
	Namespaces() ([]*Namespace, error)
	CreateSecret(s *Secret) error
	UpdateSecret(s *Secret) error
	DeleteSecret(namespace, name string) error
	Secrets() ([]*Secret, error)
	// CreateTrigger, UpdateTrigger (ErrNotFound if absent), DeleteTrigger
	// and Triggers keep triggers by namespace and name.
	CreateTrigger(t *Trigger) error
	UpdateTrigger(t *Trigger) error
	DeleteTrigger(namespace, name string) error
	Triggers() ([]*Trigger, error)
	// PutRevision keeps a replaced spec in its function's history (at most
	// MaxRevisions); Revisions lists it oldest first.
	PutRevision(f *spec.Function) error
	Revisions(name string) ([]*spec.Function, error)
	DeleteRevisions(name string) error
	// PutCode keeps a code archive (spec.Code) under its digest, once;
	// Code returns it (ErrNotFound if absent); CodeDigests lists them.
	PutCode(digest string, zip []byte) error
	Code(digest string) ([]byte, error)
	DeleteCode(digest string) error
	CodeDigests() ([]string, error)
	// CodeBytes is the size of every archive kept, together.
	CodeBytes() (int64, error)
	Close() error
}

var _ Registry = (*Store)(nil)

// Backuper is a registry that can write a consistent copy of itself while
// it serves (the single-node Store; `GET /v1/backup`).
type Backuper interface {
	// Backup writes a registry.db holding every acknowledged write (a
	// data directory with only that file restores it), calling size with
	// its length before the first byte.
	Backup(w io.Writer, size func(int64)) (int64, error)
}

var _ Backuper = (*Store)(nil)

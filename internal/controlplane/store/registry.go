package store

import "github.com/brisk-faas/brisk/internal/spec"

// Registry is the durable registry the control plane writes through: the
// single-node bbolt Store or the raft-replicated one (package replica).
//
// Both report a taken name with ErrExists and a missing one with ErrNotFound
// (test with errors.Is), with the same messages, and list records sorted by
// name or id.
type Registry interface {
	CreateFunction(f *spec.Function) error
	UpdateFunction(f *spec.Function) error
	DeleteFunction(name string) error
	Functions() ([]*spec.Function, error)
	PutWorker(w *Worker) error
	Workers() ([]*Worker, error)
	PutDataPlane(d *DataPlane) error
	DataPlanes() ([]*DataPlane, error)
	Close() error
}

var _ Registry = (*Store)(nil)

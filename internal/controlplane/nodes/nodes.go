// Package nodes holds the record of a registered worker node: what the
// store persists and the reconciler places sandboxes on, in a package of
// its own so that the reconciler links none of the store's bbolt and raft.
package nodes

import (
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
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
	// KeyID binds the node id to the key of the certificate that first
	// registered it (pki.KeyID; empty without TLS): no other key may
	// register it again.
	KeyID string `json:"key_id,omitempty"`
}

package controlplane

import (
	"sync"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
)

// watcher is one data plane's endpoint stream: deltas accumulate in pending
// and a sender goroutine flushes them as one batch.
type watcher struct {
	dpID    string
	mu      sync.Mutex
	pending *briskv1.EndpointBatch
	notify  chan struct{}
}

func (w *watcher) take() *briskv1.EndpointBatch {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.pending
	w.pending = nil
	return b
}

// subscribe registers a watcher whose first batch is a full snapshot,
// consistent with every delta published after it.
func (c *Cluster) subscribe(dpID string) *watcher {
	c.mu.Lock()
	defer c.mu.Unlock()
	snap := snapshotPB(c.r.Snapshot())
	snap.Auth = c.auth
	w := &watcher{dpID: dpID, pending: snap, notify: make(chan struct{}, 1)}
	w.notify <- struct{}{}
	c.watchers[w] = struct{}{}
	c.metrics.dataPlanes.Set(float64(len(c.watchers)))
	return w
}

func (c *Cluster) unsubscribe(w *watcher) {
	c.mu.Lock()
	delete(c.watchers, w)
	c.metrics.dataPlanes.Set(float64(len(c.watchers)))
	c.mu.Unlock()
}

// publishLocked applies edit to every watcher's pending batch.
func (c *Cluster) publishLocked(edit func(b *briskv1.EndpointBatch)) {
	for w := range c.watchers {
		w.mu.Lock()
		if w.pending == nil {
			w.pending = &briskv1.EndpointBatch{}
		}
		edit(w.pending)
		w.mu.Unlock()
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
}

// SetAuth records the tokens data planes accept for calls and sends them
// to every data plane (the whole set: tokens are few and change rarely).
func (c *Cluster) SetAuth(enabled bool, grants []auth.Grant) {
	a := &briskv1.AuthConfig{Enabled: enabled}
	for _, g := range grants {
		a.Tokens = append(a.Tokens, &briskv1.TokenGrant{Id: g.ID, Hash: g.Hash, Scopes: g.Scopes, Functions: g.Functions, Namespace: g.Namespace, SigningKey: g.SigningKey})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.auth = a
	c.publishLocked(func(b *briskv1.EndpointBatch) { b.Auth = a })
}

// publishRemoveLocked withdraws an endpoint. An add still pending in the same
// batch is cancelled, so the batch's order of application does not matter.
func (c *Cluster) publishRemoveLocked(id string) {
	c.publishLocked(func(b *briskv1.EndpointBatch) {
		for i, ep := range b.Added {
			if ep.GetSandboxId() == id {
				b.Added = append(b.Added[:i], b.Added[i+1:]...)
				break
			}
		}
		b.Removed = append(b.Removed, id)
	})
}

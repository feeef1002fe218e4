package runtime

import (
	"context"
	"fmt"
	"sync"
)

// LockEntry finds sandbox id in table (guarded by mu), takes its lock (a
// one-slot channel, lockOf) and checks that the entry is still the table's:
// a concurrent Kill or List may have finished it in the meantime
// (ErrNotFound). The host runtimes' Kill starts with it; unlock gives the
// lock back.
func LockEntry[S any](ctx context.Context, mu *sync.Mutex, table map[string]*S, id string, lockOf func(*S) chan struct{}) (sb *S, unlock func(), err error) {
	mu.Lock()
	sb = table[id]
	mu.Unlock()
	if sb == nil {
		return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	lock := lockOf(sb)
	select {
	case lock <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("kill sandbox %s: %w", id, ctx.Err())
	}
	mu.Lock()
	current := table[id] == sb
	mu.Unlock()
	if !current {
		<-lock
		return nil, nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return sb, func() { <-lock }, nil
}

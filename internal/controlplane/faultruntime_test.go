package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// faultRuntime is one node's emulated runtime (a product runtime: sandboxes
// are entries of a shared emulated.Host serving the trace function) with the
// failures the emulated runtime cannot produce on its own: eviction (a
// sandbox ends by itself), creations that wait for the test, and kills that
// fail or block. A worker daemon that "crashes" leaves its faultRuntime
// frozen; a restarted daemon gets a fresh faultRuntime over the same
// emulated runtime, so the sandboxes outlive the daemon as processes or
// containers would.
type faultRuntime struct {
	inner *emulated.Runtime

	mu       sync.Mutex
	exits    map[string]*exitSignal
	gate     chan struct{} // non-nil: Create waits until it is closed
	killGate chan struct{} // non-nil: Kill waits until it is closed
	killErr  func(id string, attempt int) error
	attempts map[string]int
	frozen   chan struct{} // closed by thaw; non-nil while frozen
	events   []rtEvent
}

type rtEvent struct {
	op string // "create", "kill", "kill-failed", "evict"
	id string
}

type exitSignal struct {
	once sync.Once
	ch   chan struct{}
	err  error
}

func (e *exitSignal) exit(err error) {
	e.once.Do(func() { e.err = err; close(e.ch) })
}

func newFaultRuntime(inner *emulated.Runtime) *faultRuntime {
	return &faultRuntime{inner: inner, exits: make(map[string]*exitSignal), attempts: make(map[string]int)}
}

var _ runtime.Runtime = (*faultRuntime)(nil)

func (r *faultRuntime) Name() string { return "emulated" }

func (r *faultRuntime) note(op, id string) {
	r.mu.Lock()
	r.events = append(r.events, rtEvent{op, id})
	r.mu.Unlock()
}

// SetEgress records the namespaces' egress policies it was given, as an
// "egress" event naming them ("team:1/0": one allow, no deny).
func (r *faultRuntime) SetEgress(policies map[string]spec.EgressPolicy) error {
	var parts []string
	for _, ns := range slices.Sorted(maps.Keys(policies)) {
		parts = append(parts, fmt.Sprintf("%s:%d/%d", ns, len(policies[ns].Allow), len(policies[ns].Deny)))
	}
	r.note("egress", strings.Join(parts, ","))
	return nil
}

// Events returns the runtime calls so far, in order.
func (r *faultRuntime) Events() []rtEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]rtEvent(nil), r.events...)
}

// count counts events of op (for id, or any id when id is "").
func (r *faultRuntime) count(op, id string) int {
	n := 0
	for _, e := range r.Events() {
		if e.op == op && (id == "" || e.id == id) {
			n++
		}
	}
	return n
}

// holdCreates makes every later Create wait until releaseCreates.
func (r *faultRuntime) holdCreates() {
	r.mu.Lock()
	r.gate = make(chan struct{})
	r.mu.Unlock()
}

func (r *faultRuntime) releaseCreates() {
	r.mu.Lock()
	if r.gate != nil {
		close(r.gate)
		r.gate = nil
	}
	r.mu.Unlock()
}

// holdKills makes every later Kill wait until releaseKills.
func (r *faultRuntime) holdKills() {
	r.mu.Lock()
	r.killGate = make(chan struct{})
	r.mu.Unlock()
}

func (r *faultRuntime) releaseKills() {
	r.mu.Lock()
	if r.killGate != nil {
		close(r.killGate)
		r.killGate = nil
	}
	r.mu.Unlock()
}

// failKills makes Kill return fail(id, attempt) when it is not nil.
func (r *faultRuntime) failKills(fail func(id string, attempt int) error) {
	r.mu.Lock()
	r.killErr = fail
	r.mu.Unlock()
}

// freeze models the daemon using this runtime crashing: from now on its
// calls change nothing (a dead process does nothing). Calls already waiting
// stay blocked until thaw, which the test runs at cleanup.
func (r *faultRuntime) freeze() {
	r.mu.Lock()
	r.frozen = make(chan struct{})
	r.mu.Unlock()
}

func (r *faultRuntime) thaw() {
	r.mu.Lock()
	if r.frozen != nil {
		close(r.frozen)
	}
	r.mu.Unlock()
	r.releaseCreates()
	r.releaseKills()
}

func (r *faultRuntime) frozenCh() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.frozen
}

func (r *faultRuntime) Create(ctx context.Context, s runtime.Spec) (*runtime.Instance, error) {
	r.mu.Lock()
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fr := r.frozenCh(); fr != nil {
		<-fr
		return nil, errors.New("faultruntime: daemon crashed")
	}
	inst, err := r.inner.Create(ctx, s)
	if err != nil {
		return nil, err
	}
	r.note("create", s.ID)
	e := &exitSignal{ch: make(chan struct{})}
	r.mu.Lock()
	r.exits[s.ID] = e
	r.mu.Unlock()
	out := *inst
	out.Exited = e.ch
	out.ExitErr = func() error { <-e.ch; return e.err }
	return &out, nil
}

func (r *faultRuntime) Kill(ctx context.Context, id string) error {
	r.mu.Lock()
	gate := r.killGate
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fr := r.frozenCh(); fr != nil {
		<-fr
		return runtime.ErrNotFound
	}
	r.mu.Lock()
	r.attempts[id]++
	attempt, fail := r.attempts[id], r.killErr
	r.mu.Unlock()
	if fail != nil {
		if err := fail(id, attempt); err != nil {
			r.note("kill-failed", id)
			return err
		}
	}
	err := r.inner.Kill(ctx, id)
	if err == nil {
		r.note("kill", id)
	}
	r.mu.Lock()
	e := r.exits[id]
	r.mu.Unlock()
	if e != nil {
		e.exit(nil) // ends the worker's exit watcher; it sees the kill is its own
	}
	return err
}

// evict ends a sandbox on its own, as an OOM kill or a crash would: the
// worker sees it exit.
func (r *faultRuntime) evict(id string) error {
	if err := r.inner.Kill(context.Background(), id); err != nil {
		return err
	}
	r.note("evict", id)
	r.mu.Lock()
	e := r.exits[id]
	r.mu.Unlock()
	if e == nil {
		return fmt.Errorf("evict %s: not created through this runtime", id)
	}
	e.exit(errors.New("evicted: out of memory"))
	return nil
}

func (r *faultRuntime) List(ctx context.Context) ([]runtime.Listed, error) {
	return r.inner.List(ctx)
}

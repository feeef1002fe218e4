package dataplane

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// model is a deliberately simple reference for Apply: maps rebuilt from the
// batch rules with no sharing, no copy-on-write and no object reuse.
type model struct {
	rev  map[string]uint64
	cc   map[string]int32
	eps  map[string]map[string]string // function -> sandbox -> address
	owns map[string]string            // sandbox -> function
}

func newModel() *model {
	return &model{rev: map[string]uint64{}, cc: map[string]int32{}, eps: map[string]map[string]string{}, owns: map[string]string{}}
}

func (m *model) apply(b *briskv1.EndpointBatch) {
	if b.Snapshot {
		*m = *newModel()
	}
	for _, f := range b.Functions {
		if r, ok := m.rev[f.Name]; ok && f.Revision < r {
			continue
		}
		m.rev[f.Name], m.cc[f.Name] = f.Revision, f.Concurrency
		if m.eps[f.Name] == nil {
			m.eps[f.Name] = map[string]string{}
		}
	}
	if !b.Snapshot {
		for _, name := range b.DeletedFunctions {
			for id := range m.eps[name] {
				delete(m.owns, id)
			}
			delete(m.rev, name)
			delete(m.cc, name)
			delete(m.eps, name)
		}
	}
	for _, e := range b.Added {
		if m.eps[e.Function] == nil {
			continue
		}
		if b.Snapshot {
			if _, dup := m.owns[e.SandboxId]; dup {
				continue
			}
		}
		if prev, ok := m.owns[e.SandboxId]; ok && prev != e.Function {
			delete(m.eps[prev], e.SandboxId)
		}
		m.eps[e.Function][e.SandboxId] = e.Address
		m.owns[e.SandboxId] = e.Function
	}
	if !b.Snapshot {
		for _, id := range b.Removed {
			if fn, ok := m.owns[id]; ok {
				delete(m.eps[fn], id)
				delete(m.owns, id)
			}
		}
	}
}

func randomBatch(r *rand.Rand) *briskv1.EndpointBatch {
	name := func() string { return fmt.Sprintf("f%d", r.IntN(5)) }
	sandbox := func() string { return fmt.Sprintf("sb-%d", r.IntN(12)) }
	b := &briskv1.EndpointBatch{Snapshot: r.IntN(8) == 0}
	for range r.IntN(3) {
		b.Functions = append(b.Functions, &briskv1.FunctionSpec{
			Name: name(), Revision: uint64(r.IntN(4)), Concurrency: int32(r.IntN(3)),
			LoadBalancing: []string{"", "round-robin", "knative"}[r.IntN(3)],
		})
	}
	for range r.IntN(2) {
		b.DeletedFunctions = append(b.DeletedFunctions, name())
	}
	for range r.IntN(4) {
		b.Added = append(b.Added, &briskv1.Endpoint{SandboxId: sandbox(), Function: name(), Address: fmt.Sprintf("127.0.0.1:%d", 1+r.IntN(2))})
	}
	for range r.IntN(3) {
		b.Removed = append(b.Removed, sandbox())
	}
	return b
}

func TestApplyMatchesModel(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		d, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		m := newModel()
		for step := range 30 {
			b := randomBatch(r)
			d.Apply(b)
			m.apply(b)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d step %d (batch %v): %s", seed, step, b, fmt.Sprintf(format, args...))
			}
			fns := maps.Collect(d.functions())
			if got, want := slices.Sorted(maps.Keys(fns)), slices.Sorted(maps.Keys(m.rev)); !slices.Equal(got, want) {
				fail("functions %v, want %v", got, want)
			}
			owns := map[string]string{}
			for name, fn := range fns {
				set := fn.set.Load()
				if set.Conf.revision != m.rev[name] || set.Conf.capacity != int(m.cc[name]) {
					fail("%s: revision %d capacity %d, want %d %d", name, set.Conf.revision, set.Conf.capacity, m.rev[name], m.cc[name])
				}
				got := map[string]string{}
				for i, e := range set.Endpoints {
					if i > 0 && set.Endpoints[i-1].id >= e.id {
						fail("%s: endpoints not sorted by id", name)
					}
					if set.Trackers[i] != e.tracker || e.tracker.Capacity() != set.Conf.capacity {
						fail("%s: tracker of %s out of step", name, e.id)
					}
					got[e.id] = e.addr
				}
				if !maps.Equal(got, m.eps[name]) {
					fail("%s: endpoints %v, want %v", name, got, m.eps[name])
				}
				for id := range got {
					owns[id] = name
				}
			}
			live := map[string]string{}
			for id := range owns {
				if name, ok := d.table.Owner(id); ok {
					live[id] = name
				}
			}
			if !maps.Equal(live, owns) {
				fail("sandbox index %v, want %v", live, owns)
			}
		}
	}
}

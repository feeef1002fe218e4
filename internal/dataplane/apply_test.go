package dataplane

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

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

// Apply publishes exactly what the routing table committed (the table's
// own rules are tested against a model in internal/dataplane/endpoints):
// every function routed has its committed set and nothing else is routed,
// and every upstream pool is held once per endpoint at its address, so a
// pool is closed when, and only when, its last endpoint leaves.
func TestApplyPublishesTheTable(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		d, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		for step := range 30 {
			b := randomBatch(r)
			d.Apply(b)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d step %d (batch %v): %s", seed, step, b, fmt.Sprintf(format, args...))
			}
			fns := maps.Collect(d.functions())
			if d.table.Len() != len(fns) {
				fail("%d functions routed, the table has %d", len(fns), d.table.Len())
			}
			holds := map[*connPool]int{}
			for name, fn := range fns {
				set := fn.set.Load()
				if set != d.table.Get(name) {
					fail("%s: the published set is not the table's", name)
				}
				if fn.name != name || namespaceOfSet(set) == "" || !(*d.namespaces.Load())[namespaceOfSet(set)] {
					fail("%s: name %q, namespace %q not counted", name, fn.name, namespaceOfSet(set))
				}
				for _, e := range set.Endpoints {
					if e.conns.Addr() != e.addr || d.pools[e.addr] != e.conns {
						fail("%s: endpoint %s's pool is not its address's", name, e.id)
					}
					holds[e.conns]++
				}
			}
			if len(holds) != len(d.pools) {
				fail("%d pools held by endpoints, %d open", len(holds), len(d.pools))
			}
			for p, n := range holds {
				if p.refs != n {
					fail("pool %s: %d references, held by %d endpoints", p.Addr(), p.refs, n)
				}
			}
		}
	}
}

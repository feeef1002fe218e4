package endpoints

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
)

type conf struct {
	rev   uint64
	slots int
	lb    string
}

func (c conf) Revision() uint64 { return c.rev }
func (c conf) Concurrency() int { return c.slots }

type ep struct {
	id, addr string
	tr       *loadbalance.Tracker
}

func (e *ep) SandboxID() string                 { return e.id }
func (e *ep) Address() string                   { return e.addr }
func (e *ep) LoadTracker() *loadbalance.Tracker { return e.tr }
func (e *ep) WithTracker(tr *loadbalance.Tracker) *ep {
	return &ep{id: e.id, addr: e.addr, tr: tr}
}

type table = Table[conf, *ep]

// batch is one step in the form of the control plane's endpoint stream.
type batch struct {
	snapshot bool
	fns      []conf // with names
	names    []string
	deleted  []string
	added    [][3]string // function, sandbox, address
	removed  []string
}

func (b batch) String() string {
	return fmt.Sprintf("{snapshot %v put %v %v delete %v add %v remove %v}", b.snapshot, b.names, b.fns, b.deleted, b.added, b.removed)
}

func apply(t *table, b batch) []Change[conf, *ep] {
	t.Begin(b.snapshot)
	for i, c := range b.fns {
		t.Put(b.names[i], c.rev, func(conf, bool) conf { return c })
	}
	if !b.snapshot {
		for _, name := range b.deleted {
			t.Delete(name)
		}
	}
	for _, a := range b.added {
		t.Add(a[0], a[1], a[2], func(capacity int) *ep { return &ep{id: a[1], addr: a[2], tr: loadbalance.NewTracker(capacity)} })
	}
	for _, id := range b.removed {
		t.Remove(id)
	}
	return t.Commit()
}

// model is a deliberately simple reference: maps rebuilt from the batch
// rules with no sharing, no copy-on-write and no record reuse.
type model struct {
	conf map[string]conf
	eps  map[string]map[string]string // function -> sandbox -> address
	owns map[string]string            // sandbox -> function
}

func newModel() *model {
	return &model{conf: map[string]conf{}, eps: map[string]map[string]string{}, owns: map[string]string{}}
}

func (m *model) apply(b batch) {
	if b.snapshot {
		*m = *newModel()
	}
	for i, c := range b.fns {
		name := b.names[i]
		if old, ok := m.conf[name]; ok && c.rev < old.rev {
			continue
		}
		m.conf[name] = c
		if m.eps[name] == nil {
			m.eps[name] = map[string]string{}
		}
	}
	if !b.snapshot {
		for _, name := range b.deleted {
			for id := range m.eps[name] {
				delete(m.owns, id)
			}
			delete(m.conf, name)
			delete(m.eps, name)
		}
	}
	for _, a := range b.added {
		fn, id, addr := a[0], a[1], a[2]
		if m.eps[fn] == nil {
			continue
		}
		if b.snapshot {
			if _, dup := m.owns[id]; dup {
				continue
			}
		}
		if prev, ok := m.owns[id]; ok && prev != fn {
			delete(m.eps[prev], id)
		}
		m.eps[fn][id] = addr
		m.owns[id] = fn
	}
	if !b.snapshot {
		for _, id := range b.removed {
			if fn, ok := m.owns[id]; ok {
				delete(m.eps[fn], id)
				delete(m.owns, id)
			}
		}
	}
}

func randomBatch(r *rand.Rand) batch {
	name := func() string { return fmt.Sprintf("f%d", r.IntN(5)) }
	sandbox := func() string { return fmt.Sprintf("sb-%d", r.IntN(12)) }
	b := batch{snapshot: r.IntN(8) == 0}
	for range r.IntN(3) {
		b.names = append(b.names, name())
		b.fns = append(b.fns, conf{rev: uint64(r.IntN(4)), slots: r.IntN(3)})
	}
	for range r.IntN(2) {
		b.deleted = append(b.deleted, name())
	}
	for range r.IntN(4) {
		b.added = append(b.added, [3]string{name(), sandbox(), fmt.Sprintf("127.0.0.1:%d", 1+r.IntN(2))})
	}
	for range r.IntN(3) {
		b.removed = append(b.removed, sandbox())
	}
	return b
}

// The table agrees with the model over random batch sequences, and its
// changes account for every function that appeared, changed or left.
func TestTableMatchesModel(t *testing.T) {
	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 1))
		tb := New[conf, *ep]()
		m := newModel()
		for step := range 30 {
			b := randomBatch(r)
			before := maps.Clone(tb.sets)
			changes := apply(tb, b)
			m.apply(b)
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("seed %d step %d (batch %v): %s", seed, step, b, fmt.Sprintf(format, args...))
			}
			if got, want := slices.Sorted(maps.Keys(tb.sets)), slices.Sorted(maps.Keys(m.conf)); !slices.Equal(got, want) {
				fail("functions %v, want %v", got, want)
			}
			owns := map[string]string{}
			for name, set := range tb.sets {
				if set.Conf != m.conf[name] {
					fail("%s: conf %+v, want %+v", name, set.Conf, m.conf[name])
				}
				got := map[string]string{}
				for i, e := range set.Endpoints {
					if i > 0 && set.Endpoints[i-1].id >= e.id {
						fail("%s: endpoints not sorted by id", name)
					}
					if set.Trackers[i] != e.tr || e.tr.Capacity() != set.Conf.slots {
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
			if !maps.Equal(tb.owner, owns) {
				fail("sandbox index %v, want %v", tb.owner, owns)
			}
			// Replaying the changes on the sets before gives the sets after.
			replay := maps.Clone(before)
			for _, c := range changes {
				if c.Old != replay[c.Name] {
					fail("change %s: old set is not the committed one", c.Name)
				}
				if c.New == nil {
					delete(replay, c.Name)
				} else {
					replay[c.Name] = c.New
				}
			}
			if !maps.Equal(replay, tb.sets) {
				fail("changes replayed give %v, want %v", replay, tb.sets)
			}
		}
	}
}

// A snapshot that lists an endpoint again at the same address keeps its
// record, so the calls counted on its tracker stay counted; at a new
// address it is a new record.
func TestSnapshotKeepsRecords(t *testing.T) {
	tb := New[conf, *ep]()
	apply(tb, batch{names: []string{"f"}, fns: []conf{{rev: 1, slots: 2}}, added: [][3]string{{"f", "a", "x:1"}, {"f", "b", "x:2"}}})
	a, _ := tb.Get("f").Find("a")
	b, _ := tb.Get("f").Find("b")
	a.tr.TryReserve()
	apply(tb, batch{snapshot: true, names: []string{"f"}, fns: []conf{{rev: 1, slots: 2}}, added: [][3]string{{"f", "a", "x:1"}, {"f", "b", "x:3"}}})
	a2, _ := tb.Get("f").Find("a")
	b2, _ := tb.Get("f").Find("b")
	if a2 != a || a2.tr.InFlight() != 1 {
		t.Errorf("a: %p (in flight %d), want the same record %p", a2, a2.tr.InFlight(), a)
	}
	if b2 == b || b2.addr != "x:3" {
		t.Errorf("b: %+v, want a new record at x:3", b2)
	}
	// A concurrency change puts every endpoint on a new tracker; the old
	// one stays with its call.
	apply(tb, batch{names: []string{"f"}, fns: []conf{{rev: 2, slots: 4}}})
	a3, _ := tb.Get("f").Find("a")
	if a3.tr == a.tr || a3.tr.Capacity() != 4 || a.tr.InFlight() != 1 {
		t.Errorf("after the change: tracker %p capacity %d, old in flight %d", a3.tr, a3.tr.Capacity(), a.tr.InFlight())
	}
}

// RemoveEndpoint takes out only the very record given: not one that
// replaced it at a new address.
func TestRemoveEndpointIsByRecord(t *testing.T) {
	tb := New[conf, *ep]()
	apply(tb, batch{names: []string{"f"}, fns: []conf{{rev: 1, slots: 1}}, added: [][3]string{{"f", "a", "x:1"}}})
	old, _ := tb.Get("f").Find("a")
	apply(tb, batch{added: [][3]string{{"f", "a", "x:2"}}})
	tb.Begin(false)
	if tb.RemoveEndpoint("f", old) {
		t.Error("removed the replaced record's successor")
	}
	tb.Commit()
	cur, _ := tb.Get("f").Find("a")
	tb.Begin(false)
	if !tb.RemoveEndpoint("f", cur) {
		t.Error("the current record was not removed")
	}
	if ch := tb.Commit(); len(ch) != 1 || len(ch[0].New.Endpoints) != 0 {
		t.Errorf("changes %+v", ch)
	}
	if _, ok := tb.Owner("a"); ok {
		t.Error("the sandbox is still indexed")
	}
}

// Pick holds the policy's choice's slot on the committed set's trackers.
func TestPick(t *testing.T) {
	tb := New[conf, *ep]()
	apply(tb, batch{names: []string{"f"}, fns: []conf{{rev: 1, slots: 1}}, added: [][3]string{{"f", "b", "x:2"}, {"f", "a", "x:1"}}})
	p, err := loadbalance.New("first-available", 1, loadbalance.NewRand(1))
	if err != nil {
		t.Fatal(err)
	}
	set := tb.Get("f")
	var got []string
	for range 3 {
		e, ok := set.Pick(p)
		if !ok {
			got = append(got, "-")
			continue
		}
		got = append(got, e.id)
	}
	if !slices.Equal(got, []string{"a", "b", "-"}) {
		t.Errorf("picks %v, want a, b, then none (first-available walks by id)", got)
	}
}

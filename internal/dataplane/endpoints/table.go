// Package endpoints is the data plane's routing table: each function's
// settings and its Ready sandboxes (endpoints), ordered and paired with the
// load-balancing trackers that internal/policy/loadbalance reads.
//
// A Table is a value stepped by batches (Begin, then Put, Delete, Add and
// Remove, then Commit), with no I/O, clock or lock. The data plane steps it
// with the control plane's endpoint stream and publishes each committed Set
// for its lock-free hot path; the simulator steps it with the reconciler's
// endpoint commands and routes its calls through the same sets and policies,
// so a load-balancing policy is compared on the table it runs on.
package endpoints

import (
	"slices"
	"sort"
	"strings"

	"github.com/brisk-faas/brisk/internal/policy/loadbalance"
)

// Conf is what the table needs of a function's settings.
type Conf interface {
	// Revision orders a function's settings: an older one is stale.
	Revision() uint64
	// Concurrency is a sandbox's slots (0: unlimited); trackers are made
	// with it.
	Concurrency() int
}

// Endpoint is the owner's record of one Ready sandbox. It is immutable
// while in a Set: calls in flight keep it after it leaves.
type Endpoint[E any] interface {
	comparable
	SandboxID() string
	Address() string
	LoadTracker() *loadbalance.Tracker
	// WithTracker is the endpoint on a new tracker, for a function whose
	// concurrency changed (calls in flight keep the old one).
	WithTracker(*loadbalance.Tracker) E
}

// Set is one committed view of a function: its settings and endpoints. It
// is never modified once committed, so a reader needs no lock.
type Set[C Conf, E Endpoint[E]] struct {
	Conf C
	// Endpoints are sorted by sandbox id, the order first-available and
	// round-robin walk.
	Endpoints []E
	// Trackers[i] is Endpoints[i].LoadTracker(): the policies' input.
	Trackers []*loadbalance.Tracker
}

// Pick is p's choice of an endpoint with a free slot, holding that slot.
func (s *Set[C, E]) Pick(p loadbalance.Policy) (E, bool) {
	i, ok := p.Pick(s.Trackers)
	if !ok {
		var zero E
		return zero, false
	}
	return s.Endpoints[i], true
}

// Find is the endpoint of sandbox id, if s has it.
func (s *Set[C, E]) Find(id string) (E, bool) {
	for _, e := range s.Endpoints {
		if e.SandboxID() == id {
			return e, true
		}
	}
	var zero E
	return zero, false
}

// Change is one function's change in a committed batch. A function deleted
// and put again within one batch gives two changes: the deletion first.
type Change[C Conf, E Endpoint[E]] struct {
	Name string
	Old  *Set[C, E] // nil: the function is new
	New  *Set[C, E] // nil: the function is deleted
}

// edit is a function's state within the open batch.
type edit[C Conf, E Endpoint[E]] struct {
	conf C
	eps  []E
	// gone: deleted in this batch; replaced: deleted, then put again.
	gone, replaced bool
}

// Table is the routing table. Its zero value is not usable: use New.
type Table[C Conf, E Endpoint[E]] struct {
	sets  map[string]*Set[C, E]
	owner map[string]string // sandbox id -> function name

	// The open batch.
	snapshot bool
	edits    map[string]*edit[C, E]
	touched  []string // edits' names in first-touch order: changes come out in it
	newOwner map[string]string
	changes  []Change[C, E]
}

// New returns an empty table.
func New[C Conf, E Endpoint[E]]() *Table[C, E] {
	return &Table[C, E]{sets: map[string]*Set[C, E]{}, owner: map[string]string{}, edits: map[string]*edit[C, E]{}}
}

// Get is a function's committed set, nil if the table has none.
func (t *Table[C, E]) Get(name string) *Set[C, E] { return t.sets[name] }

// Len is the number of committed functions.
func (t *Table[C, E]) Len() int { return len(t.sets) }

// Owner is the function whose endpoint sandbox id is, as committed.
func (t *Table[C, E]) Owner(id string) (string, bool) {
	name, ok := t.owner[id]
	return name, ok
}

// Begin opens a batch. A snapshot batch replaces the table: the functions
// it does not put are deleted, the endpoints it does not add are removed,
// and an endpoint added again at the same address keeps its record (and
// the calls counted on its tracker).
func (t *Table[C, E]) Begin(snapshot bool) {
	t.snapshot = snapshot
	clear(t.edits)
	t.touched = t.touched[:0]
	t.changes = t.changes[:0]
	if snapshot {
		t.newOwner = make(map[string]string, len(t.owner))
	}
}

// view is a function's state as the open batch sees it: its edit, else
// (outside a snapshot) its committed set.
func (t *Table[C, E]) view(name string) (e *edit[C, E], set *Set[C, E]) {
	if e := t.edits[name]; e != nil {
		if e.gone {
			return nil, nil
		}
		return e, nil
	}
	if t.snapshot {
		return nil, nil
	}
	return nil, t.sets[name]
}

// touch is name's edit, made from its committed set on first touch.
func (t *Table[C, E]) touch(name string) *edit[C, E] {
	if e := t.edits[name]; e != nil {
		return e
	}
	set := t.sets[name]
	e := &edit[C, E]{conf: set.Conf, eps: slices.Clone(set.Endpoints)}
	t.edits[name] = e
	t.touched = append(t.touched, name)
	return e
}

// Put sets a function's settings to conf(prev, ok), prev being its
// current ones (ok false: it has none). Settings of an older revision than
// the batch's view of the function are ignored, and Put reports false. In a
// snapshot, the first Put of a function starts from no endpoints and conf's
// prev is its committed settings, so a policy can carry its state over.
func (t *Table[C, E]) Put(name string, revision uint64, conf func(prev C, ok bool) C) bool {
	e, set := t.view(name)
	switch {
	case e != nil:
		if revision < e.conf.Revision() {
			return false
		}
		e.conf = conf(e.conf, true)
	case set != nil:
		if revision < set.Conf.Revision() {
			return false
		}
		e = t.touch(name)
		e.conf = conf(e.conf, true)
	default:
		prev, had := t.sets[name], false
		var pc C
		if prev != nil && t.snapshot {
			pc, had = prev.Conf, true
		}
		if old := t.edits[name]; old != nil { // deleted earlier in this batch
			*old = edit[C, E]{conf: conf(pc, had), replaced: true}
			return true
		}
		t.edits[name] = &edit[C, E]{conf: conf(pc, had)}
		t.touched = append(t.touched, name)
	}
	return true
}

// Delete deletes a function and forgets its endpoints.
func (t *Table[C, E]) Delete(name string) {
	e, set := t.view(name)
	if e == nil && set == nil {
		return
	}
	e = t.touch(name) // its endpoints: the committed ones still its, and this batch's
	owners := t.owners()
	for _, ep := range e.eps {
		if owners[ep.SandboxID()] == name {
			delete(owners, ep.SandboxID())
		}
	}
	e.gone, e.replaced, e.eps = true, false, nil
}

func (t *Table[C, E]) owners() map[string]string {
	if t.snapshot {
		return t.newOwner
	}
	return t.owner
}

// Add routes sandbox id at addr to a function, taking the sandbox from
// another function that had it. An endpoint already there at the same
// address is kept; otherwise mk makes the record (on a tracker of the
// function's concurrency). Add reports false for a function the batch does
// not know, and ignores a sandbox a snapshot lists twice.
func (t *Table[C, E]) Add(function, id, addr string, mk func(capacity int) E) bool {
	e, set := t.view(function)
	if e == nil && set == nil {
		return false
	}
	if t.snapshot { // e is the function's edit: a snapshot sees nothing else
		if _, dup := t.newOwner[id]; dup {
			return true
		}
		var rec E
		var kept bool
		if set := t.sets[function]; set != nil && t.owner[id] == function {
			rec, kept = set.Find(id)
			kept = kept && rec.Address() == addr
		}
		if !kept {
			rec = mk(slots(e.conf))
		}
		e.eps = append(e.eps, rec)
		t.newOwner[id] = function
		return true
	}
	if other, ok := t.owner[id]; ok && other != function {
		if oe, os := t.view(other); oe != nil || os != nil {
			t.drop(t.touch(other), id)
		}
	}
	e = t.touch(function)
	i := slices.IndexFunc(e.eps, func(ep E) bool { return ep.SandboxID() == id })
	switch {
	case i < 0:
		e.eps = append(e.eps, mk(slots(e.conf)))
	case e.eps[i].Address() != addr:
		e.eps[i] = mk(slots(e.conf))
	}
	t.owner[id] = function
	return true
}

// Remove unroutes sandbox id. A snapshot removes by not adding.
func (t *Table[C, E]) Remove(id string) {
	if t.snapshot {
		return
	}
	name, ok := t.owner[id]
	delete(t.owner, id)
	if !ok {
		return
	}
	if e, set := t.view(name); e == nil && set == nil {
		return
	}
	t.drop(t.touch(name), id)
}

// RemoveEndpoint unroutes ep if it is still the function's endpoint of
// its sandbox (not replaced, moved or gone), and reports whether it was.
func (t *Table[C, E]) RemoveEndpoint(function string, ep E) bool {
	if t.snapshot || t.owner[ep.SandboxID()] != function {
		return false
	}
	e, set := t.view(function)
	var eps []E
	switch {
	case e != nil:
		eps = e.eps
	case set != nil:
		eps = set.Endpoints
	}
	if !slices.Contains(eps, ep) {
		return false
	}
	t.Remove(ep.SandboxID())
	return true
}

func (t *Table[C, E]) drop(e *edit[C, E], id string) {
	e.eps = slices.DeleteFunc(e.eps, func(ep E) bool { return ep.SandboxID() == id })
}

// Commit closes the batch and returns its changes, in the order the batch
// first touched each function (a snapshot's deletions last, by name). The
// slice is reused by the next batch.
func (t *Table[C, E]) Commit() []Change[C, E] {
	for _, name := range t.touched {
		e := t.edits[name]
		old := t.sets[name]
		if e.gone || e.replaced {
			if old != nil {
				t.changes = append(t.changes, Change[C, E]{Name: name, Old: old})
				delete(t.sets, name)
				old = nil
			}
			if e.gone {
				continue
			}
		}
		set := build(e.conf, e.eps)
		t.sets[name] = set
		t.changes = append(t.changes, Change[C, E]{Name: name, Old: old, New: set})
	}
	if t.snapshot {
		var gone []string
		for name := range t.sets {
			if t.edits[name] == nil {
				gone = append(gone, name)
			}
		}
		sort.Strings(gone)
		for _, name := range gone {
			t.changes = append(t.changes, Change[C, E]{Name: name, Old: t.sets[name]})
			delete(t.sets, name)
		}
		t.owner, t.newOwner = t.newOwner, nil
	}
	t.snapshot = false
	clear(t.edits) // they share the committed sets' slices
	return t.changes
}

// build makes a committed set: endpoints on trackers of conf's
// concurrency, sorted by sandbox id.
func build[C Conf, E Endpoint[E]](conf C, eps []E) *Set[C, E] {
	n := slots(conf)
	for i, ep := range eps {
		if ep.LoadTracker().Capacity() != n {
			eps[i] = ep.WithTracker(loadbalance.NewTracker(n))
		}
	}
	slices.SortFunc(eps, func(a, b E) int { return strings.Compare(a.SandboxID(), b.SandboxID()) })
	trackers := make([]*loadbalance.Tracker, len(eps))
	for i, ep := range eps {
		trackers[i] = ep.LoadTracker()
	}
	return &Set[C, E]{Conf: conf, Endpoints: eps, Trackers: trackers}
}

// slots is a tracker's capacity for conf: its concurrency, 0 (unlimited)
// for anything below.
func slots[C Conf](conf C) int { return max(conf.Concurrency(), 0) }

package placement_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/placement"
)

// The conformance suite: one table of checks run against every name in
// placement.Names(). Each check is a plain function that returns an error
// instead of calling t.Fatal, so TestConformanceChecksCanFail can run it on
// deliberately broken policies and prove it detects them.

// traits says which behaviours a policy promises beyond the contract every
// policy keeps. A new policy must be classified here or the suite fails.
type traits struct {
	hashing   bool // a Key has a stable home on an unloaded cluster, and keys spread
	loadAware bool // a function leaves a home whose Load is far above the bound
}

var policyTraits = map[string]traits{
	placement.NameKubernetes: {},
	placement.NameRandom:     {},
	placement.NameRoundRobin: {},
	placement.NameBinPacking: {},
	placement.NameSharding:   {hashing: true},
	placement.NameCHBL:       {hashing: true, loadAware: true},
	placement.NameCHRLU:      {hashing: true, loadAware: true},
	placement.NameLocality:   {},
}

// maker builds a fresh policy from a seed.
type maker func(seed uint64) placement.Policy

type conformanceCheck struct {
	name    string
	applies func(traits) bool
	run     func(maker) error
}

func always(traits) bool { return true }

var conformanceChecks = []conformanceCheck{
	{"contract", always, checkContract},
	{"deterministic", always, checkDeterministic},
	{"sizes", always, checkSizes},
	{"stable home", func(t traits) bool { return t.hashing }, checkStableHome},
	{"keys spread", func(t traits) bool { return t.hashing }, checkSpread},
	{"leaves a hot home", func(t traits) bool { return t.loadAware }, checkLeavesHotHome},
}

func TestConformance(t *testing.T) {
	for _, name := range placement.Names() {
		tr, ok := policyTraits[name]
		if !ok {
			t.Errorf("policy %q has no entry in policyTraits: classify it so the suite knows what to check", name)
			continue
		}
		mk := func(seed uint64) placement.Policy {
			p, err := placement.New(name, seeded(seed))
			if err != nil {
				panic(err)
			}
			return p
		}
		for _, c := range conformanceChecks {
			if !c.applies(tr) {
				continue
			}
			t.Run(name+"/"+c.name, func(t *testing.T) {
				if err := c.run(mk); err != nil {
					t.Error(err)
				}
			})
		}
	}
	for name := range policyTraits {
		if !slices.Contains(placement.Names(), name) {
			t.Errorf("policyTraits lists %q, which Names() does not", name)
		}
	}
}

// place calls p.Place and turns a panic into an error.
func place(p placement.Policy, nodes []placement.Node, r placement.Request) (got int, err error, panicked error) {
	defer func() {
		if v := recover(); v != nil {
			panicked = fmt.Errorf("Place panicked: %v", v)
		}
	}()
	got, err = p.Place(nodes, r)
	return got, err, nil
}

// sameNodes compares node slices field by field, Load by its bits (NaN).
func sameNodes(a, b []placement.Node) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if math.Float64bits(x.Load) != math.Float64bits(y.Load) {
			return false
		}
		x.Load, y.Load = 0, 0
		if x != y {
			return false
		}
	}
	return true
}

// verdict checks one result against the contract: a valid index of a
// feasible node, or -1 and ErrNoCapacity exactly when no node is feasible.
func verdict(nodes []placement.Node, r placement.Request, got int, err error) error {
	anyFeasible := false
	for _, nd := range nodes {
		anyFeasible = anyFeasible || refFeasible(nd, r.Resources)
	}
	if !anyFeasible {
		if !errors.Is(err, placement.ErrNoCapacity) || got != -1 {
			return fmt.Errorf("no node is feasible, Place = %d, %v; want -1, ErrNoCapacity", got, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("Place error %v with a feasible node present", err)
	}
	if got < 0 || got >= len(nodes) || !refFeasible(nodes[got], r.Resources) {
		return fmt.Errorf("Place = %d: not a feasible node of %d", got, len(nodes))
	}
	return nil
}

var keyPool = func() []string {
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("ns/fn-%d", i)
	}
	return keys
}()

// drive runs one reproducible scenario of steps placements on a changing
// cluster: random requests (keys, rates, cold/warm ratios, locality hints),
// loads including NaN, Inf and negative values, placements recorded on the
// chosen node, nodes drained, added and removed. Every result is checked
// against the contract and for modified inputs; the choices are returned.
func drive(p placement.Policy, seed uint64, steps int) ([]int, error) {
	gen := seeded(seed)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nextID := 0
	newNode := func(nd placement.Node) placement.Node {
		if gen.IntN(10) != 0 { // a few nodes without an ID
			nd.ID = fmt.Sprintf("w-%d", nextID)
		}
		nextID++
		switch gen.IntN(12) {
		case 0:
			nd.Load = math.NaN()
		case 1:
			nd.Load = -1
		case 2:
			nd.Load = math.Inf(1)
		case 3, 4, 5:
		default:
			nd.Load = 3 * gen.Float64()
		}
		return nd
	}
	nodes := randomCluster(gen, 1+gen.IntN(60))
	for i := range nodes {
		nodes[i] = newNode(nodes[i])
	}
	choices := make([]int, 0, steps)
	for step := range steps {
		now = now.Add(time.Duration(gen.IntN(3000)) * time.Millisecond)
		r := placement.Request{Resources: randomRequest(gen), Key: keyPool[gen.IntN(len(keyPool))], Now: now}
		if gen.IntN(2) == 0 {
			r.Rate = 100 * gen.Float64()
		}
		if gen.IntN(2) == 0 {
			r.ColdWarmRatio = 10 * gen.Float64()
		}
		if gen.IntN(3) != 0 {
			hints := make([]placement.Locality, len(nodes))
			for i := range hints {
				hints[i] = placement.Locality(gen.IntN(4)) // 3 is out of range on purpose
			}
			r.Locality = func(i int) placement.Locality { return hints[i] }
		}
		before := slices.Clone(nodes)
		got, err, panicked := place(p, nodes, r)
		if panicked != nil {
			return choices, fmt.Errorf("step %d: %w", step, panicked)
		}
		if !sameNodes(before, nodes) {
			return choices, fmt.Errorf("step %d: Place modified its nodes", step)
		}
		if err := verdict(nodes, r, got, err); err != nil {
			return choices, fmt.Errorf("step %d (%d nodes): %w", step, len(nodes), err)
		}
		choices = append(choices, got)
		if got >= 0 {
			nd := &nodes[got]
			nd.Requested.MilliCPU += r.MilliCPU
			nd.Requested.MemoryMB += r.MemoryMB
			nd.Sandboxes++
			if !math.IsNaN(nd.Load) {
				nd.Load += 0.05
			}
		}
		switch gen.IntN(20) {
		case 0: // drain or revive a node
			i := gen.IntN(len(nodes))
			nodes[i].Schedulable = !nodes[i].Schedulable
		case 1: // a node leaves
			if len(nodes) > 1 {
				i := gen.IntN(len(nodes))
				nodes = slices.Delete(nodes, i, i+1)
			}
		case 2: // a node joins
			nodes = append(nodes, newNode(randomCluster(gen, 1)[0]))
		case 3: // fresh load reports
			for i := range nodes {
				nodes[i].Load = 2 * gen.Float64()
			}
		}
	}
	return choices, nil
}

// checkContract: over many scenarios, every choice is feasible, ErrNoCapacity
// comes exactly when nothing fits, and nodes are never modified.
func checkContract(mk maker) error {
	for seed := range uint64(40) {
		if _, err := drive(mk(seed), seed, 400); err != nil {
			return fmt.Errorf("scenario %d: %w", seed, err)
		}
	}
	return nil
}

// checkDeterministic: the same seed and the same calls give the same choices.
func checkDeterministic(mk maker) error {
	for seed := range uint64(10) {
		a, errA := drive(mk(seed), 1000+seed, 300)
		b, errB := drive(mk(seed), 1000+seed, 300)
		if errA != nil || errB != nil {
			return fmt.Errorf("scenario %d: %v / %v", seed, errA, errB)
		}
		if !slices.Equal(a, b) {
			i := 0
			for i < min(len(a), len(b)) && a[i] == b[i] {
				i++
			}
			return fmt.Errorf("scenario %d: two runs with seed %d diverge at call %d", seed, seed, i)
		}
	}
	return nil
}

// checkSizes: empty clusters, a single node (feasible or not) and 1,000 nodes.
func checkSizes(mk maker) error {
	req := placement.Request{Resources: res{MilliCPU: 500, MemoryMB: 512}, Key: "ns/f",
		Now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	one := func(nd placement.Node) []placement.Node { nd.ID = "w-0"; return []placement.Node{nd} }
	big := make([]placement.Node, 1000)
	for i := range big {
		big[i] = node(int64(i%9)*500, int64(i%7)*600)
		big[i].ID = fmt.Sprintf("w-%d", i)
		big[i].Load = float64(i%5) / 2
	}
	fullBig := slices.Clone(big)
	for i := range fullBig {
		fullBig[i].Requested = res{MilliCPU: 4000, MemoryMB: 4096}
	}
	for _, tc := range []struct {
		label string
		nodes []placement.Node
	}{
		{"nil", nil},
		{"empty", []placement.Node{}},
		{"one feasible", one(node(0, 0))},
		{"one full", one(node(4000, 0))},
		{"one unschedulable", one(unschedulable(node(0, 0)))},
		{"1000 nodes", big},
		{"1000 full nodes", fullBig},
	} {
		for seed := range uint64(3) {
			p := mk(seed)
			for call := range 3 { // the first call builds caches; later ones reuse them
				before := slices.Clone(tc.nodes)
				got, err, panicked := place(p, tc.nodes, req)
				if panicked != nil {
					return fmt.Errorf("%s: %w", tc.label, panicked)
				}
				if !sameNodes(before, tc.nodes) {
					return fmt.Errorf("%s: Place modified its nodes", tc.label)
				}
				if err := verdict(tc.nodes, req, got, err); err != nil {
					return fmt.Errorf("%s, call %d: %w", tc.label, call, err)
				}
			}
		}
	}
	return nil
}

// unloaded is n empty, schedulable nodes with IDs and no load.
func unloaded(n int) []placement.Node {
	nodes := make([]placement.Node, n)
	for i := range nodes {
		nodes[i] = node(0, 0)
		nodes[i].ID = fmt.Sprintf("worker-%03d", i)
	}
	return nodes
}

// checkStableHome: on an unloaded cluster a key goes to the same node on
// every call, from one policy value and from two with different seeds.
func checkStableHome(mk maker) error {
	nodes := unloaded(20)
	req := res{MilliCPU: 250, MemoryMB: 256}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p, q := mk(1), mk(2)
	for k := range 50 {
		key := fmt.Sprintf("ns/fn-%d", k)
		home := -1
		for call := range 8 {
			now = now.Add(time.Second)
			for _, pol := range []placement.Policy{p, q} {
				got, err, panicked := place(pol, nodes, placement.Request{Resources: req, Key: key, Now: now})
				if panicked != nil || err != nil {
					return fmt.Errorf("key %s: Place = %d, %v, %v", key, got, err, panicked)
				}
				if home < 0 {
					home = got
				} else if got != home {
					return fmt.Errorf("key %s, call %d: went to node %d, earlier to %d", key, call, got, home)
				}
			}
		}
	}
	return nil
}

// checkSpread: at 100 nodes, 1,000 keys have more than 50 distinct homes.
func checkSpread(mk maker) error {
	nodes := unloaded(100)
	p := mk(1)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	homes := make(map[int]int)
	for k := range 1000 {
		got, err, panicked := place(p, nodes, placement.Request{Resources: res{MilliCPU: 250, MemoryMB: 256},
			Key: fmt.Sprintf("tenant-%d/function-%d", k%7, k), Now: now})
		if panicked != nil || err != nil {
			return fmt.Errorf("Place = %d, %v, %v", got, err, panicked)
		}
		homes[got]++
	}
	if len(homes) <= 50 {
		return fmt.Errorf("1000 keys used %d distinct nodes of 100, want > 50", len(homes))
	}
	return nil
}

// checkLeavesHotHome: with every node at load 0.3 except a key's home at
// 100 (far above any bound), the key goes elsewhere.
func checkLeavesHotHome(mk maker) error {
	req := res{MilliCPU: 250, MemoryMB: 256}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for k := range 30 {
		key := fmt.Sprintf("ns/fn-%d", k)
		nodes := unloaded(10)
		home, err := mk(1).Place(nodes, placement.Request{Resources: req, Key: key, Now: now})
		if err != nil {
			return err
		}
		for i := range nodes {
			nodes[i].Load = 0.3
		}
		nodes[home].Load = 100
		got, err, panicked := place(mk(1), nodes, placement.Request{Resources: req, Key: key, Now: now})
		if panicked != nil || err != nil {
			return fmt.Errorf("key %s: Place = %d, %v, %v", key, got, err, panicked)
		}
		if got == home {
			return fmt.Errorf("key %s stayed on its home %d at load 100 (others 0.3)", key, home)
		}
	}
	return nil
}

// Deliberately broken policies for TestConformanceChecksCanFail.

// firstNode returns node 0 whether or not it fits.
type firstNode struct{}

func (firstNode) Place(nodes []placement.Node, _ placement.Request) (int, error) {
	if len(nodes) == 0 {
		return -1, placement.ErrNoCapacity
	}
	return 0, nil
}

// neverPlaces always reports no capacity.
type neverPlaces struct{}

func (neverPlaces) Place([]placement.Node, placement.Request) (int, error) {
	return -1, placement.ErrNoCapacity
}

// firstFeasible is a correct but key-blind policy: everything goes to the
// first feasible node.
type firstFeasible struct{}

func (firstFeasible) Place(nodes []placement.Node, r placement.Request) (int, error) {
	for i := range nodes {
		if placement.Feasible(&nodes[i], r.Resources) {
			return i, nil
		}
	}
	return -1, placement.ErrNoCapacity
}

// scribbler places correctly, then bumps the chosen node's load in place.
type scribbler struct{ firstFeasible }

func (s scribbler) Place(nodes []placement.Node, r placement.Request) (int, error) {
	i, err := s.firstFeasible.Place(nodes, r)
	if err == nil {
		nodes[i].Load++
	}
	return i, err
}

// crashesWhenEmpty indexes nodes[0] unconditionally.
type crashesWhenEmpty struct{ firstFeasible }

func (c crashesWhenEmpty) Place(nodes []placement.Node, r placement.Request) (int, error) {
	_ = nodes[0].ID
	return c.firstFeasible.Place(nodes, r)
}

// sharedCounter rotates with a package-level counter, so two values built
// with the same seed do not repeat each other's choices.
var sharedCounter int

type leaky struct{}

func (leaky) Place(nodes []placement.Node, r placement.Request) (int, error) {
	sharedCounter++
	n := len(nodes)
	for k := range n {
		if i := (sharedCounter + k) % n; placement.Feasible(&nodes[i], r.Resources) {
			return i, nil
		}
	}
	return -1, placement.ErrNoCapacity
}

func TestConformanceChecksCanFail(t *testing.T) {
	fixed := func(p placement.Policy) maker { return func(uint64) placement.Policy { return p } }
	kube := func(seed uint64) placement.Policy { return placement.NewKubernetes(seeded(seed)) }
	random := func(seed uint64) placement.Policy { return placement.NewRandom(seeded(seed)) }
	sharding := func(uint64) placement.Policy { return placement.NewSharding() }
	tests := []struct {
		label string
		check func(maker) error
		mk    maker
	}{
		{"contract catches an infeasible choice", checkContract, fixed(firstNode{})},
		{"contract catches a missed placement", checkContract, fixed(neverPlaces{})},
		{"contract catches modified nodes", checkContract, fixed(scribbler{})},
		{"determinism catches shared state", checkDeterministic, func(uint64) placement.Policy { return leaky{} }},
		{"sizes catch a panic on no nodes", checkSizes, fixed(crashesWhenEmpty{})},
		{"sizes catch an infeasible choice", checkSizes, fixed(firstNode{})},
		{"stable home catches randomness", checkStableHome, random},
		{"stable home catches load balancing", checkStableHome, kube},
		{"spread catches a key-blind policy", checkSpread, fixed(firstFeasible{})},
		{"hot home catches a load-blind policy", checkLeavesHotHome, sharding},
	}
	for _, tt := range tests {
		t.Run(tt.label, func(t *testing.T) {
			if err := tt.check(tt.mk); err == nil {
				t.Error("check passed a broken policy")
			} else {
				t.Logf("caught: %v", err)
			}
		})
	}
}

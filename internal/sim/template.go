package sim

import (
	"fmt"
	"math"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/hashx"
)

// DefaultTemplateStart is a sandbox's start from its function's template
// (a fork of a pre-initialised interpreter) when Config.TemplateStart is
// not set: a few milliseconds, against 100 ms and more for a fresh Python
// start (the interpreter and the function's imports).
const DefaultTemplateStart = 5 * time.Millisecond

// nodeID is the simulated node i's id (the worker id it registers with).
func nodeID(i int) string { return fmt.Sprintf("sim-%05d", i) }

// TemplateCount is how many of nodes hold each function's template at
// fraction: ⌈fraction × nodes⌉, at least one when fraction > 0, all of
// them at 1 and above, none at 0 (or below, or NaN).
func TemplateCount(fraction float64, nodes int) int {
	if nodes <= 0 || !(fraction > 0) {
		return 0
	}
	if fraction >= 1 {
		return nodes
	}
	// The slack keeps a product that lands a rounding error above an
	// integer (0.07 × 100 = 7.000000000000001) on that integer.
	k := int(math.Ceil(fraction*float64(nodes) - 1e-9))
	return min(max(k, 1), nodes)
}

// TemplateNodes returns the indices in nodeIDs of the nodes holding the
// template of function at fraction, ascending: the TemplateCount nodes with
// the highest rendezvous score hash(function) ⊕ hash(node) (mixed), ties to
// the lower index. A function's set depends only on its name and the node
// ids, so it is the same on every run, adding a node moves a function's
// template to it only when it scores in the function's top set, and the
// sets of different functions are independent (spread over the nodes).
// The simulator places templates this way.
func TemplateNodes(function string, nodeIDs []string, fraction float64) []int {
	k := TemplateCount(fraction, len(nodeIDs))
	if k == 0 {
		return nil
	}
	hashes := make([]uint64, len(nodeIDs))
	for i, id := range nodeIDs {
		hashes[i] = nodeHash(id)
	}
	var out []int
	cut := cutOf(function, hashes, k, nil)
	for i, h := range hashes {
		if cut.admits(h, i) {
			out = append(out, i)
		}
	}
	return out
}

func nodeHash(id string) uint64 { return hashx.FNV1a(hashx.Offset64, id) }

// hrw is one node's rendezvous score for a function; a ranks above b when
// its score is higher or, on a 64-bit tie, its index lower.
type hrw struct {
	s uint64
	i int32
}

func (a hrw) above(b hrw) bool { return a.s > b.s || (a.s == b.s && a.i < b.i) }

func score(fnHash, nodeHash uint64, i int) hrw { return hrw{hashx.Mix(fnHash ^ nodeHash), int32(i)} }

// templateCut is a function's template set, as its hash and its k-th
// highest score: the nodes scoring at or above it hold the template. One
// value per function, whatever the number of nodes.
type templateCut struct {
	fnHash uint64
	kth    hrw
	set    bool
}

func (c *templateCut) admits(nodeHash uint64, i int) bool {
	return !c.kth.above(score(c.fnHash, nodeHash, i))
}

// cutOf computes function's cut over the nodes with hashes: O(len(hashes))
// by selection. buf, when long enough, is reused for the scores.
func cutOf(function string, hashes []uint64, k int, buf []hrw) templateCut {
	c := templateCut{fnHash: hashx.FNV1a(hashx.Offset64, function), set: true}
	buf = buf[:0]
	for i, h := range hashes {
		buf = append(buf, score(c.fnHash, h, i))
	}
	c.kth = selectRank(buf, k-1)
	return c
}

// selectRank reorders a so that a[r] is the element of rank r (0: the
// highest) and returns it: Hoare's quickselect. Scores are hashes, so the
// middle element is as good a pivot as any; indices make every element
// distinct, so the partition always shrinks.
func selectRank(a []hrw, r int) hrw {
	lo, hi := 0, len(a)-1
	for lo < hi {
		p := a[lo+(hi-lo)/2]
		i, j := lo, hi
		for i <= j {
			for a[i].above(p) {
				i++
			}
			for p.above(a[j]) {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case r <= j:
			hi = j
		case r >= i:
			lo = i
		default:
			return a[r]
		}
	}
	return a[r]
}

// templates is the run's template placement: k nodes per function.
type templates struct {
	k      int
	all    bool     // every node holds every template
	hashes []uint64 // per node, by index; nil when k is 0 or all
	buf    []hrw
}

func newTemplates(nodes []*node, fraction float64) templates {
	t := templates{k: TemplateCount(fraction, len(nodes))}
	if t.all = t.k > 0 && t.k == len(nodes); t.k == 0 || t.all {
		return t
	}
	t.hashes = make([]uint64, len(nodes))
	for i, n := range nodes {
		t.hashes[i] = nodeHash(n.id)
	}
	t.buf = make([]hrw, 0, len(nodes))
	return t
}

// holds says whether n holds fn's template; fn's cut is computed on the
// first question about it.
func (t *templates) holds(fn *function, n *node) bool {
	switch {
	case t.k == 0:
		return false
	case t.all:
		return true
	}
	if !fn.tmpl.set {
		fn.tmpl = cutOf(fn.name, t.hashes, t.k, t.buf)
	}
	return fn.tmpl.admits(t.hashes[n.idx], n.idx)
}

// reportTemplates sends each node's heartbeat listing the templates it
// holds (they never change in a run), as a worker's heartbeat does: the
// reconciler's locality policy then prefers template nodes.
func (sm *simulator) reportTemplates() {
	if sm.tmpl.k == 0 {
		return
	}
	for _, n := range sm.nodeList {
		set := &briskv1.TemplateSet{}
		for _, fn := range sm.fnByIdx {
			if sm.tmpl.holds(fn, n) {
				set.Templates = append(set.Templates, &briskv1.HeldTemplate{Function: fn.name, Revision: fn.spec.Revision})
			}
		}
		sm.step(reconciler.WorkerUpdates{Node: n.id, Updates: &briskv1.Updates{Heartbeat: &briskv1.Heartbeat{
			Capacity: &briskv1.Resources{MilliCpu: int64(n.cores * 1000)}, HeldTemplates: set}}})
	}
}

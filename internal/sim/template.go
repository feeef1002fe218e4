package sim

import (
	"fmt"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/policy/templateset"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// DefaultTemplateStart is a sandbox's start from its function's template
// (a fork of a pre-initialised interpreter) when Config.TemplateStart is
// not set: a few milliseconds, against 100 ms and more for a fresh Python
// start (the interpreter and the function's imports).
const DefaultTemplateStart = 5 * time.Millisecond

// nodeID is the simulated node i's id (the worker id it registers with).
func nodeID(i int) string { return fmt.Sprintf("sim-%05d", i) }

// templates is the run's template placement: k nodes per function.
type templates struct {
	k      int
	all    bool     // every node holds every template
	hashes []uint64 // per node, by index; nil when k is 0 or all
	buf    []templateset.Score
}

func newTemplates(nodes []*node, fraction float64) templates {
	t := templates{k: templateset.Count(fraction, len(nodes))}
	if t.all = t.k > 0 && t.k == len(nodes); t.k == 0 || t.all {
		return t
	}
	t.hashes = make([]uint64, len(nodes))
	for i, n := range nodes {
		t.hashes[i] = templateset.NodeHash(n.id)
	}
	t.buf = make([]templateset.Score, 0, len(nodes))
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
	if !fn.tmpl.Set {
		fn.tmpl = templateset.CutOf(fn.name, t.hashes, t.k, t.buf)
	}
	return fn.tmpl.Admits(t.hashes[n.idx], n.idx)
}

// reportTemplates sends each node's heartbeat listing the templates it
// holds (they never change in a run), as a worker's heartbeat does: the
// reconciler's locality policy then prefers template nodes.
func (sm *simulator) reportTemplates() {
	if sm.tmpl.k == 0 {
		return
	}
	for _, n := range sm.nodeList {
		hb := &reconciler.Heartbeat{Capacity: spec.Resources{MilliCPU: int64(n.cores * 1000)}, HeldSet: true}
		for _, fn := range sm.fnByIdx {
			if sm.tmpl.holds(fn, n) {
				hb.Held = append(hb.Held, reconciler.HeldTemplate{Function: fn.name, Revision: fn.spec.Revision})
			}
		}
		sm.step(reconciler.WorkerUpdates{Node: n.id, Updates: reconciler.Updates{Heartbeat: hb}})
	}
}

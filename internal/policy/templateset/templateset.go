// Package templateset decides which nodes hold a function's template
// (docs/languages.md, "Templates"; PulseNet §6.5 keeps snapshots on a
// subset of the nodes): the ⌈fraction × nodes⌉ nodes of highest rendezvous
// score for the function. The control plane offers a function from source
// to those nodes at deploy, and the simulator places templates the same
// way, so that `brisk sim --template-fraction` measures the policy the
// cluster runs.
package templateset

import (
	"math"

	"github.com/brisk-faas/brisk/internal/hashx"
)

// Count is how many of nodes hold each function's template at fraction:
// ⌈fraction × nodes⌉, at least one when fraction > 0, all of them at 1 and
// above, none at 0 (or below, or NaN).
func Count(fraction float64, nodes int) int {
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

// NodeHash is a node's hash for the scores (of its id).
func NodeHash(id string) uint64 { return hashx.FNV1a(hashx.Offset64, id) }

// Nodes returns the indices in nodeIDs of the nodes holding function's
// template at fraction, ascending: the Count nodes with the highest
// rendezvous score hash(function) ⊕ hash(node) (mixed), ties to the lower
// index. A function's set depends only on its name and the node ids, so
// it is the same on every run, adding a node moves a function's template
// to it only when it scores in the function's top set, and the sets of
// different functions are independent (spread over the nodes).
func Nodes(function string, nodeIDs []string, fraction float64) []int {
	k := Count(fraction, len(nodeIDs))
	if k == 0 {
		return nil
	}
	hashes := make([]uint64, len(nodeIDs))
	for i, id := range nodeIDs {
		hashes[i] = NodeHash(id)
	}
	var out []int
	cut := CutOf(function, hashes, k, nil)
	for i, h := range hashes {
		if cut.Admits(h, i) {
			out = append(out, i)
		}
	}
	return out
}

// Score is one node's rendezvous score for a function (CutOf's scratch
// buffer holds them); a ranks above b when its score is higher or, on a
// 64-bit tie, its index lower.
type Score struct {
	s uint64
	i int32
}

func (a Score) above(b Score) bool { return a.s > b.s || (a.s == b.s && a.i < b.i) }

func score(fnHash, nodeHash uint64, i int) Score {
	return Score{hashx.Mix(fnHash ^ nodeHash), int32(i)}
}

// Cut is a function's template set, as its hash and its k-th highest
// score: the nodes scoring at or above it hold the template. One value per
// function, whatever the number of nodes. The zero Cut is unset.
type Cut struct {
	fnHash uint64
	kth    Score
	Set    bool
}

// Admits says whether the node of hash nodeHash at index i holds the
// template.
func (c *Cut) Admits(nodeHash uint64, i int) bool {
	return !c.kth.above(score(c.fnHash, nodeHash, i))
}

// CutOf computes function's cut over the nodes with hashes (k ≥ 1 of
// them): O(len(hashes)) by selection. buf, when long enough, is reused
// for the scores.
func CutOf(function string, hashes []uint64, k int, buf []Score) Cut {
	c := Cut{fnHash: hashx.FNV1a(hashx.Offset64, function), Set: true}
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
func selectRank(a []Score, r int) Score {
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

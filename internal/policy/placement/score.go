package placement

import "math"

// The scorers below follow kube-scheduler's noderesources plugins
// (least_allocated.go, most_allocated.go, balanced_allocation.go), including
// their integer truncation, so that scores and therefore ties match.

// MaxNodeScore is the top score of one scoring plugin, as in kube-scheduler.
const MaxNodeScore int64 = 100

// nonZeroRequested is the node's request total as the allocation scorers see
// it after adding req: kube-scheduler's NonZeroRequested + nonZero(podRequest).
func nonZeroRequested(n *Node, req Resources) Resources {
	r := Resources{
		MilliCPU: max(n.Requested.MilliCPU, n.NonZeroRequested.MilliCPU),
		MemoryMB: max(n.Requested.MemoryMB, n.NonZeroRequested.MemoryMB),
	}
	z := req.NonZero()
	r.MilliCPU += z.MilliCPU
	r.MemoryMB += z.MemoryMB
	return r
}

// LeastAllocatedScore is NodeResourcesFit's default LeastAllocated strategy
// with weights cpu=1, memory=1: the mean free share after placing req, 0..100.
// A resource the node has none of is left out of the mean, as in kube.
func LeastAllocatedScore(n *Node, req Resources) int64 {
	r := nonZeroRequested(n, req)
	var sum, weights int64
	if a := n.Allocatable.MilliCPU; a != 0 {
		sum += leastRequested(r.MilliCPU, a)
		weights++
	}
	if a := n.Allocatable.MemoryMB; a != 0 {
		sum += leastRequested(r.MemoryMB, a)
		weights++
	}
	if weights == 0 {
		return 0
	}
	return sum / weights
}

func leastRequested(requested, capacity int64) int64 {
	if requested > capacity {
		return 0
	}
	return (capacity - requested) * MaxNodeScore / capacity
}

// MostAllocatedScore is the MostAllocated strategy (bin packing), weights
// cpu=1, memory=1: the mean used share after placing req, 0..100.
func MostAllocatedScore(n *Node, req Resources) int64 {
	r := nonZeroRequested(n, req)
	var sum, weights int64
	if a := n.Allocatable.MilliCPU; a != 0 {
		sum += mostRequested(r.MilliCPU, a)
		weights++
	}
	if a := n.Allocatable.MemoryMB; a != 0 {
		sum += mostRequested(r.MemoryMB, a)
		weights++
	}
	if weights == 0 {
		return 0
	}
	return sum / weights
}

func mostRequested(requested, capacity int64) int64 {
	// requested can exceed capacity because of the non-zero defaults.
	return min(requested, capacity) * MaxNodeScore / capacity
}

// BalancedAllocationScore favours nodes whose CPU and memory fractions stay
// close after placing req: int((1 - |fcpu - fmem|/2) * 100). It uses actual
// requests (no non-zero defaults). kube computes it in float64 and truncates;
// so do we, so equal inputs give kube's score. A sandbox with no requests at
// all scores 0 everywhere, which is kube's Skip for best-effort pods (it keeps
// them from piling onto one node) and leaves the ranking to LeastAllocated.
func BalancedAllocationScore(n *Node, req Resources) int64 {
	if req.MilliCPU == 0 && req.MemoryMB == 0 {
		return 0
	}
	var f [2]float64
	k := 0
	if a := n.Allocatable.MilliCPU; a != 0 {
		f[k] = min(1, float64(n.Requested.MilliCPU+req.MilliCPU)/float64(a))
		k++
	}
	if a := n.Allocatable.MemoryMB; a != 0 {
		f[k] = min(1, float64(n.Requested.MemoryMB+req.MemoryMB)/float64(a))
		k++
	}
	std := 0.0
	if k == 2 {
		std = math.Abs((f[0] - f[1]) / 2)
	}
	return int64((1 - std) * float64(MaxNodeScore))
}

// KubernetesScore is the default profile's resource score: NodeResourcesFit
// (LeastAllocated) and NodeResourcesBalancedAllocation, both with plugin
// weight 1. The other default plugins (taints, affinity, topology spread,
// image locality) have no inputs in brisk and would add a constant.
func KubernetesScore(n *Node, req Resources) int64 {
	return LeastAllocatedScore(n, req) + BalancedAllocationScore(n, req)
}

package autoscale

import (
	"math"
	"time"
)

// want is the decider of Knative's autoscaler.Scale (docs/policies.md, KPA: decider)
// for a revision that is always reachable: rate limits, activation scale, panic mode
// and the scale-down delay, before bounds.
func (k *KPA) want(now time.Time, ready int, stableAvg, panicAvg float64) int {
	c := &k.cfg
	// With no ready sandboxes the rates work from 1, so scale-from-zero can move.
	readyF := math.Max(1, float64(ready))
	// Ceil lets a conservative up rate still add one sandbox (1.1 * 2 -> 3).
	maxUp := math.Ceil(c.MaxScaleUpRate * readyF)
	maxDown := math.Floor(readyF / c.MaxScaleDownRate)

	dspc := math.Ceil(stableAvg / c.TargetConcurrency)
	dppc := math.Ceil(panicAvg / c.TargetConcurrency)
	stableWant := clampCount(dspc, maxDown, maxUp)
	panicWant := clampCount(dppc, maxDown, maxUp)
	if a := c.ActivationScale; a > 1 {
		// Waking from zero goes straight to the activation scale.
		if dspc > 0 && stableWant < a {
			stableWant = a
		}
		if dppc > 0 && panicWant < a {
			panicWant = a
		}
	}

	// Knative compares the unclamped panic pod count, not panicAvg/target.
	k.updatePanic(now, !c.PanicDisabled && dppc/readyF >= c.PanicThreshold)
	want := stableWant
	if k.panicking {
		// Provision for the larger signal, and never shrink while panicking.
		want = max(want, panicWant)
		k.maxPanicPods = max(k.maxPanicPods, want)
		want = k.maxPanicPods
	}
	return k.delayed(now, want)
}

// clampCount keeps pods within [lo, hi] and inside int32, like Knative's int32 counts.
func clampCount(pods, lo, hi float64) int {
	return int(math.Min(math.Min(math.Max(pods, lo), hi), math.MaxInt32))
}

// updatePanic enters or extends panic mode while over the threshold, and leaves it once
// a whole stable window has passed since the last over-threshold decision, by which time
// the surge is in the stable average.
func (k *KPA) updatePanic(now time.Time, overThreshold bool) {
	switch {
	case overThreshold:
		k.panicking, k.panicTime = true, now
	case k.panicking && now.After(k.panicTime.Add(k.cfg.StableWindow)):
		k.exitPanic()
	}
}

func (k *KPA) exitPanic() {
	k.panicking, k.panicTime, k.maxPanicPods = false, time.Time{}, 0
}

// delayed applies ScaleDownDelay: the result is the largest want of the last delay, so
// scale-down waits out short dips while scale-up is immediate.
func (k *KPA) delayed(now time.Time, want int) int {
	if k.delay == nil {
		return want
	}
	k.delay.record(now.Unix(), want)
	return k.delay.current()
}

// bound clamps want to [MinScale, MaxScale]; with scale to zero disabled the floor is 1.
func (k *KPA) bound(want int) int {
	lo := k.cfg.MinScale
	if !k.cfg.EnableScaleToZero {
		lo = max(lo, 1)
	}
	want = max(want, lo)
	if k.cfg.MaxScale > 0 {
		want = min(want, k.cfg.MaxScale)
	}
	return want
}

// holdBeforeZero is brisk's version of Knative's handleScaleToZero: a warm function goes
// to 0 only after its want has been 0 continuously for ScaleToZeroGrace, and keeps one
// sandbox until then. A function already at 0 stays there.
func (k *KPA) holdBeforeZero(now time.Time, want int) int {
	if want > 0 {
		k.zeroing = false
		return want
	}
	if k.last == 0 {
		return 0
	}
	if !k.zeroing {
		k.zeroing, k.zeroSince = true, now
	}
	if now.Sub(k.zeroSince) >= k.cfg.ScaleToZeroGrace {
		return 0
	}
	return 1
}

// floorAdopted keeps a decision at or above the adopted scale (within MaxScale) until
// the adoption window ends.
func (k *KPA) floorAdopted(now time.Time, want int) int {
	if !now.Before(k.adoptedTill) || want >= k.adopted {
		return want
	}
	if k.cfg.MaxScale > 0 {
		return max(want, min(k.adopted, k.cfg.MaxScale))
	}
	return k.adopted
}

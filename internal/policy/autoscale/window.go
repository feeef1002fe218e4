package autoscale

import (
	"math"
	"time"
)

// avgWindow is Knative's TimedFloat64Buckets with the plain WindowAverage, fixed to
// 1-second buckets and keyed by Unix second. The ring is allocated on the first
// non-zero write (most functions of a large deployment are idle, and the reconciler
// records a zero for each every second: 528 bytes a function at the default 60 s
// window), then record and average never allocate.
//
// Invariant: for every second s in (last-n, last] the bucket at slot(s) holds the sum
// recorded for s; buckets of seconds not written since the ring last advanced are zero.
// A nil ring holds only zeros.
type avgWindow struct {
	buckets []float64 // nil until a non-zero write
	n       int64     // the ring's size in seconds
	// first is the oldest second of the current run of data: set on the first write
	// and reset after a whole window without writes, so a fresh burst is averaged over
	// a partial window (fast reaction after a cold start).
	first int64
	// last is the newest second written; it bounds the valid part of the ring.
	last    int64
	written bool
}

func newAvgWindow(d time.Duration) avgWindow {
	return avgWindow{n: int64(bucketsFor(d))}
}

// bucketsFor is the number of 1-second buckets covering d, at least one.
func bucketsFor(d time.Duration) int {
	return max(1, int((d+BucketSize-1)/BucketSize))
}

func (w *avgWindow) size() int64 { return w.n }

// slot maps a Unix second onto the ring; it stays non-negative for times before 1970.
func (w *avgWindow) slot(sec int64) int {
	i := sec % w.size()
	if i < 0 {
		i += w.size()
	}
	return int(i)
}

// record adds v to the bucket of second sec, following Knative's Record: writes more
// than a window older than the newest are dropped, a gap of a whole window resets the
// ring, and a shorter gap zeroes the skipped buckets.
func (w *avgWindow) record(sec int64, v float64) {
	n := w.size()
	switch {
	case !w.written || sec-w.last >= n:
		clear(w.buckets)
		w.first, w.last, w.written = sec, sec, true
	case sec > w.last:
		if w.buckets != nil {
			for s := w.last + 1; s <= sec; s++ {
				w.buckets[w.slot(s)] = 0
			}
		}
		w.last = sec
	case sec <= w.last-n:
		return // older than the window: its bucket has been reused
	case sec < w.first:
		w.first = sec
	}
	if v == 0 {
		return
	}
	if w.buckets == nil {
		w.buckets = make([]float64, n)
	}
	w.buckets[w.slot(sec)] += v
}

// reset forgets every write.
func (w *avgWindow) reset() {
	clear(w.buckets)
	w.first, w.last, w.written = 0, 0, false
}

// empty is Knative's IsEmpty: nothing was written within the last window.
func (w *avgWindow) empty(sec int64) bool {
	return !w.written || sec-w.last > w.size()
}

// average is Knative's plain WindowAverage before rounding: the sum of the buckets
// still inside the window divided by the number of buckets since the first write,
// capped at the window. Buckets between the newest write and now count as elapsed
// time that has pushed old buckets out, and a write more than a window ago yields 0.
func (w *avgWindow) average(sec int64) float64 {
	if !w.written || w.buckets == nil {
		return 0
	}
	n := w.size()
	gap := max(sec-w.last, 0) // a query before the newest write reads as of that write
	if gap >= n {
		return 0
	}
	valid := n - gap // seconds (last-valid, last] are still inside the window
	return w.sum(w.last-valid+1, int(valid)) / float64(min(w.last-w.first+1, valid))
}

// sum adds count buckets starting at second from, walking the ring as at most two
// contiguous runs rather than taking a modulus per bucket.
func (w *avgWindow) sum(from int64, count int) float64 {
	start := w.slot(from)
	head := min(count, len(w.buckets)-start)
	total := 0.0
	for _, v := range w.buckets[start : start+head] {
		total += v
	}
	for _, v := range w.buckets[:count-head] {
		total += v
	}
	return total
}

// resize moves the newest buckets into a ring for window d, keeping the data (Knative's
// ResizeWindow). Unlike Knative it keeps a partial-window first write rather than
// pretending the whole old window held data.
func (w *avgWindow) resize(d time.Duration) {
	n := int64(bucketsFor(d))
	if n == w.n {
		return
	}
	old := *w
	w.n, w.buckets = n, nil
	if !old.written {
		return
	}
	w.first = max(old.first, old.last-old.size()+1)
	if old.buckets == nil {
		return // only zeros to keep
	}
	w.buckets = make([]float64, n)
	kept := min(n, old.n)
	for s := old.last - kept + 1; s <= old.last; s++ {
		w.buckets[w.slot(s)] = old.buckets[old.slot(s)]
	}
}

// round6 rounds like Knative's WindowAverage (6 digits), which keeps float noise such as
// 0.7000000001 from adding a sandbox through ceil.
func round6(f float64) float64 {
	return math.Round(f*1e6) / 1e6
}

// maxEntry is one candidate maximum of a maxWindow.
type maxEntry struct {
	index int64
	value int
}

// maxWindow is Knative's max.TimeWindow (the "ascending minima" algorithm): the maximum
// of the values recorded in the last len(entries) seconds, in O(1) amortized and a
// fixed ring. It backs ScaleDownDelay.
//
// Invariant: entries first..first+length-1 have strictly ascending indexes and strictly
// descending values, all within one window of the newest index.
type maxWindow struct {
	entries       []maxEntry
	first, length int
	newest        int64
}

func newMaxWindow(d time.Duration) *maxWindow {
	return &maxWindow{entries: make([]maxEntry, bucketsFor(d))}
}

func (m *maxWindow) at(i int) *maxEntry { return &m.entries[(m.first+i)%len(m.entries)] }

// record adds value v at second index.
func (m *maxWindow) record(index int64, v int) {
	// A clock that steps back is treated as the newest second, which keeps indexes
	// ascending and so bounds length by the ring size.
	if m.length > 0 && index < m.newest {
		index = m.newest
	}
	m.newest = index
	// Entries not above v can never be the maximum again: v is larger and newer.
	for m.length > 0 && m.at(m.length-1).value <= v {
		m.length--
	}
	// Entries older than the window fall out of the front.
	for m.length > 0 && index-m.at(0).index >= int64(len(m.entries)) {
		m.first = (m.first + 1) % len(m.entries)
		m.length--
	}
	// Two values in one second: keep the larger one as that second's entry.
	if m.length > 0 && m.at(m.length-1).index == index {
		v = max(v, m.at(m.length-1).value)
		m.length--
	}
	*m.at(m.length) = maxEntry{index: index, value: v}
	m.length++
}

// current is the maximum over the window as of the last record.
func (m *maxWindow) current() int {
	if m.length == 0 {
		return 0
	}
	return m.at(0).value
}

// resized returns a window of duration d that holds the entries still inside it.
func (m *maxWindow) resized(d time.Duration) *maxWindow {
	r := newMaxWindow(d)
	for i := range m.length {
		e := m.at(i)
		r.record(e.index, e.value)
	}
	return r
}

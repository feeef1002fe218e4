package reconciler

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/keepalive"
	"github.com/brisk-faas/brisk/internal/policy/placement"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Keep-alive (docs/policies.md, Keep-alive). Under ttl, the autoscaler's
// decision is the whole story while there is room: a sandbox leaves once
// demand has been below it for the keep-alive (the KPA's windows, or its
// scale-down delay). Under gd (the default), sandboxes beyond the demand are
// idle but kept: they serve the next burst warm, and they leave after the
// keep-alive (15 min by default). Under either, when a new sandbox finds no
// node with room, idle sandboxes (no call in the data planes' last reports,
// above their function's min) give their room up at once, in the keep-alive
// policy's eviction order (FaasCache's Greedy-Dual-Size-Frequency for gd,
// least recently used for ttl), whatever their autoscaler's window says: a
// function that yields forgets the load behind its scale (KPA.Yield) and is
// brought back by its next call.

// KeepAlivePolicyOf is f's effective keep-alive policy.
func (c *Reconciler) KeepAlivePolicyOf(f *spec.Function) string {
	if f.Scaling.KeepAlivePolicy != "" {
		return f.Scaling.KeepAlivePolicy
	}
	return c.cfg.KeepAlivePolicy
}

// holdsIdle reports whether f keeps idle sandboxes beyond its demand:
// under gd, and under hybrid (sync mode has its own hold, the peak of its
// keep-alive, and ignores the policy).
func (c *Reconciler) holdsIdle(f *spec.Function) bool {
	p := c.KeepAlivePolicyOf(f)
	return (p == spec.KeepAliveGD || p == spec.KeepAliveHybrid) && c.ModeOf(f) != spec.ModeSync
}

// holdSurplus reports whether fs keeps sandboxes beyond its demand instead
// of removing them now (gd, within the keep-alive if one is set; hybrid,
// within its keep-alive window from its last call, unless it is to be
// unloaded and pre-warmed).
func (c *Reconciler) holdSurplus(now time.Time, fs *fnState) bool {
	if fs.deleted || !c.holdsIdle(fs.spec) {
		return false
	}
	if fs.surplusSince.IsZero() {
		fs.surplusSince = now
	}
	if c.KeepAlivePolicyOf(fs.spec) == spec.KeepAliveHybrid {
		w := c.hybrid.Windows(fs.spec.Name, gdKeepAlive(fs.spec))
		if w.Prewarm > 0 {
			return false // unloaded now, brought back before the next call (hybridPrewarms)
		}
		from := fs.lastUsed
		if from.IsZero() {
			from = fs.surplusSince
		}
		return now.Sub(from) < w.KeepAlive
	}
	return now.Sub(fs.surplusSince) < gdKeepAlive(fs.spec)
}

// hybridIdle is the least gap between calls that counts as an idle time
// for the hybrid policy: shorter gaps are between the data planes'
// reports of a function that is busy.
const hybridIdle = 5 * time.Second

// hybridPrewarms reports whether fs, under hybrid with a pre-warm window,
// is in its keep-alive window after it: a sandbox is brought back then.
func (c *Reconciler) hybridPrewarms(now time.Time, fs *fnState) bool {
	if fs.lastUsed.IsZero() || c.KeepAlivePolicyOf(fs.spec) != spec.KeepAliveHybrid || c.ModeOf(fs.spec) == spec.ModeSync {
		return false
	}
	w := c.hybrid.Windows(fs.spec.Name, gdKeepAlive(fs.spec))
	if w.Prewarm <= 0 {
		return false
	}
	start := fs.lastUsed.Add(w.Prewarm)
	return !now.Before(start) && now.Before(start.Add(w.KeepAlive))
}

// gdKeepAlive is how long gd keeps f's idle sandboxes with no memory
// pressure.
func gdKeepAlive(f *spec.Function) time.Duration {
	if ka := time.Duration(f.Scaling.KeepAlive); ka > 0 {
		return ka
	}
	return spec.DefaultGDKeepAlive
}

// touch tells the keep-alive policy about n calls of fs.
func (c *Reconciler) touch(now time.Time, fs *fnState, n int64) {
	if n > 0 {
		if c.KeepAlivePolicyOf(fs.spec) == spec.KeepAliveHybrid && !fs.lastUsed.IsZero() {
			if idle := now.Sub(fs.lastUsed); idle >= hybridIdle {
				c.hybrid.Observe(fs.spec.Name, idle)
			}
		}
		fs.lastUsed = now
		c.keep.Touch(now, fs.spec.Name, n)
	}
}

// evictFor makes room for count sandboxes of fs by evicting idle sandboxes
// of other functions, and reports whether any room is coming (evicted now,
// or already being freed by sandboxes on their way out and not claimed by
// an earlier sandbox of this call). Resources return when the evicted
// sandboxes are gone, so the caller retries then. With forMin (count
// sandboxes fs lacks to reach its scaling.min) the sandboxes other
// functions have beyond their own min may go although their calls use
// them: a function's min is a guarantee, another's scale-out is not, so a
// backlog that fills the nodes cannot keep a min sandbox out (they are
// drained as any tombstoned sandbox: out of the endpoints first, killed
// after the drain delay).
func (c *Reconciler) evictFor(now time.Time, fs *fnState, count int, forMin bool) bool {
	if count <= 0 {
		return false
	}
	idle := c.idleByNode(now, fs, forMin)
	need := placement.Resources{MilliCPU: fs.spec.Resources.MilliCPU, MemoryMB: fs.spec.Resources.MemoryMB}
	// rooms are each usable node's free room plus what is leaving it,
	// less what this call has claimed.
	type usable struct {
		room
		ok bool
	}
	rooms := make([]usable, len(c.nodeList))
	for i, n := range c.nodeList {
		if !n.up || n.rec.Drain {
			continue
		}
		rm := usable{room: freeRoom(&c.place[i]), ok: true}
		leaving(n, rm.add)
		rooms[i] = rm
	}
	fits := func(rm usable) bool { return rm.ok && rm.fits(need) }
	claim := func(rm *usable) { rm.cpu, rm.mem, rm.slots = rm.cpu-need.MilliCPU, rm.mem-need.MemoryMB, rm.slots-1 }
	progress := false
	for range count {
		if k := slices.IndexFunc(rooms, fits); k >= 0 {
			claim(&rooms[k]) // room already on its way
			progress = true
			continue
		}
		// The node that needs the least evicted, in memory (GD's size),
		// among those whose idle sandboxes would make room.
		best, bestShort := -1, int64(0)
		for i, n := range c.nodeList {
			rm := rooms[i]
			if !rm.ok || len(idle[n]) == 0 {
				continue
			}
			for _, r := range idle[n] {
				rm.add(r)
			}
			if !fits(rm) {
				continue
			}
			if short := max(need.MemoryMB-rooms[i].mem, 0); best < 0 || short < bestShort {
				best, bestShort = i, short
			}
		}
		if best < 0 {
			break
		}
		n := c.nodeList[best]
		for _, r := range c.evictOn(now, fs, n, idle[n], rooms[best].cpu, bestShort, rooms[best].slots) {
			rooms[best].add(r)
			idle[n] = slices.DeleteFunc(idle[n], func(x *sandboxRec) bool { return x == r })
		}
		if !fits(rooms[best]) {
			break // the policy returned less than asked (cannot happen: the node was chosen to fit)
		}
		claim(&rooms[best])
		progress = true
	}
	return progress
}

// roomMayCome says whether room for a sandbox of fs can appear on some
// usable node by itself: other functions' sandboxes beyond their min
// (busy, starting or idle), any sandbox of an older revision and those
// leaving or draining end or become idle and evictable. When none can (the
// room is held by min sandboxes, or fs asks more than a node has), a call
// waiting for room would wait its queue timeout for nothing, and data
// planes refuse it at once.
func (c *Reconciler) roomMayCome(fs *fnState) bool {
	need := placement.Resources{MilliCPU: fs.spec.Resources.MilliCPU, MemoryMB: fs.spec.Resources.MemoryMB}
	rooms := make([]room, len(c.nodeList))
	for i := range c.nodeList {
		rooms[i] = freeRoom(&c.place[i])
	}
	free := func(r *sandboxRec) {
		if r.node == nil || r.node.idx >= len(rooms) || c.nodeList[r.node.idx] != r.node {
			return // on no node of the list (cannot happen: removed nodes take their sandboxes)
		}
		rooms[r.node.idx].add(r)
	}
	// Leaving or draining: of every function, removed ones' too.
	for _, n := range c.nodeList {
		for _, r := range n.sandboxes {
			if r.state == sbTombstoned {
				free(r)
			}
		}
	}
	for _, g := range c.withSandboxes() {
		keep := g.spec.Scaling.Min // the sandboxes that stay
		if g == fs {
			keep = math.MaxInt
		}
		active := 0
		for _, r := range g.sandboxes {
			switch {
			case r.state == sbTombstoned: // counted above
			case r.rev != g.spec.Revision || keep == 0:
				free(r) // an older revision's, or no min: every one can go (no sort)
			default:
				active++
			}
		}
		if keep > 0 && keep < math.MaxInt && active > keep {
			for _, r := range c.victims(g, active-keep) {
				free(r)
			}
		}
	}
	for i, n := range c.nodeList {
		if n.up && !n.rec.Drain && rooms[i].fits(need) {
			return true
		}
	}
	return false
}

// room is a node's room for sandboxes: CPU and memory not requested, and
// sandboxes below its MaxSandboxes (evictFor, roomMayCome).
type room struct{ cpu, mem, slots int64 }

// freeRoom is p's room now: allocatable less requested, and slots under
// MaxSandboxes (as good as unbounded without one).
func freeRoom(p *placement.Node) room {
	rm := room{cpu: p.Allocatable.MilliCPU - p.Requested.MilliCPU, mem: p.Allocatable.MemoryMB - p.Requested.MemoryMB, slots: math.MaxInt32}
	if p.MaxSandboxes > 0 {
		rm.slots = int64(p.MaxSandboxes - p.Sandboxes)
	}
	return rm
}

// add gives r's room back to rm: r leaves, or may.
func (rm *room) add(r *sandboxRec) {
	rm.cpu, rm.mem, rm.slots = rm.cpu+r.milliCPU, rm.mem+r.memoryMB, rm.slots+1
}

// fits says whether a sandbox asking need fits in rm.
func (rm room) fits(need placement.Resources) bool {
	return rm.cpu >= need.MilliCPU && rm.mem >= need.MemoryMB && rm.slots >= 1
}

// idleByNode lists, per node, the idle sandboxes that may make room for
// fs: ready and reachable ones beyond what their function needs now (its
// calls in flight by the data planes' reports, and at least its min). Of
// other functions, the current revision's, as victims() orders them
// (newest first); of every function, fs included, those of older
// revisions still serving during a rollout (they leave once the current
// revision serves, which on a full node may need their room). A gd
// function's kept surplus is idle by this rule, and so is a sandbox its
// autoscaler still wants only because its window remembers past load.
//
// With beyondMin, every reachable ready sandbox of another function beyond
// its min is listed, busy or not (evictFor's forMin).
func (c *Reconciler) idleByNode(now time.Time, fs *fnState, beyondMin bool) map[*nodeState][]*sandboxRec {
	idle := map[*nodeState][]*sandboxRec{}
	for _, g := range c.withSandboxes() {
		busy := g.busy(now)
		active, reachable := 0, 0
		var old []*sandboxRec
		for _, r := range g.sandboxes {
			switch {
			case r.state == sbTombstoned:
			case r.rev != g.spec.Revision:
				if r.state == sbReady && !r.withdrawn {
					old = append(old, r)
				}
			default:
				active++
				if r.state == sbReady && !r.withdrawn {
					reachable++
				}
			}
		}
		// Calls in flight may be on old sandboxes or current ones: each
		// kind keeps enough for all of them.
		if k := len(old) - busy; k > 0 {
			slices.SortFunc(old, func(a, b *sandboxRec) int { return strings.Compare(a.id, b.id) })
			for _, r := range old[:k] {
				idle[r.node] = append(idle[r.node], r)
			}
		}
		if g == fs {
			continue
		}
		// Only reachable ready sandboxes serve calls, so they are what must
		// cover the function's need; sandboxes still starting, or on a node
		// whose link is down, cover nothing and are never evicted here.
		if beyondMin {
			busy = 0
		}
		surplus := min(active, reachable) - max(g.spec.Scaling.Min, busy)
		if surplus <= 0 {
			continue
		}
		k := 0
		for _, r := range c.victims(g, active) {
			if k == surplus {
				break
			}
			if r.state == sbReady && !r.withdrawn {
				idle[r.node] = append(idle[r.node], r)
				k++
			}
		}
	}
	return idle
}

// withSandboxes lists the functions that have sandboxes, in c.order's
// order (evictions stay deterministic), found from the nodes' sandboxes:
// most of a large deployment's functions have none, and walking them all
// took ~0.6 ms at 40,000 on every capacity failure (evictFor's search and
// roomMayCome, which a waiting call asks every 500 ms). Removed functions
// are left out.
func (c *Reconciler) withSandboxes() []*fnState {
	seen := map[*fnState]struct{}{}
	var fns []*fnState
	for _, n := range c.nodeList {
		for _, r := range n.sandboxes {
			if _, ok := seen[r.fn]; ok || r.fn.deleted {
				continue
			}
			seen[r.fn] = struct{}{}
			fns = append(fns, r.fn)
		}
	}
	slices.SortFunc(fns, func(a, b *fnState) int { return a.pos - b.pos })
	return fns
}

// busy is how many sandboxes fs's calls occupy now: its calls in flight
// and queued by the data planes' fresh reports, over its concurrency,
// rounded up. A data plane's urgent report (a call waiting for room) brings
// its counts of that moment; others are at most a periodic report old. A
// queued call counts because the sandbox made for it takes it as soon as
// it is ready, before any report says so.
func (fs *fnState) busy(now time.Time) int {
	var n int32
	for _, s := range fs.dpLoad {
		if now.Sub(s.inFlightAt) <= loadStaleAfter {
			n += s.inFlight + s.queued
		}
	}
	if n <= 0 {
		return 0
	}
	if fs.spec.Concurrency <= 0 { // unbounded: one sandbox takes it all
		return 1
	}
	return (int(n) + fs.spec.Concurrency - 1) / fs.spec.Concurrency
}

// evictOn asks the keep-alive policy which of cands (idle sandboxes on n)
// go to free memMB, then more while CPU or a slot is still short, and
// tombstones them. A function left with fewer sandboxes than its autoscaler
// wanted yields: its desired scale drops to what it has left.
func (c *Reconciler) evictOn(now time.Time, fs *fnState, n *nodeState, cands []*sandboxRec, freeCPU, memMB, slots int64) []*sandboxRec {
	cands = slices.Clone(cands)
	slices.SortFunc(cands, func(a, b *sandboxRec) int { return strings.Compare(a.id, b.id) })
	kc := make([]keepalive.Candidate, len(cands))
	for i, r := range cands {
		kc[i] = keepalive.Candidate{Key: r.fn.spec.Name, MemoryMB: r.memoryMB, LastUsed: r.fn.lastUsed, ColdStart: r.fn.coldStart}
	}
	need := fs.spec.Resources.MilliCPU
	var out []*sandboxRec
	taken := make([]bool, len(cands))
	take := func(i int) {
		taken[i] = true
		out = append(out, cands[i])
		freeCPU += cands[i].milliCPU
		slots++
	}
	if memMB > 0 {
		for _, i := range c.keep.Evict(now, kc, memMB) {
			take(i)
		}
	}
	for (freeCPU < need || slots < 1) && len(out) < len(cands) {
		rest, idx := make([]keepalive.Candidate, 0, len(cands)), make([]int, 0, len(cands))
		for i := range cands {
			if !taken[i] {
				rest, idx = append(rest, kc[i]), append(idx, i)
			}
		}
		for _, j := range c.keep.Evict(now, rest, 1) {
			take(idx[j])
		}
	}
	var yielded []*fnState
	for _, r := range out {
		c.log.Debug("evict idle sandbox", "function", r.fn.spec.Name, "sandbox", r.id, "node", n.id, "for", fs.spec.Name)
		c.tombstone(now, r)
		c.stats.Evictions++
		if r.fn != fs && r.rev == r.fn.spec.Revision && !slices.Contains(yielded, r.fn) {
			yielded = append(yielded, r.fn)
		}
	}
	for _, g := range yielded {
		if active := g.activeCurrent(); active < g.desired {
			c.log.Debug("function yields idle sandboxes", "function", g.spec.Name, "desired", active, "was", g.desired, "for", fs.spec.Name)
			g.desired = active
			c.boundDesired(g)
			g.kpa.Yield(now, g.desired)
			g.forgetLoad(now)
			g.surplusSince = time.Time{}
		}
	}
	return out
}

// leaving counts n's sandboxes on their way out (tombstoned, not yet gone),
// calling visit with each when it is not nil. One a data plane holds with
// calls still in it is not counted: its room comes when they end, which
// may be the function's whole timeout away (drainDue).
func leaving(n *nodeState, visit func(*sandboxRec)) int {
	k := 0
	for _, r := range n.sandboxes {
		if r.state == sbTombstoned && len(r.drainHeld) == 0 {
			k++
			if visit != nil {
				visit(r)
			}
		}
	}
	return k
}

// observeColdStart keeps fs's creation-to-ready time (what a miss costs,
// GD's cost term) as a moving average.
func (fs *fnState) observeColdStart(d time.Duration) {
	if fs.coldStart == 0 {
		fs.coldStart = d
		return
	}
	fs.coldStart += (d - fs.coldStart) / 8
}

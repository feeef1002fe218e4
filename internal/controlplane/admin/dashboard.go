package admin

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/ui"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The dashboard (GET /v1/dashboard, and the page at /ui/ that shows it)
// joins what the reconciler's table holds now — nodes, functions,
// sandboxes by state — with what nothing else keeps: call rates and
// latencies from the data planes' metric reports, sandbox creations (cold
// starts) and the recent failures. DashStats keeps those in a sliding
// window of a few fixed time slots, under its own mutex, so that neither a
// report nor a dashboard read holds the cluster lock for them: a report
// adds to one slot per function it names (a few dozen additions), and
// nothing here grows with time.

const (
	// dashSlot is the window's resolution and dashSlots its length: rates
	// and latencies are over the last 25-30 s, enough to smooth the data
	// planes' one-second reports, short enough to follow a change.
	dashSlot  = 5 * time.Second
	dashSlots = 6
	// maxDashFailures bounds the recent-failures list.
	maxDashFailures = 50
	// defaultDashFunctions bounds the functions one reply lists unless
	// ?limit= says otherwise: a page of 10,000 rows every two seconds
	// helps nobody.
	defaultDashFunctions = 500
	// dashChunk bounds how many function windows a dashboard read sums per
	// hold of DashStats' mutex, which placements (under the cluster lock)
	// wait for: as tick's chunks, so that a read over 10,000 busy
	// functions does not stall cold starts.
	dashChunk = 256
)

// nLatency is the number of latency buckets: the bounds, then one for
// longer calls.
const nLatency = len(briskv1.LatencyBounds) + 1

// dashCounts are what happened in one slot.
type dashCounts struct {
	slot      int64 // which slot (unix time / dashSlot) the counts are of
	calls     uint64
	creations uint64
	failures  uint64
	latency   [nLatency]uint64
}

func (c *dashCounts) add(o *dashCounts) {
	c.calls += o.calls
	c.creations += o.creations
	c.failures += o.failures
	for i, n := range o.latency {
		c.latency[i] += n
	}
}

// addCalls counts calls and a report's latency buckets (extra buckets from
// a data plane with more bounds than these go to the last one).
func (c *dashCounts) addCalls(calls uint64, latency []uint64) {
	if c == nil {
		return
	}
	c.calls += calls
	for i, n := range latency {
		c.latency[min(i, nLatency-1)] += n
	}
}

// dashWindow is a ring of slots: slot s lives at s % dashSlots until slot
// s + dashSlots takes its place.
type dashWindow struct {
	slots  [dashSlots]dashCounts
	newest int64 // the newest slot written
}

// at returns the counts of slot s, emptied first if they held an older
// slot's; nil if the ring has moved past s (a clock that went back).
func (w *dashWindow) at(s int64) *dashCounts {
	if s < 0 { // before 1970: no clock of ours
		return nil
	}
	c := &w.slots[s%dashSlots]
	switch {
	case c.slot > s:
		return nil
	case c.slot < s:
		*c = dashCounts{slot: s}
	}
	w.newest = max(w.newest, s)
	return c
}

// sum adds up the window that ends with slot cur.
func (w *dashWindow) sum(cur int64) dashCounts {
	var out dashCounts
	for i := range w.slots {
		if c := &w.slots[i]; c.slot > cur-dashSlots && c.slot <= cur {
			out.add(c)
		}
	}
	return out
}

func slotOf(t time.Time) int64 { return t.UnixNano() / int64(dashSlot) }

// DashStats is what the dashboard shows beyond the reconciler's table: the
// cluster feeds it (Report, Created, Failed, Condition, Register, Forget).
// A nil *DashStats ignores everything (clusters built bare, in tests).
type DashStats struct {
	mu    sync.Mutex
	start time.Time // rates are over less than a window until one has passed
	total dashWindow
	// fns holds a window per function with activity in the last one:
	// idle functions cost nothing (sweep).
	fns   map[string]*dashWindow
	swept int64 // the slot of the last sweep
	// known holds the registered functions and their calls counted since
	// start (or their registration): a report's names that are not get no
	// window (a data plane cannot grow the control plane's memory with
	// names it makes up).
	known map[string]uint64
	// Since start, every function.
	calls, creations uint64
	// conds is each function's condition reason last seen, to record the
	// changes into one (a condition's message changes with every failure).
	conds map[string]string
	// ring holds the last maxDashFailures failures; next is where the next
	// goes, n how many it holds.
	ring    [maxDashFailures]api.DashboardFailure
	next, n int
}

// NewDashStats starts the window at now.
func NewDashStats(now time.Time) *DashStats {
	return &DashStats{start: now, fns: make(map[string]*dashWindow), conds: make(map[string]string), known: make(map[string]uint64)}
}

// windowLocked returns fn's window, made on first use.
func (d *DashStats) windowLocked(fn string) *dashWindow {
	w := d.fns[fn]
	if w == nil {
		w = &dashWindow{}
		d.fns[fn] = w
	}
	return w
}

// sweepLocked forgets the windows of functions idle for a whole window,
// once per slot: O(active functions) every dashSlot.
func (d *DashStats) sweepLocked(slot int64) {
	if slot <= d.swept {
		return
	}
	d.swept = slot
	for name, w := range d.fns {
		if w.newest <= slot-dashSlots {
			delete(d.fns, name)
		}
	}
}

// Report adds a data plane's metric report: its calls and latencies.
func (d *DashStats) Report(now time.Time, r *briskv1.MetricsReport) {
	if d == nil || r.GetUrgent() { // an urgent report's arrivals are in the next periodic one
		return
	}
	slot := slotOf(now)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepLocked(slot)
	total := d.total.at(slot)
	for _, m := range r.GetFunctions() {
		calls := uint64(max(m.GetRequests(), 0))
		latency := m.GetLatencyBuckets()
		if calls == 0 && len(latency) == 0 {
			continue // idle: no window for it
		}
		n, ok := d.known[m.GetFunction()]
		if !ok {
			continue
		}
		d.known[m.GetFunction()] = n + calls
		d.calls += calls
		total.addCalls(calls, latency)
		d.windowLocked(m.GetFunction()).at(slot).addCalls(calls, latency)
	}
}

// Created counts a sandbox placed for fn: a cold start.
func (d *DashStats) Created(now time.Time, fn string) {
	if d == nil {
		return
	}
	slot := slotOf(now)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.creations++
	if c := d.total.at(slot); c != nil {
		c.creations++
	}
	if c := d.windowLocked(fn).at(slot); c != nil {
		c.creations++
	}
}

// Failed counts a sandbox that failed to start or exited on its own and
// keeps it in the recent failures.
func (d *DashStats) Failed(now time.Time, x reconciler.SandboxFailed) {
	if d == nil {
		return
	}
	slot := slotOf(now)
	reason := x.Reason
	if reason == "" {
		reason = "sandbox ended: " + x.State
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.total.at(slot); c != nil {
		c.failures++
	}
	if c := d.windowLocked(x.Function).at(slot); c != nil {
		c.failures++
	}
	d.pushLocked(api.DashboardFailure{Time: now.UTC(), Kind: "sandbox-failed", Function: x.Function, Node: x.Node, Sandbox: x.ID, Reason: reason})
}

// Condition notes fn's condition; entering one ("" is none) is a failure
// to show.
func (d *DashStats) Condition(now time.Time, fn, reason, message string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conds[fn] == reason {
		return
	}
	if reason == "" {
		delete(d.conds, fn)
		return
	}
	d.conds[fn] = reason
	d.pushLocked(api.DashboardFailure{Time: now.UTC(), Kind: reason, Function: fn, Reason: message})
}

// Forget drops a deleted function's window and condition; its failures
// stay in the list, which is history.
func (d *DashStats) Forget(fn string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.fns, fn)
	delete(d.conds, fn)
	delete(d.known, fn)
}

// Register notes a registered function: its calls are counted.
func (d *DashStats) Register(fn string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	if _, ok := d.known[fn]; !ok {
		d.known[fn] = 0
	}
	d.mu.Unlock()
}

// callsOf sets each view's Calls: the calls its data planes reported
// since this control plane started (or the function was registered).
func (d *DashStats) callsOf(views []FunctionView) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range views {
		views[i].Status.Calls = d.known[views[i].Name]
	}
}

func (d *DashStats) pushLocked(f api.DashboardFailure) {
	d.ring[d.next] = f
	d.next = (d.next + 1) % maxDashFailures
	d.n = min(d.n+1, maxDashFailures)
}

// dashFigures are one function's (or the cluster's) numbers over the
// window.
type dashFigures struct {
	calls, creations, failures  uint64
	callsPerSec, creationPerSec float64
	latency                     api.LatencySummary
}

func figures(c *dashCounts, span float64) dashFigures {
	return dashFigures{calls: c.calls, creations: c.creations, failures: c.failures,
		callsPerSec: float64(c.calls) / span, creationPerSec: float64(c.creations) / span, latency: latencyOf(&c.latency)}
}

// dashSnapshot is DashStats' part of a dashboard reply.
type dashSnapshot struct {
	span                       time.Duration // what the rates are over
	total                      dashFigures
	fns                        map[string]dashFigures // functions with activity in the window
	failures                   []api.DashboardFailure // newest first
	callsTotal, creationsTotal uint64
}

// snapshot computes the figures of the window that ends at now.
func (d *DashStats) snapshot(now time.Time) dashSnapshot {
	if d == nil {
		return dashSnapshot{span: time.Second, fns: map[string]dashFigures{}, failures: []api.DashboardFailure{}}
	}
	cur := slotOf(now)
	d.mu.Lock()
	// The window: the current slot, part gone, and the whole ones before;
	// since the start when that is later. At least a second, so that a
	// first report does not read as a burst.
	from := time.Unix(0, (cur-dashSlots+1)*int64(dashSlot))
	if d.start.After(from) {
		from = d.start
	}
	span := max(now.Sub(from), time.Second)
	secs := span.Seconds()
	total := d.total.sum(cur)
	out := dashSnapshot{span: span, total: figures(&total, secs), fns: make(map[string]dashFigures, len(d.fns)),
		callsTotal: d.calls, creationsTotal: d.creations, failures: make([]api.DashboardFailure, 0, d.n)}
	for i := range d.n {
		out.failures = append(out.failures, d.ring[(d.next-1-i+2*maxDashFailures)%maxDashFailures])
	}
	names := make([]string, 0, len(d.fns))
	for name := range d.fns {
		names = append(names, name)
	}
	d.mu.Unlock()
	for i := 0; i < len(names); i += dashChunk {
		d.mu.Lock()
		for _, name := range names[i:min(i+dashChunk, len(names))] {
			if w := d.fns[name]; w != nil {
				if c := w.sum(cur); c != (dashCounts{}) {
					out.fns[name] = figures(&c, secs)
				}
			}
		}
		d.mu.Unlock()
	}
	return out
}

// latencyOf summarises latency buckets.
func latencyOf(b *[nLatency]uint64) api.LatencySummary {
	var n uint64
	for _, c := range b {
		n += c
	}
	return api.LatencySummary{Count: n, P50: quantile(0.5, b, n), P90: quantile(0.9, b, n), P99: quantile(0.99, b, n)}
}

// quantile estimates the q-quantile of the n calls counted in b as
// Prometheus' histogram_quantile does: linearly within the bucket it falls
// in (from 0 for the first); in the last, unbounded one, the highest bound.
func quantile(q float64, b *[nLatency]uint64, n uint64) float64 {
	bounds := briskv1.LatencyBounds
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var cum uint64
	for i, c := range b {
		if c == 0 || float64(cum+c) < rank {
			cum += c
			continue
		}
		if i == len(bounds) {
			break
		}
		lo := 0.0
		if i > 0 {
			lo = bounds[i-1]
		}
		return lo + (bounds[i]-lo)*(rank-float64(cum))/float64(c)
	}
	return bounds[len(bounds)-1]
}

// ---------------------------------------------------------------- HTTP

// registerDashboard adds the dashboard's routes: its data, which needs a
// token as GET /v1/status does, and the page's static files, which carry
// no data and need none (authenticate lets /ui through).
func (srv *API) registerDashboard(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/dashboard", srv.dashboard)
	mux.Handle("GET /ui/", http.StripPrefix("/ui", ui.Handler()))
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		// The browser keeps the #token=... fragment across the redirect.
		http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
	})
}

// uiPath reports whether an admin request is for the dashboard's static
// files, which need no token (they carry no data; the data they fetch
// does). It judges the path as the router sees it, escaped: a path that
// only cleans to /ui (/v1/x/..%2F..%2Fui) is not one.
func uiPath(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	p := r.URL.EscapedPath()
	if p != "/ui" && !strings.HasPrefix(p, "/ui/") {
		return false
	}
	return !strings.Contains(p, "..") && !strings.Contains(p, "%") && !strings.Contains(p, "//")
}

// DashRow is one function as the table has it (Cluster.TableState); the
// dashboard counts its sandboxes.
type DashRow struct {
	Spec   *spec.Function
	Status api.FunctionStatus
	sbx    api.SandboxCounts
}

// DashSandbox is one sandbox of the table, copied out under the lock.
type DashSandbox struct{ Function, Node, State string }

func countState(c *api.SandboxCounts, state string) {
	switch state {
	case "assumed":
		c.Assumed++
	case "pending":
		c.Pending++
	case "ready":
		c.Ready++
	default:
		c.Tombstoned++
	}
}

func (srv *API) dashboard(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeDeploy, "", "") {
		return
	}
	limit := defaultDashFunctions
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100_000 {
			WriteError(w, http.StatusBadRequest, "limit "+quote(v)+": want 1-100000")
			return
		}
		limit = n
	}
	c := srv.cluster
	now := c.Now()
	v := srv.dashboardView(now, limit)
	w.Header().Set("Cache-Control", "no-store")
	writeCompactJSON(w, http.StatusOK, v)
}

// dashboardView builds the reply: the table's state copied out under the
// cluster lock (no map built there: placements wait for it), then the
// window's figures under DashStats' own.
func (srv *API) dashboardView(now time.Time, limit int) *api.Dashboard {
	c := srv.cluster
	v := &api.Dashboard{Time: now.UTC(), ControlPlane: srv.cfg.ID, Nodes: []api.DashboardNode{}, Functions: []api.DashboardFunction{}}
	nodes, fns, sbxs, dataPlanes := c.TableState(now)
	v.Summary.DataPlanes = dataPlanes

	rows := make([]*DashRow, len(fns))
	byFn := make(map[string]*DashRow, len(fns))
	for i := range fns {
		rows[i] = &fns[i]
		byFn[fns[i].Spec.Name] = &fns[i]
	}
	byNode := map[string]*api.SandboxCounts{}
	for _, sb := range sbxs {
		countState(&v.Sandboxes, sb.State)
		if row := byFn[sb.Function]; row != nil {
			countState(&row.sbx, sb.State)
		}
		n := byNode[sb.Node]
		if n == nil {
			n = &api.SandboxCounts{}
			byNode[sb.Node] = n
		}
		countState(n, sb.State)
	}

	snap := c.Dash().snapshot(now)
	v.WindowSeconds = snap.span.Seconds()
	v.Failures = snap.failures
	v.Triggers, v.Summary.Triggers = srv.dashboardTriggers(limit)
	s := &v.Summary
	s.Nodes, s.Functions = len(nodes), len(rows)
	s.Calls, s.ColdStarts, s.SandboxFailures = snap.total.calls, snap.total.creations, snap.total.failures
	s.CallsPerSecond, s.ColdStartsPerSecond = snap.total.callsPerSec, snap.total.creationPerSec
	s.CallsTotal, s.ColdStartsTotal, s.Latency = snap.callsTotal, snap.creationsTotal, snap.total.latency

	for _, n := range nodes {
		dn := api.DashboardNode{Name: n.ID, Address: n.Address, Runtime: n.Runtime, State: "ready", Capacity: n.Capacity,
			Requested: n.Requested, Used: n.Used, Templates: n.Templates, HeartbeatMs: n.HeartbeatMs}
		switch {
		case !n.Connected:
			dn.State = "disconnected"
		case n.Drain:
			dn.State = "draining"
		}
		if n.Connected {
			s.NodesConnected++
		}
		if sc := byNode[n.ID]; sc != nil {
			dn.Sandboxes = *sc
		}
		v.Nodes = append(v.Nodes, dn)
	}
	slices.SortFunc(v.Nodes, func(a, b api.DashboardNode) int { return strings.Compare(a.Name, b.Name) })

	for _, row := range rows {
		if row.Status.Condition != "" {
			s.FunctionsFailing++
		}
	}
	// The functions worth a look when not all fit: those with a
	// condition, then the busiest; shown by name.
	if len(rows) > limit {
		slices.SortFunc(rows, func(a, b *DashRow) int {
			if ca, cb := a.Status.Condition != "", b.Status.Condition != ""; ca != cb {
				if ca {
					return -1
				}
				return 1
			}
			if ra, rb := snap.fns[a.Spec.Name].calls, snap.fns[b.Spec.Name].calls; ra != rb {
				if ra > rb {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Spec.Name, b.Spec.Name)
		})
		rows = rows[:limit]
	}
	slices.SortFunc(rows, func(a, b *DashRow) int { return strings.Compare(a.Spec.Name, b.Spec.Name) })
	for _, row := range rows {
		fig := snap.fns[row.Spec.Name]
		v.Functions = append(v.Functions, api.DashboardFunction{Name: row.Spec.Name, Namespace: reconciler.NamespaceOf(row.Spec), Revision: row.Spec.RevisionNumber(),
			Desired: row.Status.Desired, Ready: row.Status.Ready, Pending: row.Status.Pending, Terminating: row.Status.Terminating,
			Condition: row.Status.Condition, Message: row.Status.Message, Failures: row.Status.Failures, Sandboxes: row.sbx,
			CallsPerSecond: fig.callsPerSec, ColdStartsPerSecond: fig.creationPerSec, Calls: fig.calls,
			SandboxFailures: fig.failures, Latency: fig.latency})
	}
	return v
}

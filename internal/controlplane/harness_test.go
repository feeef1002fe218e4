package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/clock"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/dataplane"
	"github.com/brisk-faas/brisk/internal/rpc"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker"
	"github.com/brisk-faas/brisk/internal/worker/runtime/emulated"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// wait bounds every Eventually of the failure suite. It only bounds a
// failing test: a passing one goes on as soon as its condition holds.
const wait = 20 * time.Second

// env is one in-process cluster for the failure suite: a control plane, a
// worker daemon per node on the emulated runtime, a faultNet between them,
// a follower of the endpoint stream (a real gRPC WatchEndpoints client) and,
// optionally, a real data plane. The control plane runs on a fake clock: the
// autoscaler ticks and the node grace period advance only when the test says
// so, so every scaling decision is the test's.
type env struct {
	t       *testing.T
	dir     string
	clk     *clock.Fake
	net     *faultNet
	host    *emulated.Host
	opts    envOpts
	cp      *ControlPlane
	cpAddr  string
	stopCP  func()
	workers map[string]*testWorker
	nodeIDs []string
	watch   *routeWatch
	dp      *dataplane.DataPlane
	dpProxy *tcpProxy

	stopMu sync.Mutex
	stops  []func()
	cpStop int // index of the control plane's stop in stops
}

type envOpts struct {
	nodes        int
	nodeGrace    time.Duration // default 1h: no fencing unless the test wants it
	maxSandboxes int
	dataPlane    bool          // run a real data plane (through a cuttable TCP proxy)
	hbTimeout    time.Duration // Config.HeartbeatTimeout; 0: the default
	term         uint64        // Config.Term (leadership term)
	drainDelay   time.Duration // Config.DrainDelay, on the env's clock; 0: none
	config       func(*Config) // changes the control plane's config, when set
}

type testWorker struct {
	id    string
	inner *emulated.Runtime
	rt    *faultRuntime
	d     *worker.Daemon
	stop  func()
	dead  []*faultRuntime // runtimes of crashed daemons
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	if o.nodes == 0 {
		o.nodes = 1
	}
	if o.nodeGrace == 0 {
		o.nodeGrace = time.Hour
	}
	e := &env{t: t, dir: t.TempDir(), clk: clock.NewFake(time.Now()), net: newFaultNet(), opts: o, workers: make(map[string]*testWorker), cpStop: -1}
	t.Cleanup(e.shutdown)
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLink(40)
		}
	})
	host, err := emulated.NewHost("127.0.0.1:0", quiet)
	if err != nil {
		t.Fatal(err)
	}
	e.host = host
	hctx, hcancel := context.WithCancel(context.Background())
	hdone := make(chan struct{})
	go func() { host.Run(hctx); close(hdone) }()
	e.onStop(func() { hcancel(); <-hdone })

	e.startCP("127.0.0.1:0")
	e.watch = followEndpoints(t, e.cpAddr)
	e.onStop(func() { e.watch.stop() })
	for i := 0; i < o.nodes; i++ {
		id := fmt.Sprintf("w%d", i)
		e.nodeIDs = append(e.nodeIDs, id)
		tw := &testWorker{id: id, inner: host.Runtime(id, time.Millisecond)}
		tw.rt = newFaultRuntime(tw.inner)
		e.workers[id] = tw
		e.startWorker(tw)
	}
	testutil.Eventually(t, wait, func() bool { return connected(e.cp, o.nodes) }, "workers connect")
	if o.dataPlane {
		e.startDataPlane()
	}
	return e
}

// onStop registers f to run at shutdown, before what was registered earlier.
func (e *env) onStop(f func()) {
	e.stopMu.Lock()
	e.stops = append(e.stops, f)
	e.stopMu.Unlock()
}

func (e *env) shutdown() {
	// Unblock everything a test left waiting, then stop in reverse order.
	e.net.close()
	for _, w := range e.workers {
		w.rt.thaw()
		for _, r := range w.dead {
			r.thaw()
		}
	}
	e.stopMu.Lock()
	stops := e.stops
	e.stops = nil
	e.stopMu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

func (e *env) cpConfig(addr string) Config {
	cfg := Config{DataDir: e.dir, AdminAddr: "127.0.0.1:0", GRPCAddr: addr, Logger: quiet, Clock: e.clk,
		// No drain delay: it runs on the cluster's clock, which these
		// tests advance only where they mean to.
		TickInterval: 100 * time.Millisecond, DrainDelay: cmp.Or(e.opts.drainDelay, -1), NodeGrace: e.opts.nodeGrace,
		StartupGrace: 5 * time.Second, WorkerLinkInterceptor: e.net.clientInterceptor, HeartbeatTimeout: e.opts.hbTimeout,
		Term: e.opts.term,
		// The chain's cases scale down and expect victims at once:
		// Knative's keep-alive, not gd's idle sandboxes.
		KeepAlivePolicy: spec.KeepAliveTTL}
	if e.opts.config != nil {
		e.opts.config(&cfg)
	}
	return cfg
}

// startCP runs a control plane on addr over the env's data directory.
func (e *env) startCP(addr string) {
	cp, err := New(e.cpConfig(addr))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cp.Run(ctx); close(done) }()
	<-cp.Ready()
	e.cp, e.cpAddr = cp, cp.GRPCAddr()
	var once sync.Once
	e.stopCP = func() { once.Do(func() { cancel(); <-done }) }
	// A restarted control plane keeps the first one's place in the stop
	// order: after its clients, whose open streams a graceful stop awaits.
	e.stopMu.Lock()
	if e.cpStop < 0 {
		e.cpStop = len(e.stops)
		e.stops = append(e.stops, nil)
	}
	e.stops[e.cpStop] = e.stopCP
	e.stopMu.Unlock()
}

// restartCP crashes the control plane (its in-memory state is lost: sandbox
// table, Tombstones, invalid marks) and starts a new one on the same
// addresses and registry, as a restarted single replica would be.
//
// The clients' streams are closed first (the endpoint follower stops, the
// data plane's proxy goes down): a graceful gRPC stop would otherwise wait
// seconds for them, which a crash does not.
func (e *env) restartCP() {
	e.watch.stop()
	if e.dpProxy != nil {
		e.dpProxy.setDown(true)
	}
	e.stopCP()
	e.startCP(e.cpAddr)
	e.watch.start(e.t, e.cpAddr)
	if e.dpProxy != nil {
		e.dpProxy.setDown(false)
	}
}

func (e *env) startWorker(tw *testWorker) {
	cfg := worker.Config{ControlPlane: e.cpAddr, Logger: quiet, SessionInterceptor: e.net.serverInterceptor,
		Nodes: []worker.NodeConfig{{ID: tw.id, Runtime: tw.rt, Capacity: spec.Resources{MilliCPU: 2000, MemoryMB: 2048},
			MaxSandboxes: e.opts.maxSandboxes}}}
	d, err := worker.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	<-d.Ready()
	tw.d = d
	var once sync.Once
	tw.stop = func() { once.Do(func() { cancel(); <-done }) }
	e.onStop(tw.stop)
}

// crashWorker stops node's daemon abruptly: its sandboxes keep running in
// the runtime (StopSandboxesOnExit is off), and with freeze whatever the
// dead daemon was still doing (a kill, a start) never takes effect. The node
// stays partitioned until restartWorker.
func (e *env) crashWorker(id string, freeze bool) {
	tw := e.workers[id]
	if freeze {
		tw.rt.freeze()
	}
	e.net.partition(id)
	tw.stop()
	tw.dead = append(tw.dead, tw.rt)
}

// restartWorker starts a new daemon (a new boot id) for node over the same
// emulated runtime; it finds the sandboxes that still run there.
func (e *env) restartWorker(id string) {
	tw := e.workers[id]
	tw.rt = newFaultRuntime(tw.inner)
	e.startWorker(tw)
	e.net.heal(id)
	e.kick(id)
}

// kick makes the control plane redial node now instead of after its
// backoff, as a worker's re-registration does.
func (e *env) kick(id string) {
	if k, ok := e.cp.kicks.Load(id); ok {
		select {
		case k.(chan struct{}) <- struct{}{}:
		default:
		}
	}
}

// heal ends a partition and lets the control plane redial at once.
func (e *env) heal(id string) {
	e.net.heal(id)
	e.kick(id)
}

// ---------------------------------------------------------------- functions

// deploy registers a function durably with exactly n sandboxes (min = max =
// n) and round-robin balancing, so that the data plane's route set can be
// read by calling it.
func (e *env) deploy(name string, n int) {
	e.t.Helper()
	f := &spec.Function{Name: name, Builtin: "trace", Scaling: spec.Scaling{Min: n, Max: n}, LoadBalancing: "round-robin",
		Resources: spec.Resources{MilliCPU: 100, MemoryMB: 64}}
	f.ApplyDefaults()
	f.Revision = e.cp.admin.NextRevision()
	if _, err := e.cp.store.CreateFunction(f); err != nil {
		e.t.Fatal(err)
	}
	e.cp.cluster.UpsertFunction(f)
}

// scale sets a function's desired count to exactly n (min = max = n), a
// scaling change of the same revision, durably.
func (e *env) scale(name string, n int) {
	e.t.Helper()
	f := *e.cp.cluster.Spec(name)
	f.Scaling.Min, f.Scaling.Max = n, n
	if err := e.cp.store.UpdateFunction(&f); err != nil {
		e.t.Fatal(err)
	}
	e.cp.cluster.UpsertFunction(&f)
	if n == 0 { // max 0 means unbounded: zero is the autoscaler's decision
		e.cp.cluster.step(reconciler.ScaleTo{Function: name, Desired: 0})
	}
}

// ---------------------------------------------------------------- views

// cpView is the control plane's table for one function: id -> state.
func (e *env) cpView(fn string) map[string]string {
	st, _ := e.cp.cluster.functionStatus(fn)
	out := make(map[string]string, len(st.Sandboxes))
	for _, s := range st.Sandboxes {
		out[s.ID] = s.State
	}
	return out
}

func (e *env) cpIDs(fn, state string) []string {
	var ids []string
	for id, s := range e.cpView(fn) {
		if s == state {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// invalid reports whether the control plane holds id as invalid on node.
func (e *env) invalid(node, id string) bool {
	c := e.cp.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.Invalid(node, id)
}

// running lists the sandboxes the node's runtime runs (the truth).
func (e *env) running(node string) []string {
	l, err := e.workers[node].inner.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	ids := make([]string, 0, len(l))
	for _, s := range l {
		ids = append(ids, s.ID)
	}
	return ids
}

// runningAll lists the sandboxes every runtime runs.
func (e *env) runningAll() []string {
	var ids []string
	for _, n := range e.nodeIDs {
		ids = append(ids, e.running(n)...)
	}
	sort.Strings(ids)
	return ids
}

// workerIDs lists the sandboxes node's daemon holds in its table.
func (e *env) workerIDs(node string) []string {
	var ids []string
	for _, r := range e.workers[node].d.Node(node).Snapshot() {
		ids = append(ids, r.GetId())
	}
	sort.Strings(ids)
	return ids
}

func (e *env) handshakes() int {
	m := &dtoCounter{}
	total := 0
	for _, mode := range []string{"reset", "recover"} {
		_ = e.cp.metrics.handshakes.WithLabelValues(mode).Write(&m.Metric)
		total += int(m.GetCounter().GetValue())
	}
	return total
}

func (e *env) creations() int { return testutilCounter(e.cp) }

// converged reports whether fn has exactly want sandboxes, all ready, and
// the same set everywhere: the control plane's table, the runtimes, the
// endpoint stream and (when running) the data plane's routes. It returns
// the set.
func (e *env) converged(fn string, want int) ([]string, bool) {
	view := e.cpView(fn)
	ready := e.cpIDs(fn, "ready")
	if len(view) != want || len(ready) != want {
		return nil, false
	}
	if !slices.Equal(e.runningOf(fn), ready) {
		return nil, false
	}
	if !slices.Equal(e.watch.ids(fn), ready) {
		return nil, false
	}
	return ready, true
}

// runningOf lists the running sandboxes of fn, on every node.
func (e *env) runningOf(fn string) []string {
	var ids []string
	for _, n := range e.nodeIDs {
		l, _ := e.workers[n].inner.List(context.Background())
		for _, s := range l {
			if s.Function == fn {
				ids = append(ids, s.ID)
			}
		}
	}
	sort.Strings(ids)
	return ids
}

// awaitConverged waits until fn has converged to want sandboxes (see
// converged) and, with a data plane, until the data plane routes exactly to
// them; it returns the set.
func (e *env) awaitConverged(fn string, want int) []string {
	e.t.Helper()
	var ids []string
	testutil.Eventually(e.t, wait, func() bool {
		var ok bool
		ids, ok = e.converged(fn, want)
		return ok
	}, lazy(func() any {
		return fmt.Sprintf("%s: want %d ready everywhere; control plane %v, runtimes %v, endpoint stream %v",
			fn, want, e.cpView(fn), e.runningOf(fn), e.watch.ids(fn))
	}))
	if e.dp != nil && want > 0 {
		testutil.Eventually(e.t, wait, func() bool {
			got, ok := e.dpRoutes(fn, want)
			return ok && slices.Equal(got, ids)
		}, "%s: data plane routes %v, want %v", fn, lazy(func() any { got, _ := e.dpRoutes(fn, want); return got }), ids)
	}
	return ids
}

type lazy func() any

func (l lazy) String() string { return fmt.Sprint(l()) }

// ---------------------------------------------------------------- data plane

// startDataPlane runs a real data plane whose control-plane connection goes
// through a TCP proxy the test can cut.
func (e *env) startDataPlane() {
	e.dpProxy = newTCPProxy(e.t, e.cpAddr)
	e.onStop(e.dpProxy.close)
	dp, err := dataplane.New(dataplane.Config{ID: "dp-0", Listen: "127.0.0.1:0", ControlPlane: e.dpProxy.addr(), Logger: quiet})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { dp.Run(ctx); close(done) }()
	<-dp.Ready()
	e.dp = dp
	e.onStop(func() { cancel(); <-done })
}

// dpRoutes reads the data plane's route set for fn by calling it: with
// round-robin balancing and one call at a time, 2n+1 calls visit every
// route at least twice when there are n, and more than n distinct sandboxes
// when there are more. Every call must succeed: a route to a dead sandbox
// answers 502.
func (e *env) dpRoutes(fn string, n int) ([]string, bool) {
	seen := map[string]bool{}
	for i := 0; i < 2*n+1; i++ {
		req := httptest.NewRequest(http.MethodPost, "/function/"+fn, strings.NewReader(`{}`))
		if tok, err := admin.ReadAdminToken(e.dir); err == nil {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rec := httptest.NewRecorder()
		e.dp.Handler().ServeHTTP(rec, req.WithContext(ctx))
		cancel()
		if rec.Code != http.StatusOK {
			return nil, false
		}
		seen[rec.Header().Get("X-Brisk-Sandbox")] = true
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, true
}

// ---------------------------------------------------------------- endpoint stream

// routeWatch follows WatchEndpoints over gRPC, as a data plane does, and
// keeps the route set plus the history of every endpoint ever announced.
type routeWatch struct {
	mu     sync.Mutex
	routes map[string]map[string]bool // function -> sandbox ids
	added  []string                   // every announced sandbox id, in order
	conds  map[string]string          // function -> "reason: message"
	cancel context.CancelFunc
	done   chan struct{}
}

func followEndpoints(t *testing.T, addr string) *routeWatch {
	w := &routeWatch{routes: map[string]map[string]bool{}}
	w.start(t, addr)
	return w
}

// start follows the stream at addr (again) until stop; the history is kept.
func (w *routeWatch) start(t *testing.T, addr string) {
	conn, err := rpc.Dial(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		defer conn.Close()
		client := briskv1.NewControlPlaneClient(conn)
		for ctx.Err() == nil {
			stream, err := client.WatchEndpoints(ctx, &briskv1.WatchEndpointsRequest{DataPlaneId: "watch"})
			if err == nil {
				for {
					b, err := stream.Recv()
					if err != nil {
						break
					}
					w.apply(b)
				}
			}
			select { // reconnect backoff, not synchronisation
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

func (w *routeWatch) stop() { w.cancel(); <-w.done }

func (w *routeWatch) apply(b *briskv1.EndpointBatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if b.GetSnapshot() {
		w.routes = map[string]map[string]bool{}
		w.conds = map[string]string{}
	}
	for _, c := range b.GetConditions() {
		if w.conds == nil {
			w.conds = map[string]string{}
		}
		if c.GetReason() == "" {
			delete(w.conds, c.GetFunction())
		} else {
			w.conds[c.GetFunction()] = c.GetReason() + ": " + c.GetMessage()
		}
	}
	for _, f := range b.GetFunctions() {
		if w.routes[f.GetName()] == nil {
			w.routes[f.GetName()] = map[string]bool{}
		}
	}
	for _, name := range b.GetDeletedFunctions() {
		delete(w.routes, name)
	}
	for _, ep := range b.GetAdded() {
		if w.routes[ep.GetFunction()] == nil {
			w.routes[ep.GetFunction()] = map[string]bool{}
		}
		w.routes[ep.GetFunction()][ep.GetSandboxId()] = true
		w.added = append(w.added, ep.GetSandboxId())
	}
	for _, id := range b.GetRemoved() {
		for _, set := range w.routes {
			delete(set, id)
		}
	}
}

// condition is fn's condition as the stream last said ("": none).
func (w *routeWatch) condition(fn string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conds[fn]
}

// ids lists the sandboxes the stream routes fn to.
func (w *routeWatch) ids(fn string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ids []string
	for id := range w.routes[fn] {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// mark returns a position in the announcement history.
func (w *routeWatch) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.added)
}

// announcedSince reports whether id was announced after mark.
func (w *routeWatch) announcedSince(mark int, id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Contains(w.added[mark:], id)
}

// ---------------------------------------------------------------- helpers

// records returns the sandbox records of a FromWorker message.
func records(m *briskv1.FromWorker) []*briskv1.SandboxRecord {
	switch {
	case m.GetUpdates() != nil:
		return m.GetUpdates().GetRecords()
	case m.GetFetch() != nil:
		return m.GetFetch().GetRecords()
	case m.GetHelloAck() != nil:
		return m.GetHelloAck().GetRecords()
	}
	return nil
}

func hasRecord(m *briskv1.FromWorker, fn string, st briskv1.SandboxState) bool {
	for _, r := range records(m) {
		if (fn == "" || r.GetFunction() == fn) && r.GetState() == st {
			return true
		}
	}
	return false
}

// createsFor returns the ids a ToWorker message asks to create for fn.
func createsFor(m *briskv1.ToWorker, fn string) []string {
	var ids []string
	for _, c := range m.GetCommands().GetCreates() {
		if fn == "" || c.GetFunction() == fn {
			ids = append(ids, c.GetId())
		}
	}
	return ids
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}

// tcpProxy forwards TCP connections to target until the test cuts them: a
// data plane's connection to the control plane that can break.
type tcpProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	down   bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{l: l, target: target}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			down := p.down
			p.mu.Unlock()
			if down {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	return p
}

func (p *tcpProxy) addr() string { return p.l.Addr().String() }

// setDown refuses (closes) new connections while down, and cuts the open ones
// when going down.
func (p *tcpProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	conns := p.conns
	if down {
		p.conns = nil
	}
	p.mu.Unlock()
	if down {
		for _, c := range conns {
			c.Close()
		}
	}
}

func (p *tcpProxy) close() {
	p.l.Close()
	p.setDown(true)
}

// nodeOf returns the node the control plane placed a sandbox on.
func (e *env) nodeOf(fn, id string) string {
	st, _ := e.cp.cluster.functionStatus(fn)
	for _, s := range st.Sandboxes {
		if s.ID == id {
			return s.Node
		}
	}
	return ""
}

// onNode returns fn's sandboxes the control plane has on node.
func (e *env) onNode(fn, node string) []string {
	st, _ := e.cp.cluster.functionStatus(fn)
	var ids []string
	for _, s := range st.Sandboxes {
		if s.Node == node {
			ids = append(ids, s.ID)
		}
	}
	sort.Strings(ids)
	return ids
}

func (e *env) nodeConnected(node string) bool {
	for _, ns := range e.cp.cluster.NodeStatus() {
		if ns.ID == node {
			return ns.Connected
		}
	}
	return false
}

// dumpLink logs the last n messages the link carried (on failure).
func (e *env) dumpLink(n int) {
	all := e.net.seenWhere(func(seenMsg) bool { return true })
	if len(all) > n {
		all = all[len(all)-n:]
	}
	for _, m := range all {
		arrow := "cp -> " + m.node
		if m.dir == fromWorker {
			arrow = "cp <- " + m.node
		}
		e.t.Logf("link %s stream %p verdict %d: %v", arrow, m.stream, m.verdict, m.msg)
	}
}

// advance moves the control plane's clock and runs the autoscaler tick at
// the new time (it also checks unreachable nodes against the grace period)
// before returning.
func (e *env) advance(d time.Duration) {
	e.clk.Advance(d)
	e.cp.cluster.tick()
}

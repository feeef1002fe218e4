// Package runtimetest is the conformance suite of runtime.Runtime: the
// behaviour every sandbox runtime (process, emulated, containerd) shares,
// checked the same way for each. A runtime's tests describe how to make it
// in a Harness and call Run.
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/lang"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// IDPrefix starts every sandbox id the suite uses in this process, so that
// a Harness's Leaks may look only at what belongs to these sandboxes: other
// packages' tests may run the suite at the same time on the same host (the
// process runtime's Leaks would otherwise see the containerd runtime's
// sandbox processes). The pid also keeps ids unique across runs, as
// containerd, whose containers outlive a test process, needs.
var IDPrefix = "rtconf-" + strconv.Itoa(os.Getpid()) + "-"

// Harness tells the suite how to make and restart a runtime under test.
type Harness struct {
	// New returns a runtime on stateDir. It is called again with the same
	// stateDir to simulate a worker restart; the previous runtime value is
	// then dropped, after a Close if it is an io.Closer.
	New func(t *testing.T, stateDir string) runtime.Runtime
	// Function returns a function spec the runtime can run that serves
	// HTTP on its sandbox address (GET / answers 2xx).
	Function func(t *testing.T) *spec.Function
	// Failing returns a spec whose sandbox starts but exits at once; nil
	// skips the cases that need one.
	Failing func(t *testing.T) *spec.Function
	// Leaks lists what the runtime holds on the host for its sandboxes
	// (processes, cgroups, namespaces, mounts, table entries...), so the
	// suite can check that nothing is left after Kill; nil skips those
	// checks. It may restrict itself to sandboxes whose id starts with
	// IDPrefix.
	Leaks func(t *testing.T, stateDir string) []string
	// Restartable says List after a restart finds sandboxes started
	// before (false for runtimes whose sandboxes die with the runtime
	// value, or that only list what they created).
	Restartable bool
	// Route prepares a request for sandbox id sent to its Addr (the
	// emulated runtime's sandboxes share one address and are told apart
	// by a header); nil sends requests as they are.
	Route func(req *http.Request, id string)
	// SharedAddr says sandboxes share an address that outlives them, so
	// that concurrent sandboxes need not have distinct addresses.
	SharedAddr bool
	// Secrets returns a function spec, without secrets, whose sandboxes
	// answer GET / with 2xx and GET secretsprobe.Path with
	// secretsprobe's report; nil skips the Secrets case (a runtime with no
	// file system).
	Secrets func(t *testing.T) *spec.Function
	// SecretsElsewhere says sandboxes find their secrets only where
	// $BRISK_SECRETS_DIR points, not at spec.SecretsDir (the process
	// runtime without root).
	SecretsElsewhere bool
	// LangTarget, when set, says the runtime runs functions from source
	// (package lang) and how: what lang.Manager.Prepare is given for rt.
	// nil skips the Languages case.
	LangTarget func(rt runtime.Runtime) lang.Target
}

// wait bounds every wait of the suite. It only bounds failing tests, so it
// is generous: machines are slow and shared, and a containerd sandbox's
// first start may unpack its image.
const wait = 2 * time.Minute

// cases are the suite's, run in this order as subtests named so.
var cases = []struct {
	name string
	run  func(*testing.T, Harness)
}{
	{"CreateServes", testCreateServes},
	{"CreateHonoursContext", testCreateHonoursContext},
	{"DuplicateID", testDuplicateID},
	{"Kill", testKill},
	{"KillUnknown", testKillUnknown},
	{"CrashObserved", testCrashObserved},
	{"ListAfterRestart", testListAfterRestart},
	{"NoLeaks", testNoLeaks},
	{"ConcurrentCreates", testConcurrentCreates},
	{"Secrets", testSecrets},
	{"Languages", testLanguages},
}

// Run runs the conformance cases against the runtime h makes, each as a
// subtest on a fresh state directory and a fresh runtime. They run one
// after another: Leaks may see the whole host.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.Function == nil {
		t.Fatal("runtimetest: Harness.New and Harness.Function are required")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, h) })
	}
}

// env is one case's runtime, its state directory and the sandboxes it
// created, which are killed when the case ends, before the Harness's own
// cleanups run.
type env struct {
	t   *testing.T
	h   Harness
	dir string

	mu  sync.Mutex
	rt  runtime.Runtime
	ids []string
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	e := &env{t: t, h: h, dir: t.TempDir()}
	e.rt = h.New(t, e.dir)
	if e.rt == nil {
		t.Fatal("Harness.New returned nil")
	}
	t.Cleanup(e.killAll)
	return e
}

// runtime is the current runtime (the last New's).
func (e *env) runtime() runtime.Runtime {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rt
}

// restart drops the current runtime, as a worker that exits does, and makes
// a new one on the same state directory.
func (e *env) restart() runtime.Runtime {
	e.t.Helper()
	old := e.runtime()
	if c, ok := old.(io.Closer); ok {
		if err := c.Close(); err != nil {
			e.t.Errorf("Close of the runtime before the restart: %v", err)
		}
	}
	rt := e.h.New(e.t, e.dir)
	if rt == nil {
		e.t.Fatal("Harness.New returned nil")
	}
	e.mu.Lock()
	e.rt = rt
	e.mu.Unlock()
	return rt
}

func (e *env) killAll() {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rt := e.runtime()
	e.mu.Lock()
	ids := slices.Clone(e.ids)
	e.mu.Unlock()
	for _, id := range ids {
		if err := rt.Kill(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			e.t.Errorf("cleanup: Kill %s: %v", id, err)
		}
	}
}

var idSeq atomic.Int64

// newID is unique across the runs of the suite on one machine.
func (e *env) newID() string {
	id := IDPrefix + strconv.FormatInt(idSeq.Add(1), 10)
	e.mu.Lock()
	e.ids = append(e.ids, id)
	e.mu.Unlock()
	return id
}

// create starts sandbox id of f, failing the test unless Create succeeds
// and returns a plausible Instance. Goroutines other than the test's call
// tryCreate instead.
func (e *env) create(id string, f *spec.Function) *runtime.Instance {
	e.t.Helper()
	inst, err := e.tryCreate(id, f)
	if err != nil {
		e.t.Fatal(err)
	}
	return inst
}

func (e *env) tryCreate(id string, f *spec.Function) (*runtime.Instance, error) {
	return e.tryCreateSpec(runtime.Spec{ID: id, Function: f})
}

func (e *env) tryCreateSpec(s runtime.Spec) (*runtime.Instance, error) {
	id := s.ID
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	inst, err := e.runtime().Create(ctx, s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("Create %s: %w", id, err)
	case inst == nil:
		return nil, fmt.Errorf("Create %s returned neither an Instance nor an error", id)
	case inst.ID != id || inst.Addr == "" || inst.ExitErr == nil:
		return nil, fmt.Errorf("Create %s returned %+v: want its id, an address and an ExitErr", id, inst)
	}
	return inst, nil
}

// awaitServing waits until the sandbox accepts connections (unless Create
// said it already does) and checks that GET / then answers 2xx.
func (e *env) awaitServing(inst *runtime.Instance) error {
	if !inst.Ready {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := runtime.WaitReady(ctx, inst.Addr, inst.Exited); err != nil {
			return fmt.Errorf("WaitReady %s: %w (ExitErr: %v)", inst.ID, err, inst.ExitErr())
		}
	}
	return e.serves(inst.Addr, inst.ID)
}

func (e *env) createServing(id string, f *spec.Function) *runtime.Instance {
	e.t.Helper()
	inst := e.create(id, f)
	if err := e.awaitServing(inst); err != nil {
		e.t.Fatal(err)
	}
	return inst
}

// client never reuses a connection: a stopped sandbox must be seen as such,
// not through a connection kept from before.
var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// serves sends GET / to sandbox id at addr; nil means a 2xx reply.
func (e *env) serves(addr, id string) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return err
	}
	if e.h.Route != nil {
		e.h.Route(req, id)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET / of %s at %s: %w", id, addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET / of %s at %s: replied %s %q", id, addr, resp.Status, body)
	}
	return nil
}

// stopped checks that sandbox id at addr no longer serves: GET / fails or
// gets a reply that is not 2xx. A reply is allowed, and not only with
// SharedAddr: a network may answer for an address nobody holds any more (a
// proxy behind the default route once a pool's namespace is gone).
func (e *env) stopped(addr, id string) error {
	if err := e.serves(addr, id); err == nil {
		return fmt.Errorf("%s at %s still serves after Kill", id, addr)
	}
	return nil
}

func (e *env) list() []runtime.Listed {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	l, err := e.runtime().List(ctx)
	if err != nil {
		e.t.Fatalf("List: %v", err)
	}
	return l
}

// listed returns id's entries in l.
func listed(l []runtime.Listed, id string) []runtime.Listed {
	var out []runtime.Listed
	for _, s := range l {
		if s.ID == id {
			out = append(out, s)
		}
	}
	return out
}

// checkListed checks that List shows id once, running f at addr.
func (e *env) checkListed(id string, f *spec.Function, addr string) {
	e.t.Helper()
	l := e.list()
	got := listed(l, id)
	want := runtime.Listed{ID: id, Function: f.Name, Revision: f.Revision, Addr: addr, Running: true}
	if len(got) != 1 || got[0] != want {
		e.t.Errorf("List shows %+v for %s (whole list %+v); want [%+v]", got, id, l, want)
	}
}

// checkNotRunning checks that List shows id, if at all, not running.
func (e *env) checkNotRunning(id string) {
	e.t.Helper()
	for _, s := range listed(e.list(), id) {
		if s.Running {
			e.t.Errorf("List shows %s running after it ended: %+v", id, s)
		}
	}
}

func (e *env) kill(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return e.runtime().Kill(ctx, id)
}

// leaks is the Harness's Leaks, sorted; nil without one.
func (e *env) leaks() []string {
	if e.h.Leaks == nil {
		return nil
	}
	l := slices.Clone(e.h.Leaks(e.t, e.dir))
	slices.Sort(l)
	return l
}

// awaitLeaks waits until Leaks reports what it did before: a runtime may
// release some things (a network namespace returned to a pool) just after
// Kill returns.
func (e *env) awaitLeaks(before []string, what string) {
	e.t.Helper()
	if e.h.Leaks == nil {
		return
	}
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		now := e.leaks()
		if slices.Equal(now, before) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Errorf("%s: Leaks still differs from before after %v; now:\n  %s\nbefore:\n  %s", what, wait,
				strings.Join(now, "\n  "), strings.Join(before, "\n  "))
			return
		}
		<-tick.C
	}
}

// awaitClosed reports whether c closes within wait.
func awaitClosed(c <-chan struct{}) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c:
		return true
	case <-t.C:
		return false
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// checkKilledExit checks what an Instance (or a Watch) says of a sandbox
// Kill stopped: exited closes and why wraps ErrKilled. A nil exited means
// the runtime cannot observe exits, and nothing is checked.
func checkKilledExit(t *testing.T, id string, exited <-chan struct{}, why func() error) {
	t.Helper()
	if exited == nil {
		return
	}
	if !awaitClosed(exited) {
		t.Errorf("%s: Exited still open %v after Kill", id, wait)
		return
	}
	if why == nil {
		t.Errorf("%s: no ExitErr beside Exited", id)
		return
	}
	if err := why(); !errors.Is(err, runtime.ErrKilled) {
		t.Errorf("%s: ExitErr after Kill = %v, want one wrapping runtime.ErrKilled", id, err)
	}
}

// A created sandbox serves HTTP on its address and is listed running.
func testCreateServes(t *testing.T, h Harness) {
	e := newEnv(t, h)
	if e.runtime().Name() == "" {
		t.Error("Name() is empty")
	}
	f := h.Function(t)
	id := e.newID()
	inst := e.createServing(id, f)
	if inst.Exited != nil && isClosed(inst.Exited) {
		t.Errorf("Exited closed while the sandbox serves (ExitErr %v)", inst.ExitErr())
	}
	if err := inst.ExitErr(); err != nil {
		t.Errorf("ExitErr while the sandbox serves = %v", err)
	}
	e.checkListed(id, f, inst.Addr)
}

// Create with an ended ctx fails with ctx's error and leaves nothing: not
// in List, nothing on the host, and the id can be created afterwards.
func testCreateHonoursContext(t *testing.T, h Harness) {
	e := newEnv(t, h)
	f := h.Function(t)
	before := e.leaks()
	id := e.newID()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	inst, err := e.runtime().Create(ctx, runtime.Spec{ID: id, Function: f})
	if err == nil {
		t.Fatalf("Create with a cancelled ctx succeeded: %+v", inst)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Create with a cancelled ctx = %v, want an error wrapping context.Canceled", err)
	}
	if got := listed(e.list(), id); len(got) != 0 {
		t.Errorf("List after a cancelled Create shows %+v", got)
	}
	e.awaitLeaks(before, "cancelled Create")
	// Nothing holds the id either.
	e.createServing(id, f)
}

// A second Create of an id in use fails and leaves the first sandbox alone.
func testDuplicateID(t *testing.T, h Harness) {
	e := newEnv(t, h)
	f := h.Function(t)
	id := e.newID()
	inst := e.createServing(id, f)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if dup, err := e.runtime().Create(ctx, runtime.Spec{ID: id, Function: f}); err == nil {
		t.Errorf("second Create of %s succeeded: %+v", id, dup)
	}
	if err := e.serves(inst.Addr, id); err != nil {
		t.Errorf("after the duplicate Create: %v", err)
	}
	if inst.Exited != nil && isClosed(inst.Exited) {
		t.Errorf("the first sandbox ended after the duplicate Create: %v", inst.ExitErr())
	}
	e.checkListed(id, f, inst.Addr)
}

// Kill stops the sandbox, ends its Instance as killed, drops it from List,
// and a second Kill finds nothing.
func testKill(t *testing.T, h Harness) {
	e := newEnv(t, h)
	id := e.newID()
	inst := e.createServing(id, h.Function(t))
	if err := e.kill(id); err != nil {
		t.Fatalf("Kill %s: %v", id, err)
	}
	if err := e.stopped(inst.Addr, id); err != nil {
		t.Error(err)
	}
	checkKilledExit(t, id, inst.Exited, inst.ExitErr)
	e.checkNotRunning(id)
	if err := e.kill(id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("second Kill of %s = %v, want runtime.ErrNotFound", id, err)
	}
}

func testKillUnknown(t *testing.T, h Harness) {
	e := newEnv(t, h)
	id := e.newID()
	if err := e.kill(id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Kill of unknown %s = %v, want runtime.ErrNotFound", id, err)
	}
}

// A sandbox that exits on its own is seen to: Exited closes and ExitErr
// says it was not Kill. Killing it afterwards leaves nothing.
func testCrashObserved(t *testing.T, h Harness) {
	if h.Failing == nil {
		t.Skip("the harness has no failing function (Harness.Failing)")
	}
	e := newEnv(t, h)
	before := e.leaks()
	id := e.newID()
	inst := e.create(id, h.Failing(t))
	if inst.Exited == nil {
		t.Fatal("Instance.Exited is nil, yet the harness gives a failing function to observe")
	}
	if !awaitClosed(inst.Exited) {
		t.Fatalf("Exited of the failing %s still open after %v", id, wait)
	}
	err := inst.ExitErr()
	if err == nil {
		t.Error("ExitErr after the crash is nil")
	} else if errors.Is(err, runtime.ErrKilled) {
		t.Errorf("ExitErr after the crash = %v, which claims Kill stopped it", err)
	}
	t.Logf("ExitErr: %v", err)
	e.checkNotRunning(id)
	if err := e.kill(id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("Kill of the crashed %s: %v", id, err)
	}
	if err2 := inst.ExitErr(); err != nil && (err2 == nil || err2.Error() != err.Error()) {
		t.Errorf("Kill after the crash rewrote ExitErr from %v to %v", err, err2)
	}
	e.awaitLeaks(before, "crashed sandbox after Kill")
}

// A runtime made on the state directory of an earlier one (a restarted
// worker) lists the sandboxes it left running, reaches, watches and kills
// them.
func testListAfterRestart(t *testing.T, h Harness) {
	if !h.Restartable {
		t.Skip("the runtime does not find sandboxes an earlier runtime started (Harness.Restartable)")
	}
	e := newEnv(t, h)
	f := h.Function(t)
	before := e.leaks()
	id := e.newID()
	inst := e.createServing(id, f)

	rt := e.restart()
	e.checkListed(id, f, inst.Addr)
	if err := e.serves(inst.Addr, id); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	var exited <-chan struct{}
	var why func() error
	if w, ok := rt.(runtime.Watcher); ok {
		var watchable bool
		exited, why, watchable = w.Watch(id)
		switch {
		case !watchable:
			t.Errorf("Watch(%s) after the restart: not watchable", id)
		case exited == nil:
			t.Errorf("Watch(%s) after the restart returned ok with a nil channel", id)
		case isClosed(exited):
			t.Errorf("Watch(%s) after the restart: ended while it serves (%v)", id, why())
		}
		if _, _, ok := w.Watch(IDPrefix + "unknown"); ok {
			t.Error("Watch of an unknown id: ok")
		}
	}
	if err := e.kill(id); err != nil {
		t.Fatalf("Kill %s by the restarted runtime: %v", id, err)
	}
	if err := e.stopped(inst.Addr, id); err != nil {
		t.Error(err)
	}
	checkKilledExit(t, id, exited, why)
	e.checkNotRunning(id)
	if err := e.kill(id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("second Kill of %s = %v, want runtime.ErrNotFound", id, err)
	}
	e.awaitLeaks(before, "sandbox killed after a restart")
}

// Sandboxes created and killed leave the host as it was; while they run,
// Leaks sees them (else the check would prove nothing).
func testNoLeaks(t *testing.T, h Harness) {
	if h.Leaks == nil {
		t.Skip("the harness cannot list what the runtime holds (Harness.Leaks)")
	}
	e := newEnv(t, h)
	f := h.Function(t)
	before := e.leaks()
	const n = 3
	insts := make([]*runtime.Instance, n)
	for i := range insts {
		insts[i] = e.createServing(e.newID(), f)
	}
	if during := e.leaks(); slices.Equal(during, before) {
		t.Errorf("Leaks shows nothing of %d running sandboxes (%q): the harness's Leaks proves nothing", n, during)
	}
	for _, inst := range insts {
		if err := e.kill(inst.ID); err != nil {
			t.Errorf("Kill %s: %v", inst.ID, err)
		}
	}
	e.awaitLeaks(before, fmt.Sprintf("%d sandboxes after Kill", n))
}

// Concurrent Creates of distinct ids all succeed and serve, each at an
// address of its own, and concurrent Kills stop them all.
func testConcurrentCreates(t *testing.T, h Harness) {
	e := newEnv(t, h)
	f := h.Function(t)
	before := e.leaks()
	const n = 8
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.newID()
	}
	insts := make([]*runtime.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			insts[i], errs[i] = e.tryCreate(ids[i], f)
			if errs[i] == nil {
				errs[i] = e.awaitServing(insts[i])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	for _, inst := range insts {
		if other, dup := addrs[inst.Addr]; dup && !h.SharedAddr {
			t.Errorf("%s and %s share address %s", other, inst.ID, inst.Addr)
		}
		addrs[inst.Addr] = inst.ID
		// Each still serves once all have started.
		if err := e.serves(inst.Addr, inst.ID); err != nil {
			t.Error(err)
		}
	}
	l := e.list()
	for _, inst := range insts {
		if got := listed(l, inst.ID); len(got) != 1 || !got[0].Running || got[0].Addr != inst.Addr {
			t.Errorf("List shows %+v for %s at %s", got, inst.ID, inst.Addr)
		}
	}
	for i := range n {
		wg.Go(func() { errs[i] = e.kill(ids[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// In parallel: a connect to an address nobody holds any more may take
	// seconds to fail.
	for i, inst := range insts {
		wg.Go(func() { errs[i] = e.stopped(inst.Addr, inst.ID) })
	}
	wg.Wait()
	for i, inst := range insts {
		if errs[i] != nil {
			t.Error(errs[i])
		}
		checkKilledExit(t, inst.ID, inst.Exited, inst.ExitErr)
	}
	e.awaitLeaks(before, fmt.Sprintf("%d concurrent sandboxes after Kill", n))
}

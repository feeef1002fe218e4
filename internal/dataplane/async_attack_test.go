package dataplane

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Regression tests for attacks on asynchronous calls: another tenant's
// calls (ids, records, retries, lists), what a submit may leave behind when
// it is refused, and requests at the edges of the limits. Attacks that
// found nothing are pinned as tables of refusals.

// asyncEnv is newAsyncDP with its queue and NATS connection at hand.
type asyncEnv struct {
	d  *DataPlane
	ts *testServer
	q  *async.Queue
	nc *nats.Conn
}

func newAsyncEnv(t *testing.T, mod func(*Config), acfg async.Config) *asyncEnv {
	t.Helper()
	srv, err := async.StartServer(async.ServerConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := srv.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	q, err := async.Open(context.Background(), nc, acfg)
	if err != nil {
		t.Fatal(err)
	}
	d, ts := newTestDP(t, func(c *Config) {
		c.Async = q
		if mod != nil {
			mod(c)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.runAsync(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; nc.Close(); srv.Shutdown() })
	return &asyncEnv{d: d, ts: ts, q: q, nc: nc}
}

// as sends a request with an Authorization value (none when empty).
func as(t *testing.T, method, url, authz string, hdr http.Header, body string) result {
	t.Helper()
	h := http.Header{}
	for k, v := range hdr {
		h[k] = v
	}
	if authz != "" {
		h.Set("Authorization", authz)
	}
	return submitAsync(t, method, url, h, body)
}

// rawCall writes a request as it is and reads the one reply.
func rawCall(t *testing.T, base, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(b)
}

// hits counts the calls a sandbox got, by X-Call-Id.
type hits struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *hits) sandbox(t *testing.T, code int) string {
	h.n = map[string]int{}
	return newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h.mu.Lock()
		h.n[r.Header.Get("X-Call-Id")]++
		h.mu.Unlock()
		w.WriteHeader(code)
		_, _ = io.WriteString(w, "from "+r.Host)
	})
}

func (h *hits) of(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[id]
}

// tenants: functions a and b each with their own invoke token, pub public,
// an admin token and a deploy-only token.
type tenants struct {
	*asyncEnv
	a, b, admin  string // "Bearer ..."
	deploy       string
	hitsA, hitsB *hits
}

func newTenants(t *testing.T, mod func(*Config), acfg async.Config, codeB int) *tenants {
	e := newAsyncEnv(t, mod, acfg)
	ta, ga := newToken(t, []string{auth.ScopeInvoke}, []string{"a"})
	tb, gb := newToken(t, []string{auth.ScopeInvoke}, []string{"b"})
	adm, gadm := newToken(t, []string{auth.ScopeAdmin}, nil)
	dep, gdep := newToken(t, []string{auth.ScopeDeploy}, nil)
	tn := &tenants{asyncEnv: e, a: "Bearer " + ta, b: "Bearer " + tb, admin: "Bearer " + adm, deploy: "Bearer " + dep, hitsA: &hits{}, hitsB: &hits{}}
	addrA, addrB := tn.hitsA.sandbox(t, 200), tn.hitsB.sandbox(t, codeB)
	priv := func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthToken; s.Async = &briskv1.AsyncPolicy{MaxAttempts: 1} }
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("a", priv), fnSpec("b", priv), fnSpec("pub", func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthPublic })},
		Added:     []*briskv1.Endpoint{ep("a", "sb-a", addrA), ep("b", "sb-b", addrB), ep("pub", "sb-p", addrA)},
		Auth:      &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{ga, gb, gadm, gdep}}})
	return tn
}

// await waits for call id to reach want, read with an admin token.
func (tn *tenants) await(t *testing.T, id string, want async.Status) async.Record {
	t.Helper()
	var rec async.Record
	waitFor(t, "call "+id+" "+string(want), func() bool {
		r := as(t, "GET", tn.ts.URL+"/v1/calls/"+id, tn.admin, nil, "")
		rec = async.Record{}
		_ = json.Unmarshal([]byte(r.body), &rec)
		return r.code == http.StatusOK && rec.Status == want
	})
	return rec
}

// A public function's calls are readable by id alone, but listing them
// needs a token: the list is what would hand out the ids. "/v1/calls/"
// and "/v1/calls//" are the list too.
func TestAsyncAttackListingPublicCallsNeedsAToken(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, 200)
	r := as(t, "POST", tn.ts.URL+"/async-function/pub", tn.admin, http.Header{"X-Call-Id": {"pub-1"}}, "secret input")
	if r.code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	tn.await(t, "pub-1", async.StatusSucceeded)
	if r := get(t, tn.ts.URL+"/v1/calls/pub-1"); r.code != http.StatusOK {
		t.Fatalf("a public call by id: %d %s", r.code, r.body)
	}
	for _, p := range []string{"/v1/calls?function=pub", "/v1/calls/?function=pub", "/v1/calls//?function=pub", "/v1/calls/?function=pub&status=succeeded"} {
		wantReason(t, get(t, tn.ts.URL+p), http.StatusUnauthorized, "unauthorized", "")
	}
}

// A call id belongs to one function while its record lives: another
// tenant reusing it gets 409 rather than a 202 for a call that the
// de-duplication window drops, or that overwrites the first call's record.
func TestAsyncAttackCallIDOfAnotherFunction(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, 200)
	base := tn.ts.URL

	// The victim's call, then the attacker's with the same id.
	if r := as(t, "POST", base+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"order-1"}}, "victim"); r.code != http.StatusAccepted {
		t.Fatalf("victim submit: %d %s", r.code, r.body)
	}
	wantReason(t, as(t, "POST", base+"/async-function/a", tn.a, http.Header{"X-Call-Id": {"order-1"}}, "attacker"), http.StatusConflict, "call-id-taken", "order-1")
	if rec := tn.await(t, "order-1", async.StatusSucceeded); rec.Function != "b" {
		t.Fatalf("the victim's record: %+v", rec)
	}
	// Once it has run too (past the de-duplication window, the attacker's
	// call would run and its record replace the victim's).
	wantReason(t, as(t, "POST", base+"/async-function/a", tn.a, http.Header{"X-Call-Id": {"order-1"}, "Prefer": {"respond-async"}}, "attacker"), http.StatusConflict, "call-id-taken", "")
	wantReason(t, as(t, "POST", base+"/function/a", tn.a, http.Header{"X-Call-Id": {"order-1"}, "Prefer": {"respond-async"}}, "attacker"), http.StatusConflict, "call-id-taken", "")
	if n := tn.hitsA.of("order-1"); n != 0 {
		t.Fatalf("the attacker's call with the victim's id ran %d times", n)
	}
	if r := as(t, "GET", base+"/v1/calls/order-1", tn.b, nil, ""); r.code != http.StatusOK {
		t.Fatalf("the victim reads its call: %d %s", r.code, r.body)
	}

	// The attacker first: the victim learns its id is taken instead of a
	// 202 for a call that never runs.
	if r := as(t, "POST", base+"/async-function/a", tn.a, http.Header{"X-Call-Id": {"order-2"}}, "attacker"); r.code != http.StatusAccepted {
		t.Fatalf("attacker submit: %d %s", r.code, r.body)
	}
	wantReason(t, as(t, "POST", base+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"order-2"}}, "victim"), http.StatusConflict, "call-id-taken", "")

	// The same function again is a client retrying its submit: 202, one run.
	for range 2 {
		if r := as(t, "POST", base+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"order-3"}}, "victim"); r.code != http.StatusAccepted {
			t.Fatalf("resubmit: %d %s", r.code, r.body)
		}
	}
	tn.await(t, "order-3", async.StatusSucceeded)
	if n := tn.hitsB.of("order-3"); n != 1 {
		t.Fatalf("a resubmitted call ran %d times", n)
	}
}

// A retry runs the dead letter of the function the caller was authorized
// for: once a victim's record has expired (its dead letter lives longer),
// an attacker reusing the id for its own function must not be able to
// re-run the victim's call.
func TestAsyncAttackRetryRunsOnlyItsOwnFunctionsCall(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, http.StatusBadRequest)
	base := tn.ts.URL
	if r := as(t, "POST", base+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"pay-1"}}, "victim"); r.code != http.StatusAccepted {
		t.Fatalf("victim submit: %d %s", r.code, r.body)
	}
	tn.await(t, "pay-1", async.StatusFailed)
	// A day later the record has expired (ResultTTL), the dead letter not
	// (DeadTTL), and the attacker's own call with the id has run: its
	// record is the one the id finds.
	js, err := jetstream.New(tn.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), async.StatusBucket)
	if err != nil {
		t.Fatal(err)
	}
	own, _ := json.Marshal(async.Record{ID: "pay-1", Function: "a", Status: async.StatusSucceeded, Attempts: 1})
	if _, err := kv.Put(context.Background(), "pay-1", own); err != nil {
		t.Fatal(err)
	}
	r := as(t, "POST", base+"/v1/calls/pay-1/retry", tn.a, nil, "")
	if r.code == http.StatusAccepted {
		waitFor(t, "the retried call to run", func() bool { return tn.hitsB.of("pay-1") == 2 })
		t.Fatalf("the attacker retried the victim's call: %s", r.body)
	}
	wantReason(t, r, http.StatusNotFound, "no-call", "")
	if n := tn.hitsB.of("pay-1"); n != 1 {
		t.Fatalf("the victim's call ran %d times", n)
	}
}

// A submit refused for a full queue leaves no record saying the call is
// queued (nor one that holds its id); once there is room, the same id is
// accepted and runs once.
func TestAsyncAttackRefusedSubmitLeavesNoRecord(t *testing.T) {
	e := newAsyncEnv(t, nil, async.Config{MaxQueued: 1, NamespaceShare: 1})
	g := newGate(t)
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("slow")}, Added: []*briskv1.Endpoint{ep("slow", "sb-1", g.addr)}})
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/slow", http.Header{"X-Call-Id": {"held"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("first: %d %s", r.code, r.body)
	}
	recv(t, g.arrived, "the first call")
	wantReason(t, submitAsync(t, "POST", e.ts.URL+"/async-function/slow", http.Header{"X-Call-Id": {"refused"}}, ""), http.StatusServiceUnavailable, "queue-full", "limit")
	wantReason(t, get(t, e.ts.URL+"/v1/calls/refused"), http.StatusNotFound, "no-call", "")
	g.release <- struct{}{}
	awaitCall(t, e.ts.URL, "held", async.StatusSucceeded)
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/slow", http.Header{"X-Call-Id": {"refused"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("the refused id, again: %d %s", r.code, r.body)
	}
	recv(t, g.arrived, "the refused call, accepted")
	g.release <- struct{}{}
	awaitCall(t, e.ts.URL, "refused", async.StatusSucceeded)
}

// Headers count against the queue's message limit too: a body at the
// limit with a large head (JSON escaping makes '<' six bytes) is a 413
// before anything is stored, not a 503 from JetStream with a record left
// behind.
func TestAsyncAttackLargeHeadAtTheBodyLimit(t *testing.T) {
	e := newAsyncEnv(t, func(c *Config) { c.MaxBodyBytes = 16 << 20 }, async.Config{})
	h := &hits{}
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")}, Added: []*briskv1.Endpoint{ep("f", "sb-1", h.sandbox(t, 200))}})
	body := strings.Repeat("b", int(e.q.MaxBody()))
	big := http.Header{"X-Call-Id": {"big-head"}, "X-Big": {strings.Repeat("<", 60<<10)}}
	wantReason(t, submitAsync(t, "POST", e.ts.URL+"/async-function/f", big, body), http.StatusRequestEntityTooLarge, "body-too-large", "too large")
	wantReason(t, get(t, e.ts.URL+"/v1/calls/big-head"), http.StatusNotFound, "no-call", "")
	// The same body with an ordinary head is taken, and runs.
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/f", http.Header{"X-Call-Id": {"at-limit"}}, body); r.code != http.StatusAccepted {
		t.Fatalf("at the limit: %d %s", r.code, r.body)
	}
	awaitCall(t, e.ts.URL, "at-limit", async.StatusSucceeded)
	wantReason(t, submitAsync(t, "POST", e.ts.URL+"/async-function/f", nil, body+"b"), http.StatusRequestEntityTooLarge, "body-too-large", "")
}

// A purge's function becomes part of a NATS subject: a wildcard or a dot
// must not widen it (function=* would purge every function's calls).
func TestAsyncAttackPurgeSubjectInjection(t *testing.T) {
	e := newAsyncEnv(t, nil, async.Config{})
	g := newGate(t)
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("keep")}, Added: []*briskv1.Endpoint{ep("keep", "sb-1", g.addr)}})
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/keep", http.Header{"X-Call-Id": {"kept"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	recv(t, g.arrived, "the call")
	for _, fn := range []string{"*", ">", "keep.>", "keep.*", "a.b.c", "*.kept", "%2A"} {
		wantReason(t, submitAsync(t, "DELETE", e.ts.URL+"/v1/calls?function="+fn, nil, ""), http.StatusBadRequest, "bad-request", "function")
	}
	// A function of another namespace (NAME.NAMESPACE) is another subject
	// token: its purge is not keep's, nor is keep's kept call its.
	if r := submitAsync(t, "DELETE", e.ts.URL+"/v1/calls?function=keep.team-a", nil, ""); r.code != http.StatusOK || !strings.Contains(r.body, `"purged": 0`) {
		t.Fatalf("purge of keep.team-a: %d %s", r.code, r.body)
	}
	if d, err := e.q.Depth(context.Background()); err != nil || d["keep"] != 1 {
		t.Fatalf("depth after the purges %v %v: a purge reached another function", d, err)
	}
	g.release <- struct{}{}
	awaitCall(t, e.ts.URL, "kept", async.StatusSucceeded)
}

// Bodies held for a submit are charged to the data plane's body budget:
// with it spent by a stalled upload, a submit is refused (503) rather than
// holding more memory; the budget comes back when the upload ends.
func TestAsyncAttackSubmitBodiesWithinTheBudget(t *testing.T) {
	const total = 1 << 20
	e := newAsyncEnv(t, func(c *Config) { c.BodyBufferTotal = total }, async.Config{})
	h := &hits{}
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("f")}, Added: []*briskv1.Endpoint{ep("f", "sb-1", h.sandbox(t, 200))}})
	c := stalledUpload(t, e.ts.URL, "POST /async-function/f HTTP/1.1\r\nHost: x\r\nX-Call-Id: stalled\r\nContent-Length: 1000000\r\n\r\n"+strings.Repeat("a", 900_000))
	waitFor(t, "the stalled upload to hold budget", func() bool { return e.d.bodyBudget.left.Load() < total-800_000 })
	wantReason(t, submitAsync(t, "POST", e.ts.URL+"/async-function/f", http.Header{"X-Call-Id": {"over"}}, strings.Repeat("b", 500_000)), http.StatusServiceUnavailable, "async-unavailable", "body")
	wantReason(t, get(t, e.ts.URL+"/v1/calls/over"), http.StatusNotFound, "no-call", "")
	_ = c.Close()
	waitFor(t, "the budget back whole", func() bool { return e.d.bodyBudget.left.Load() == total })
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/f", http.Header{"X-Call-Id": {"fits"}}, strings.Repeat("b", 500_000)); r.code != http.StatusAccepted {
		t.Fatalf("within the budget: %d %s", r.code, r.body)
	}
	awaitCall(t, e.ts.URL, "fits", async.StatusSucceeded)
	waitFor(t, "the budget back whole", func() bool { return e.d.bodyBudget.left.Load() == total })
}

// Attacks that found nothing to fix, pinned: each is refused before
// anything is stored, with its status and reason.
func TestAsyncAttackRefusals(t *testing.T) {
	tn := newTenants(t, func(c *Config) { c.MaxBodyBytes = 1 << 20 }, async.Config{}, 200)
	base := tn.ts.URL
	if r := as(t, "POST", base+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"b-call"}}, "victim"); r.code != http.StatusAccepted {
		t.Fatalf("victim submit: %d %s", r.code, r.body)
	}
	tn.await(t, "b-call", async.StatusSucceeded)
	id := func(s string) http.Header { return http.Header{"X-Call-Id": {s}} }
	cb := func(i, u string) http.Header { return http.Header{"X-Call-Id": {i}, "X-Callback-Url": {u}} }
	big := strings.Repeat("x", 1<<20+1)
	for _, tc := range []struct {
		name, method, path, authz string
		hdr                       http.Header
		body                      string
		code                      int
		reason                    string
	}{
		// Ids that would break a NATS subject or a key.
		{"id with a dot", "POST", "/async-function/a", tn.a, id("x.y"), "", 400, "bad-request"},
		{"id with *", "POST", "/async-function/a", tn.a, id("x*"), "", 400, "bad-request"},
		{"id with >", "POST", "/async-function/a", tn.a, id(">"), "", 400, "bad-request"},
		{"id with unicode", "POST", "/async-function/a", tn.a, id("caf\u00e9"), "", 400, "bad-request"},
		{"id with a slash", "POST", "/async-function/a", tn.a, id("../b-call"), "", 400, "bad-request"},
		{"id of 65", "POST", "/async-function/a", tn.a, id(strings.Repeat("i", 65)), "", 400, "bad-request"},
		{"get id with a dot", "GET", "/v1/calls/b.b-call", tn.admin, nil, "", 400, "bad-request"},
		{"get id *", "GET", "/v1/calls/*", tn.admin, nil, "", 400, "bad-request"},
		{"get id > escaped", "GET", "/v1/calls/%3E", tn.admin, nil, "", 400, "bad-request"},
		{"retry id *", "POST", "/v1/calls/*/retry", tn.admin, nil, "", 400, "bad-request"},
		// Another tenant's calls.
		// Whether b's call exists is not a's to learn: 404 as for no call.
		{"read b's call with a's token", "GET", "/v1/calls/b-call", tn.a, nil, "", 404, "no-call"},
		{"read no call with a's token", "GET", "/v1/calls/nobodys-call", tn.a, nil, "", 404, "no-call"},
		{"read b's call without a token", "GET", "/v1/calls/b-call", "", nil, "", 401, "unauthorized"},
		{"read no call without a token", "GET", "/v1/calls/nobodys-call", "", nil, "", 401, "unauthorized"},
		{"read no call with a bad token", "GET", "/v1/calls/nobodys-call", "Bearer nonsense", nil, "", 401, "unauthorized"},
		{"retry b's call with a's token", "POST", "/v1/calls/b-call/retry", tn.a, nil, "", 404, "no-call"},
		{"retry no call without a token", "POST", "/v1/calls/nobodys-call/retry", "", nil, "", 401, "unauthorized"},
		{"list b with a's token", "GET", "/v1/calls?function=b", tn.a, nil, "", 403, "forbidden"},
		{"list all with a's token", "GET", "/v1/calls", tn.a, nil, "", 403, "forbidden"},
		{"list by status with a's token", "GET", "/v1/calls?status=succeeded", tn.a, nil, "", 403, "forbidden"},
		{"list a gone function", "GET", "/v1/calls?function=ghost", tn.a, nil, "", 403, "forbidden"},
		{"purge with an invoke token", "DELETE", "/v1/calls?function=a", tn.a, nil, "", 403, "forbidden"},
		{"purge without a token", "DELETE", "/v1/calls", "", nil, "", 401, "unauthorized"},
		{"submit to b with a's token", "POST", "/async-function/b", tn.a, id("r-1"), "", 403, "forbidden"},
		{"Prefer to b with a's token", "POST", "/function/b", tn.a, http.Header{"X-Call-Id": {"r-2"}, "Prefer": {"respond-async"}}, "", 403, "forbidden"},
		{"submit without a token", "POST", "/async-function/b", "", id("r-3"), "", 401, "unauthorized"},
		// Callbacks that are no URL to POST to.
		{"callback ftp", "POST", "/async-function/a", tn.a, cb("r-4", "ftp://example.com/x"), "", 400, "bad-request"},
		{"callback file", "POST", "/async-function/a", tn.a, cb("r-5", "file:///etc/passwd"), "", 400, "bad-request"},
		{"callback javascript", "POST", "/async-function/a", tn.a, cb("r-6", "javascript:alert(1)"), "", 400, "bad-request"},
		{"callback without host", "POST", "/async-function/a", tn.a, cb("r-7", "http:///cb"), "", 400, "bad-request"},
		{"callback scheme-relative", "POST", "/async-function/a", tn.a, cb("r-8", "//example.com/cb"), "", 400, "bad-request"},
		{"callback broken IPv6", "POST", "/async-function/a", tn.a, cb("r-9", "http://[::1"), "", 400, "bad-request"},
		// Upgrades, bodies, names.
		{"upgrade", "POST", "/async-function/a", tn.a, http.Header{"X-Call-Id": {"r-10"}, "Connection": {"Upgrade"}, "Upgrade": {"websocket"}}, "", 400, "bad-request"},
		{"body over the limit", "POST", "/async-function/a", tn.a, id("r-11"), big, 413, "body-too-large"},
		{"no name", "POST", "/async-function/", tn.a, id("r-12"), "", 404, "no-function"},
		// a's token may not call ghost, there or not: the same 403 as for b.
		{"no such function", "POST", "/async-function/ghost", tn.a, id("r-13"), "", 403, "forbidden"},
		{"no such function, an admin", "POST", "/async-function/ghost", tn.admin, id("r-13b"), "", 404, "no-function"},
		{"no trailing slash", "POST", "/async-function", tn.a, id("r-14"), "", 404, "no-function"},
		{"double slash", "POST", "//async-function/a", tn.a, id("r-15"), "", 404, "no-function"},
		// Methods /v1/calls does not serve.
		{"PUT /v1/calls", "PUT", "/v1/calls", tn.admin, nil, "", 405, "bad-request"},
		{"POST a call", "POST", "/v1/calls/b-call", tn.admin, nil, "", 405, "bad-request"},
		{"GET retry", "GET", "/v1/calls/b-call/retry", tn.admin, nil, "", 405, "bad-request"},
		{"retry and more", "POST", "/v1/calls/b-call/retry/x", tn.admin, nil, "", 405, "bad-request"},
		{"retry a call not dead", "POST", "/v1/calls/b-call/retry", tn.b, nil, "", 404, "no-call"},
	} {
		r := as(t, tc.method, base+tc.path, tc.authz, tc.hdr, tc.body)
		if r.err != nil || r.code != tc.code || r.header.Get("X-Brisk-Error") != tc.reason {
			t.Errorf("%s: %d %q %v, want %d %q (%s)", tc.name, r.code, r.header.Get("X-Brisk-Error"), r.err, tc.code, tc.reason, r.body)
		}
	}
	// The same oversized body, chunked, and a CONNECT asking for async.
	req, _ := http.NewRequest("POST", base+"/async-function/a", strings.NewReader(big))
	req.ContentLength = -1
	req.Header.Set("X-Call-Id", "r-16")
	req.Header.Set("Authorization", tn.a)
	wantReason(t, do(t, req), 413, "body-too-large", "")
	if resp, _ := rawCall(t, base, "CONNECT a:80 HTTP/1.1\r\nHost: a:80\r\nPrefer: respond-async\r\nX-Call-Id: r-17\r\nAuthorization: "+tn.a+"\r\n\r\n"); resp.StatusCode != 400 || resp.Header.Get("X-Brisk-Error") != "bad-request" {
		t.Errorf("CONNECT: %d %q", resp.StatusCode, resp.Header.Get("X-Brisk-Error"))
	}
	// Nothing refused left a record, and nothing ran.
	for i := 1; i <= 17; i++ {
		wantReason(t, as(t, "GET", base+"/v1/calls/r-"+strconv.Itoa(i), tn.admin, nil, ""), 404, "no-call", "")
	}
	if r := as(t, "GET", base+"/v1/calls?function=a", tn.admin, nil, ""); r.code != 200 || !strings.Contains(r.body, `"calls": null`) {
		t.Fatalf("function a's calls: %d %s", r.code, r.body)
	}
}

// The front end and net/http agree on what is asynchronous: Prefer in any
// case (name and value), /async-function/ under any Host; /v1/calls under
// a Host that names a function is the function's own path.
func TestAsyncAttackBothPathsAgree(t *testing.T) {
	e := newAsyncEnv(t, nil, async.Config{})
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("echo")}, Added: []*briskv1.Endpoint{ep("echo", "sb-1", newSandbox(t, echo))}})
	addr := strings.TrimPrefix(e.ts.URL, "http://")
	for _, tc := range []struct {
		name, head string
		code       int
		path       string // the function's path, for a synchronous call
	}{
		{"Prefer upper case", "POST /function/echo HTTP/1.1\r\nHost: x\r\nPrefer: RESPOND-ASYNC\r\n", 202, ""},
		{"prefer lower-case name", "POST /function/echo HTTP/1.1\r\nHost: x\r\nprefer: respond-async\r\n", 202, ""},
		{"Prefer among others", "POST /function/echo HTTP/1.1\r\nHost: x\r\nPrefer: return=minimal\r\nPrefer: wait=5, respond-async\r\n", 202, ""},
		{"Prefer by Host", "POST /x HTTP/1.1\r\nHost: echo.fns.example\r\nPrefer: respond-async\r\n", 202, ""},
		{"async path under a function's Host", "POST /async-function/echo HTTP/1.1\r\nHost: other.fns.example\r\n", 202, ""},
		{"another Prefer", "POST /function/echo HTTP/1.1\r\nHost: x\r\nPrefer: respond-asyncly\r\n", 200, "/"},
		{"/v1/calls of a function's Host", "GET /v1/calls HTTP/1.1\r\nHost: echo.fns.example\r\n", 200, "/v1/calls"},
		{"/v1/calls/ID of a function's Host", "GET /v1/calls/x HTTP/1.1\r\nHost: echo:8080\r\n", 200, "/v1/calls/x"},
	} {
		for _, chunked := range []bool{false, true} {
			body := "Content-Length: 1\r\n\r\nx"
			if chunked { // net/http's path
				body = "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"
			}
			resp, got := rawCall(t, "http://"+addr, tc.head+body)
			if resp.StatusCode != tc.code {
				t.Errorf("%s (chunked %v): %d, want %d", tc.name, chunked, resp.StatusCode, tc.code)
				continue
			}
			if tc.code == 202 {
				awaitCall(t, e.ts.URL, resp.Header.Get("X-Call-Id"), async.StatusSucceeded)
				continue
			}
			var s seen
			if err := json.Unmarshal([]byte(got), &s); err != nil || s.Path != tc.path {
				t.Errorf("%s (chunked %v): the function saw %+v (%v), want path %s", tc.name, chunked, s, err, tc.path)
			}
		}
	}
}

// A retry refused for a full queue leaves the call's record as it was
// (failed, in the dead-letter stream), not saying it is queued again.
func TestAsyncAttackRefusedRetryLeavesTheRecord(t *testing.T) {
	e := newAsyncEnv(t, nil, async.Config{MaxQueued: 1, NamespaceShare: 1})
	g := newGate(t)
	bad := &hits{}
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("slow"), fnSpec("bad")},
		Added: []*briskv1.Endpoint{ep("slow", "sb-1", g.addr), ep("bad", "sb-2", bad.sandbox(t, http.StatusBadRequest))}})
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/bad", http.Header{"X-Call-Id": {"d-1"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	awaitCall(t, e.ts.URL, "d-1", async.StatusFailed)
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/slow", http.Header{"X-Call-Id": {"held"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("held: %d %s", r.code, r.body)
	}
	recv(t, g.arrived, "the held call")
	wantReason(t, submitAsync(t, "POST", e.ts.URL+"/v1/calls/d-1/retry", nil, ""), http.StatusServiceUnavailable, "queue-full", "")
	if rec, code := callRecord(t, e.ts.URL, "d-1"); code != http.StatusOK || rec.Status != async.StatusFailed {
		t.Fatalf("after a refused retry: %d %+v", code, rec)
	}
	g.release <- struct{}{}
	awaitCall(t, e.ts.URL, "held", async.StatusSucceeded)
	if r := submitAsync(t, "POST", e.ts.URL+"/v1/calls/d-1/retry", nil, ""); r.code != http.StatusAccepted {
		t.Fatalf("retry with room: %d %s", r.code, r.body)
	}
	waitFor(t, "the retried call to run", func() bool { return bad.of("d-1") == 2 })
	awaitCall(t, e.ts.URL, "d-1", async.StatusFailed)
}

// A purge's dead= is read strictly: "dead=1" or "dead=yes" meant the dead
// letters, and must never drop the live queue instead.
func TestAsyncAttackPurgeDeadIsStrict(t *testing.T) {
	e := newAsyncEnv(t, nil, async.Config{})
	g := newGate(t)
	bad := &hits{}
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("slow"), fnSpec("bad")},
		Added: []*briskv1.Endpoint{ep("slow", "sb-1", g.addr), ep("bad", "sb-2", bad.sandbox(t, http.StatusBadRequest))}})
	for _, id := range []string{"d-1", "d-2"} {
		if r := submitAsync(t, "POST", e.ts.URL+"/async-function/bad", http.Header{"X-Call-Id": {id}}, ""); r.code != http.StatusAccepted {
			t.Fatalf("submit: %d %s", r.code, r.body)
		}
		awaitCall(t, e.ts.URL, id, async.StatusFailed)
	}
	if r := submitAsync(t, "POST", e.ts.URL+"/async-function/slow", http.Header{"X-Call-Id": {"live"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("live: %d %s", r.code, r.body)
	}
	recv(t, g.arrived, "the live call")
	for _, v := range []string{"yes", "on", "2", "dead"} {
		wantReason(t, submitAsync(t, "DELETE", e.ts.URL+"/v1/calls?dead="+v, nil, ""), http.StatusBadRequest, "bad-request", "dead")
	}
	if d, err := e.q.Depth(context.Background()); err != nil || d["slow"] != 1 {
		t.Fatalf("the live queue after the purges: %v %v", d, err)
	}
	r := submitAsync(t, "DELETE", e.ts.URL+"/v1/calls?function=bad&dead=1", nil, "")
	if r.code != http.StatusOK || !strings.Contains(r.body, `"purged": 2`) {
		t.Fatalf("dead=1: %d %s", r.code, r.body)
	}
	g.release <- struct{}{}
	awaitCall(t, e.ts.URL, "live", async.StatusSucceeded)
}

// Probing call ids with a token for another function tells nothing about
// the call, nor whether it exists.
func TestAsyncAttackRefusalNamesNoOtherFunction(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, 200)
	if r := as(t, "POST", tn.ts.URL+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"payroll-2025"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	tn.await(t, "payroll-2025", async.StatusSucceeded)
	for _, req := range []struct{ method, path string }{{"GET", "/v1/calls/payroll-2025"}, {"POST", "/v1/calls/payroll-2025/retry"}} {
		r := as(t, req.method, tn.ts.URL+req.path, tn.a, nil, "")
		wantReason(t, r, http.StatusNotFound, "no-call", "")
		if strings.Contains(r.body, `\"b\"`) {
			t.Fatalf("%s %s: the refusal names the call's function: %s", req.method, req.path, r.body)
		}
	}
}

// A retry's message id cannot be taken by a submit: a call id made like
// it ("ID-retry-SEQ", the id and the dead letter's sequence) would have
// had the retry de-duplicated away while its dead letter was deleted,
// losing the victim's call.
func TestAsyncAttackRetryMessageIDCannotBeTaken(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, http.StatusBadRequest)
	base := tn.ts.URL
	if r := as(t, "POST", base+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"job"}}, "victim"); r.code != http.StatusAccepted {
		t.Fatalf("victim submit: %d %s", r.code, r.body)
	}
	tn.await(t, "job", async.StatusFailed)
	for seq := 1; seq <= 3; seq++ {
		id := "job-retry-" + strconv.Itoa(seq)
		if r := as(t, "POST", base+"/async-function/a", tn.a, http.Header{"X-Call-Id": {id}}, "attacker"); r.code != http.StatusAccepted {
			t.Fatalf("attacker submit %s: %d %s", id, r.code, r.body)
		}
	}
	if r := as(t, "POST", base+"/v1/calls/job/retry", tn.b, nil, ""); r.code != http.StatusAccepted {
		t.Fatalf("victim retry: %d %s", r.code, r.body)
	}
	waitFor(t, "the victim's retried call to run", func() bool { return tn.hitsB.of("job") == 2 })
	tn.await(t, "job", async.StatusFailed)
}

// On a public function an anonymous caller may not choose the call id
// (issue 36): it could take an id the function's owner will use, whose
// submit would then be a duplicate of the attacker's call (and its result,
// readable by id, the attacker's). Both submit paths refuse it; a fresh id
// and a caller with a token are served.
func TestAsyncAttackClaimingAPublicCallID(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, 200)
	addr := tn.ts.URL
	for _, chunked := range []bool{false, true} {
		body := "Content-Length: 1\r\n\r\nx"
		if chunked { // net/http's path
			body = "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"
		}
		resp, got := rawCall(t, addr, "POST /async-function/pub HTTP/1.1\r\nHost: x\r\nX-Call-Id: nightly-report\r\n"+body)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(got, "X-Call-Id") {
			t.Fatalf("an anonymous claim of a call id (chunked %v): %d %s, want 403", chunked, resp.StatusCode, got)
		}
		if resp, _ := rawCall(t, addr, "POST /async-function/pub HTTP/1.1\r\nHost: x\r\n"+body); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("an anonymous submit with a fresh id (chunked %v): %d", chunked, resp.StatusCode)
		}
	}
	if r := as(t, "GET", addr+"/v1/calls/nightly-report", tn.admin, nil, ""); r.code != http.StatusNotFound {
		t.Fatalf("the refused claim left a call: %d %s", r.code, r.body)
	}
	if r := as(t, "POST", addr+"/async-function/pub", tn.admin, http.Header{"X-Call-Id": {"nightly-report"}}, "the owner's"); r.code != http.StatusAccepted {
		t.Fatalf("the owner's submit with its id: %d %s", r.code, r.body)
	}
}

// A refused list says the same of a function that exists and one that
// does not (issue 36: it asked for the admin scope for a function that is
// gone, the invoke scope for another tenant's: an oracle for names).
func TestAsyncAttackListRefusalIsNoNameOracle(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, 200)
	msg := func(fn string) string {
		r := as(t, "GET", tn.ts.URL+"/v1/calls?function="+fn, tn.a, nil, "")
		if r.code != http.StatusForbidden {
			t.Fatalf("list %s with a's token: %d %s, want 403", fn, r.code, r.body)
		}
		return strings.ReplaceAll(r.body, `\"`+fn+`\"`, "FN")
	}
	if b, ghost := msg("b"), msg("ghost"); b != ghost {
		t.Fatalf("the refusals differ:\nb:     %s\nghost: %s", b, ghost)
	}
}

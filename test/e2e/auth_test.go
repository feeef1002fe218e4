package e2e

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
)

// plain is an HTTP client that adds no token (the tests' default transport
// adds a cluster's admin token).
var plain = &http.Client{Transport: &http.Transport{}}

func callWith(t *testing.T, method, url, authz, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := plain.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The admin API refuses every route without a valid token (401), and a
// token's scopes and functions bound what it may do (403); revoked tokens
// stop working at once. The first admin token is in the data dir, readable
// by its owner only.
func TestAdminAPIAuthentication(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	path := filepath.Join(c.dataDir, api.AdminTokenFile)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file %s: %v, mode %v; want 0600", path, err, fi.Mode().Perm())
	}
	base := "http://" + c.admin
	routes := []struct{ method, path, body string }{
		{"GET", "/v1/functions", ""},
		{"POST", "/v1/functions", `{"name": "x", "builtin": "trace"}`},
		{"GET", "/v1/functions/x", ""},
		{"PUT", "/v1/functions/x", `{"builtin": "trace"}`},
		{"DELETE", "/v1/functions/x", ""},
		{"GET", "/v1/status", ""},
		{"GET", "/v1/backup", ""},
		{"GET", "/metrics", ""},
		{"GET", "/v1/tokens", ""},
		{"POST", "/v1/tokens", `{"name": "x", "scopes": ["admin"]}`},
		{"DELETE", "/v1/tokens/abc", ""},
		{"GET", "/v1/secrets", ""},
		{"POST", "/v1/secrets", `{"name": "x", "value": "v"}`},
		{"GET", "/v1/secrets/x", ""},
		{"PUT", "/v1/secrets/x", `{"value": "v"}`},
		{"DELETE", "/v1/secrets/x", ""},
		{"GET", "/v2/unknown", ""},
	}
	forged := "brisk_0123456789abcdef_" + strings.Repeat("A", 43)
	basicForged := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+forged))
	for _, r := range routes {
		for _, authz := range []string{"", "Bearer nonsense", "Bearer " + forged, basicForged} {
			if code := callWith(t, r.method, base+r.path, authz, r.body); code != http.StatusUnauthorized {
				t.Errorf("%s %s with %q: %d, want 401", r.method, r.path, authz, code)
			}
		}
	}
	if code := callWith(t, "GET", base+"/healthz", "", ""); code != 200 {
		t.Fatalf("/healthz without a token: %d, want 200", code)
	}

	// Scoped tokens, made with the CLI (which reads the admin token file).
	deployer := strings.TrimSpace(c.mustBrisk(t, "token", "create", "ci", "--scope", "deploy", "-q"))
	invoker := strings.TrimSpace(c.mustBrisk(t, "token", "create", "caller", "--scope", "invoke", "-q"))
	narrow := strings.TrimSpace(c.mustBrisk(t, "token", "create", "team-a", "--scope", "deploy", "--function", "a1", "-q"))
	bearer := func(tok string) string { return "Bearer " + tok }
	c.mustBrisk(t, "ns", "create", "team-x")
	for _, tc := range []struct {
		name, authz, method, path, body string
		want                            int
	}{
		{"deploy creates", bearer(deployer), "POST", "/v1/functions", `{"name": "d1", "builtin": "trace"}`, 201},
		{"deploy lists", bearer(deployer), "GET", "/v1/functions", "", 200},
		{"deploy cannot make tokens", bearer(deployer), "POST", "/v1/tokens", `{"name": "y", "scopes": ["admin"]}`, 403},
		{"deploy cannot back up", bearer(deployer), "GET", "/v1/backup", "", 403},
		{"invoke cannot deploy", bearer(invoker), "POST", "/v1/functions", `{"name": "i1", "builtin": "trace"}`, 403},
		{"invoke cannot read", bearer(invoker), "GET", "/v1/functions/d1", "", 403},
		// Bound to no namespace, it would plant its name in any tenant's
		// (issue 36).
		{"narrow cannot create its own in a namespace", bearer(narrow), "POST", "/v1/functions", `{"name": "a1", "namespace": "team-x", "builtin": "trace"}`, 403},
		{"narrow creates its own", bearer(narrow), "POST", "/v1/functions", `{"name": "a1", "builtin": "trace"}`, 201},
		{"narrow reads its own", bearer(narrow), "GET", "/v1/functions/a1", "", 200},
		{"narrow cannot read others", bearer(narrow), "GET", "/v1/functions/d1", "", 403},
		{"narrow cannot delete others", bearer(narrow), "DELETE", "/v1/functions/d1", "", 403},
		{"narrow cannot create others", bearer(narrow), "POST", "/v1/functions", `{"name": "b1", "builtin": "trace"}`, 403},
		{"narrow lists (only its own)", bearer(narrow), "GET", "/v1/functions", "", 200},
		{"narrow cannot read the status", bearer(narrow), "GET", "/v1/status", "", 403},
		{"basic auth carries a token", "Basic " + base64.StdEncoding.EncodeToString([]byte("anyone:"+deployer)), "GET", "/v1/status", "", 200},
	} {
		if code := callWith(t, tc.method, base+tc.path, tc.authz, tc.body); code != tc.want {
			t.Errorf("%s: %s %s: %d, want %d", tc.name, tc.method, tc.path, code, tc.want)
		}
	}
	narrowCl := client.New(c.admin, c.invokeAddr)
	narrowCl.Token = narrow
	if fns, err := narrowCl.List(context.Background()); err != nil || len(fns) != 1 || fns[0].Name != "a1" {
		t.Fatalf("the narrow token lists %v (%v), want only a1", fns, err)
	}
	if _, err := c.cl.Get(context.Background(), "b1"); !client.IsNotFound(err) {
		t.Fatalf("a refused create left function b1: %v", err)
	}

	// Revocation is immediate, for open log streams too (issue 36: one
	// kept delivering for 90 s); the list never shows secrets.
	req, err := http.NewRequest(http.MethodGet, base+"/v1/functions/d1/logs?follow=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", bearer(deployer))
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != http.StatusOK {
		t.Fatalf("follow d1's logs: %v %v", stream, err)
	}
	defer stream.Body.Close()
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, stream.Body); ended <- err }()
	toks, err := c.cl.Tokens(context.Background())
	if err != nil || len(toks) != 5 {
		t.Fatalf("tokens: %v %+v, want the admin token, the join token and 3 more", err, toks)
	}
	for _, tk := range toks {
		if tk.Token != "" {
			t.Fatalf("token list shows a secret: %+v", tk)
		}
		if tk.Name == "ci" {
			c.mustBrisk(t, "token", "revoke", tk.ID)
		}
	}
	if code := callWith(t, "GET", base+"/v1/status", bearer(deployer), ""); code != http.StatusUnauthorized {
		t.Fatalf("revoked token: %d, want 401", code)
	}
	select {
	case <-ended:
	case <-time.After(30 * time.Second): // the control plane checks every second
		t.Fatal("a log stream of a revoked token still open after 30 s")
	}
	// The CLI without a token says what to do.
	out, code := c.brisk(t, "fn", "list", "--token-file", filepath.Join(t.TempDir(), "none"))
	if code == 0 || !strings.Contains(out, "authentication required") {
		t.Fatalf("CLI without a token: exit %d:\n%s", code, out)
	}
}

// Functions need an invoke token unless deployed public; the CLI's
// invocations carry the token it has.
func TestInvokeAuthentication(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "private", "--builtin", "trace")
	c.mustBrisk(t, "fn", "deploy", "open", "--builtin", "trace", "--public")
	url := "http://" + c.invokeAddr + "/function/"
	if code := callWith(t, "POST", url+"private", "", `{"ms": 1}`); code != http.StatusUnauthorized {
		t.Fatalf("private function without a token: %d, want 401", code)
	}
	if code := callWith(t, "POST", url+"open", "", `{"ms": 1}`); code != http.StatusOK {
		t.Fatalf("public function without a token: %d, want 200", code)
	}
	caller := strings.TrimSpace(c.mustBrisk(t, "token", "create", "caller", "--scope", "invoke", "--function", "private", "-q"))
	// The data planes learn a new token from the control plane's push: at
	// once, but not before the create's reply.
	testutil.Eventually(t, 10*time.Second, func() bool {
		return callWith(t, "POST", url+"private", "Bearer "+caller, `{"ms": 1}`) == http.StatusOK
	}, "private function with its invoke token: never 200")
	if out := c.mustBrisk(t, "invoke", "private", "--data", `{"ms": 1}`); !strings.Contains(out, `"Status":"OK"`) {
		t.Fatalf("brisk invoke: %s", out)
	}
	if out, code := c.brisk(t, "invoke", "private", "--token", caller[:len(caller)-2]+"xx"); code == 0 || !strings.Contains(out, "unauthorized") {
		t.Fatalf("brisk invoke with a bad token: exit %d: %s", code, out)
	}
}

// Tenants: a token bound to a namespace deploys into it by default, sees
// and calls only its functions, and its namespace's quota bounds what it
// may deploy.
func TestNamespacesAndQuotas(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "ns", "create", "team-a", "--max-functions", "1", "--max-scale", "2", "--max-sandboxes", "1")
	c.mustBrisk(t, "fn", "deploy", "other", "--builtin", "trace") // the default namespace
	team := strings.TrimSpace(c.mustBrisk(t, "token", "create", "team-a", "--scope", "deploy,invoke", "--namespace", "team-a", "-q"))
	if out, code := c.brisk(t, "token", "create", "x", "--scope", "admin", "--namespace", "team-a"); code == 0 {
		t.Fatalf("a namespaced admin token was made:\n%s", out)
	}
	if out, code := c.brisk(t, "fn", "deploy", "x", "--builtin", "trace", "--namespace", "nope"); code == 0 || !strings.Contains(out, "does not exist") {
		t.Fatalf("deploy into a missing namespace: exit %d\n%s", code, out)
	}
	as := func(args ...string) (string, int) { return c.brisk(t, append([]string{"--token", team}, args...)...) }
	c.mustBrisk(t, "secret", "create", "shared", "--from-literal", "default's")
	if out, code := as("secret", "create", "team-secret", "--from-literal", "team's"); code != 0 || !strings.Contains(out, "team-a/team-secret") {
		t.Fatalf("team creates a secret in its namespace: exit %d\n%s", code, out)
	}
	if out, code := as("secret", "list"); code != 0 || !strings.Contains(out, "team-secret") || strings.Contains(out, "shared") {
		t.Fatalf("team's secret list shows other namespaces' secrets or not its own: exit %d\n%s", code, out)
	}
	if out, code := as("fn", "deploy", "mine", "--builtin", "trace", "--max", "2"); code != 0 {
		t.Fatalf("team deploy: %s", out)
	}
	if v := c.fn(t, "mine.team-a"); v.Namespace != "team-a" {
		t.Fatalf("deployed into %q, want the token's namespace team-a", v.Namespace)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fn", "deploy", "second", "--builtin", "trace"}, "functions 2 is above its quota 1"},
		{[]string{"fn", "update", "mine", "--max", "5"}, "scaling.max 5 is above its quota 2"},
		{[]string{"fn", "get", "other"}, "do not allow"},
		{[]string{"fn", "delete", "other"}, "do not allow"},
		{[]string{"fn", "deploy", "sneaky", "--builtin", "trace", "--namespace", "default"}, "do not allow"},
		{[]string{"status"}, "do not allow"},
		{[]string{"ns", "list"}, "do not allow"},
		{[]string{"secret", "create", "x", "--from-literal", "v", "-n", "default"}, "do not allow"},
		{[]string{"secret", "update", "shared", "--from-literal", "v", "-n", "default"}, "do not allow"},
		{[]string{"secret", "remove", "shared", "-n", "default"}, "do not allow"},
		{[]string{"secret", "list", "-n", "default"}, "do not allow"},
		// Another namespace's secret is not there for this one's functions.
		{[]string{"fn", "update", "mine", "--secret", "shared"}, `shared not found in namespace "team-a"`},
	} {
		if out, code := as(tc.args...); code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("brisk %s with the team token: exit %d, want %q:\n%s", strings.Join(tc.args, " "), code, tc.want, out)
		}
	}
	out, code := as("fn", "list")
	if code != 0 || !strings.Contains(out, "mine") || strings.Contains(out, "other") {
		t.Fatalf("team's fn list shows other namespaces' functions or not its own:\n%s", out)
	}
	url := "http://" + c.invokeAddr + "/function/"
	if code := callWith(t, "POST", url+"mine.team-a", "Bearer "+team, `{"ms": 1}`); code != 200 {
		t.Fatalf("team calls its function: %d", code)
	}
	if code := callWith(t, "POST", url+"other", "Bearer "+team, `{"ms": 1}`); code != http.StatusForbidden {
		t.Fatalf("team calls another namespace's function: %d, want 403", code)
	}
	// The sandbox quota: one of team-a's at once.
	eventually(t, 20*time.Second, "team-a at its sandbox quota", func() bool {
		nss, err := c.cl.Namespaces(context.Background())
		if err != nil {
			return false
		}
		for _, n := range nss {
			if n.Name == "team-a" {
				return n.Usage.Sandboxes == 1 && n.Usage.Functions == 1
			}
		}
		return false
	})
	if out, code := c.brisk(t, "ns", "delete", "team-a"); code == 0 || !strings.Contains(out, "still has 1 functions") {
		t.Fatalf("deleting a namespace with functions: exit %d\n%s", code, out)
	}
}

// A function made again under a deleted one's name does not see the
// deleted one's log lines (issue 36). Names are per namespace, so only the
// namespace's own tenant (or an admin) can make the name again.
func TestRecreatedFunctionSeesNoOldLogs(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "ns", "create", "team-b")
	c.mustBrisk(t, "fn", "deploy", "x", "--namespace", "team-b", "--builtin", "watchdog", "--env", "fprocess=cat")
	if inv := c.invoke(t, "x.team-b", "b's data"); inv.status != 200 {
		t.Fatalf("call: %d %s", inv.status, inv.body)
	}
	eventually(t, 30*time.Second, "b's log lines", func() bool {
		return strings.Contains(c.mustBrisk(t, "fn", "logs", "x.team-b"), "Forking fprocess")
	})
	c.mustBrisk(t, "fn", "delete", "x.team-b")
	c.mustBrisk(t, "fn", "deploy", "x", "--namespace", "team-b", "--builtin", "watchdog", "--env", "fprocess=cat")
	if out := c.mustBrisk(t, "fn", "logs", "x.team-b"); strings.TrimSpace(out) != "" {
		t.Fatalf("the new x shows the deleted one's logs:\n%s", out)
	}
}

// Calls still queued for a deleted function never run on a function made
// again under its name (issue 36: they were delivered to the newcomer's
// code with their bodies): they are dead, and the newcomer does not see
// them.
func TestQueuedCallsDieWithTheirFunction(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	c.mustBrisk(t, "ns", "create", "team-b")
	c.mustBrisk(t, "fn", "deploy", "x", "--namespace", "team-b", "--builtin", "trace", "--max", "1", "--async-concurrency", "1", "--public")
	var ids []string
	for range 6 {
		// Long enough that the deletion below comes while five still wait,
		// however slow a loaded machine makes the CLI.
		resp, err := c.hc.Post("http://"+c.invokeAddr+"/async-function/x.team-b", "application/json", strings.NewReader(`{"ms": 4000}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d", resp.StatusCode)
		}
		ids = append(ids, resp.Header.Get("X-Call-Id"))
	}
	eventually(t, 30*time.Second, "the first call running", func() bool {
		rec, err := c.cl.Call(context.Background(), ids[0])
		return err == nil && rec.Status != "queued"
	})
	c.mustBrisk(t, "fn", "delete", "x.team-b")
	c.mustBrisk(t, "fn", "deploy", "x", "--namespace", "team-b", "--builtin", "trace", "--public")
	metrics := "http://" + c.invokeAddr + "/metrics"
	count := func(name string) float64 {
		v, _ := metricSample(t, metrics, name)
		return v
	}
	succeeded := `brisk_async_delivered_total{function="x.team-b",outcome="succeeded"}`
	failed := `brisk_async_delivered_total{function="x.team-b",outcome="failed"}`
	dead := `brisk_async_dead_lettered_total{function="x.team-b"}`
	eventually(t, 60*time.Second, "every call settled", func() bool { return count(succeeded)+count(failed)+count(dead) >= 6 })
	if s := count(succeeded); s > 1 {
		t.Fatalf("%v of the deleted function's queued calls ran (on the new x); only the one running at the deletion may have", s)
	}
	// The newcomer sees none of them.
	if recs, err := c.cl.Calls(context.Background(), "x.team-b", "", 100); err != nil || len(recs) != 0 {
		t.Fatalf("the new x lists %d calls (%v), want none of the deleted one's", len(recs), err)
	}
	if _, err := c.cl.Call(context.Background(), ids[5]); !client.IsNotFound(err) {
		t.Fatalf("a deleted function's call read through the new one: %v, want 404", err)
	}
}

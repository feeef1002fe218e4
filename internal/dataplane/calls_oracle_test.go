package dataplane

// GET /v1/calls/ID and retry tell whether a call exists only to those who
// may read it: every way of asking about another tenant's call id answers
// as for an id nobody holds. (A submit with a client's X-Call-Id held by
// another function's call is still refused with 409: docs/api.md.)

import (
	"fmt"
	"net/http"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/async"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/spec"
)

var sprintf = fmt.Sprintf

// oracleTenants is newTenants with a deploy-only token too.
func oracleTenants(t *testing.T, codeB int) (*tenants, string) {
	e := newAsyncEnv(t, nil, async.Config{})
	ta, ga := newToken(t, []string{auth.ScopeInvoke}, []string{"a"})
	tb, gb := newToken(t, []string{auth.ScopeInvoke}, []string{"b"})
	adm, gadm := newToken(t, []string{auth.ScopeAdmin}, nil)
	dep, gdep := newToken(t, []string{auth.ScopeDeploy}, nil)
	tn := &tenants{asyncEnv: e, a: "Bearer " + ta, b: "Bearer " + tb, admin: "Bearer " + adm, hitsA: &hits{}, hitsB: &hits{}}
	addrA, addrB := tn.hitsA.sandbox(t, 200), tn.hitsB.sandbox(t, codeB)
	priv := func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthToken; s.Async = &briskv1.AsyncPolicy{MaxAttempts: 1} }
	e.d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("a", priv), fnSpec("b", priv), fnSpec("pub", func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthPublic })},
		Added:     []*briskv1.Endpoint{ep("a", "sb-a", addrA), ep("b", "sb-b", addrB), ep("pub", "sb-p", addrA)},
		Auth:      &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{ga, gb, gadm, gdep}}})
	return tn, "Bearer " + dep
}

// The /v1/calls endpoints answer the same for another tenant's call as for
// no call, for every kind of caller.
func TestAsyncAttackCallsNoExistenceOracle(t *testing.T) {
	tn, deployTok := oracleTenants(t, 500) // b's calls fail: one dead letter
	if r := as(t, "POST", tn.ts.URL+"/async-function/b", tn.b, http.Header{"X-Call-Id": {"b-ok"}}, ""); r.code != http.StatusAccepted {
		t.Fatalf("submit: %d %s", r.code, r.body)
	}
	tn.await(t, "b-ok", async.StatusFailed)
	for _, who := range []struct{ name, authz string }{
		{"none", ""}, {"bad", "Bearer nonsense"}, {"a", tn.a}, {"deploy", deployTok},
		{"basic bad", "Basic !!!"}, {"sigv4", "AWS4-HMAC-SHA256 Credential=x"},
	} {
		for _, req := range []struct{ method, path string }{
			{"GET", "/v1/calls/%s"}, {"POST", "/v1/calls/%s/retry"}, {"GET", "/v1/calls/%s/"},
		} {
			known := as(t, req.method, tn.ts.URL+sprintf(req.path, "b-ok"), who.authz, nil, "")
			unknown := as(t, req.method, tn.ts.URL+sprintf(req.path, "nobodys"), who.authz, nil, "")
			if known.code != unknown.code || known.body != unknown.body || known.header.Get("X-Brisk-Error") != unknown.header.Get("X-Brisk-Error") || known.header.Get("WWW-Authenticate") != unknown.header.Get("WWW-Authenticate") {
				t.Errorf("%s %s as %s: b's call %d %q, no call %d %q", req.method, req.path, who.name, known.code, known.body, unknown.code, unknown.body)
			}
		}
	}
}

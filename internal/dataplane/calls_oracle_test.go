package dataplane

// GET /v1/calls/ID and retry tell whether a call exists only to those who
// may read it: every way of asking about another tenant's call id answers
// as for an id nobody holds. (A submit with a client's X-Call-Id held by
// another function's call is still refused with 409: docs/api.md.)

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/brisk-faas/brisk/internal/async"
)

// The /v1/calls endpoints answer the same for another tenant's call as for
// no call, for every kind of caller.
func TestAsyncAttackCallsNoExistenceOracle(t *testing.T) {
	tn := newTenants(t, nil, async.Config{}, 500) // b's calls fail: one dead letter
	deployTok := tn.deploy
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
			known := as(t, req.method, tn.ts.URL+fmt.Sprintf(req.path, "b-ok"), who.authz, nil, "")
			unknown := as(t, req.method, tn.ts.URL+fmt.Sprintf(req.path, "nobodys"), who.authz, nil, "")
			if known.code != unknown.code || known.body != unknown.body || known.header.Get("X-Brisk-Error") != unknown.header.Get("X-Brisk-Error") || known.header.Get("WWW-Authenticate") != unknown.header.Get("WWW-Authenticate") {
				t.Errorf("%s %s as %s: b's call %d %q, no call %d %q", req.method, req.path, who.name, known.code, known.body, unknown.code, unknown.body)
			}
		}
	}
}

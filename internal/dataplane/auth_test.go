package dataplane

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func grantOf(g auth.Grant) *briskv1.TokenGrant {
	return &briskv1.TokenGrant{Id: g.ID, Hash: g.Hash, Scopes: g.Scopes, Functions: g.Functions, Namespace: g.Namespace}
}

func newToken(t *testing.T, scopes, fns []string) (string, *briskv1.TokenGrant) {
	t.Helper()
	tok, g, err := auth.New(scopes, fns, "")
	if err != nil {
		t.Fatal(err)
	}
	return tok, grantOf(g)
}

// callAs calls url with an Authorization value (none when empty), through
// the front end or, chunked, the net/http path.
func callAs(t *testing.T, url, authz string, chunked bool) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if chunked {
		req.ContentLength = -1
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	return do(t, req)
}

// A function that needs a token is called only with an invoke token for
// it (or an admin token), on both paths; the token never reaches the
// function; a public function gets the caller's Authorization for its own
// use; a revoked token stops at once.
func TestInvokeAuth(t *testing.T) {
	d, srv := newTestDP(t, nil)
	var seenAuthz = make(chan string, 100)
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		seenAuthz <- r.Header.Get("Authorization")
		_, _ = w.Write([]byte("ok"))
	})
	invoke, gi := newToken(t, []string{auth.ScopeInvoke}, nil)
	narrow, gn := newToken(t, []string{auth.ScopeInvoke}, []string{"other"})
	deploy, gd := newToken(t, []string{auth.ScopeDeploy}, nil)
	admin, ga := newToken(t, []string{auth.ScopeAdmin}, nil)
	priv := func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthToken }
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("f", priv), fnSpec("pub", func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthPublic })},
		Added:     []*briskv1.Endpoint{ep("f", "sb-1", addr), ep("pub", "sb-2", addr)},
		Auth:      &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{gi, gn, gd, ga}}})
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+invoke))
	for _, chunked := range []bool{false, true} {
		for _, tc := range []struct {
			name, authz string
			code        int
			reason      string
		}{
			{"no token", "", 401, "unauthorized"},
			{"garbage", "Bearer nope", 401, "unauthorized"},
			{"other scheme", "Digest x", 401, "unauthorized"},
			{"another function's token", "Bearer " + narrow, 403, "forbidden"},
			{"a deploy token", "Bearer " + deploy, 403, "forbidden"},
			{"invoke token", "Bearer " + invoke, 200, ""},
			{"lower-case scheme", "bearer " + invoke, 200, ""},
			{"basic auth password", basic, 200, ""},
			{"admin token", "Bearer " + admin, 200, ""},
		} {
			r := callAs(t, srv.URL+"/function/f", tc.authz, chunked)
			if tc.code != 200 {
				wantReason(t, r, tc.code, tc.reason, `function "f"`)
				if tc.code == 401 && r.header.Get("WWW-Authenticate") == "" {
					t.Errorf("%s: 401 without WWW-Authenticate", tc.name)
				}
				continue
			}
			if r.code != 200 {
				t.Fatalf("chunked %v, %s: %d %s", chunked, tc.name, r.code, r.body)
			}
			if got := recv(t, seenAuthz, "the call"); got != "" {
				t.Fatalf("chunked %v, %s: the function saw the platform's token %q", chunked, tc.name, got)
			}
		}
		if r := callAs(t, srv.URL+"/function/pub", "Bearer its-own", chunked); r.code != 200 {
			t.Fatalf("public function: %d %s", r.code, r.body)
		}
		if got := recv(t, seenAuthz, "the public call"); got != "Bearer its-own" {
			t.Fatalf("public function saw Authorization %q, want the caller's own", got)
		}
	}
	// Revoked: the next grant set lacks it.
	d.Apply(&briskv1.EndpointBatch{Auth: &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{ga}}})
	wantReason(t, callAs(t, srv.URL+"/function/f", "Bearer "+invoke, false), 401, "unauthorized", "invalid or revoked")
	// Auth off on the control plane: everything is public, headers pass.
	d.Apply(&briskv1.EndpointBatch{Auth: &briskv1.AuthConfig{Enabled: false}})
	if r := callAs(t, srv.URL+"/function/f", "Bearer fn-own", false); r.code != 200 {
		t.Fatalf("auth off: %d %s", r.code, r.body)
	}
	if got := recv(t, seenAuthz, "the call"); got != "Bearer fn-own" {
		t.Fatalf("auth off: the function saw %q", got)
	}
}

// A token bound to a namespace calls only that namespace's functions.
func TestInvokeAuthNamespaces(t *testing.T) {
	d, srv := newTestDP(t, nil)
	addr := newSandbox(t, hello)
	tok, g, err := auth.New([]string{auth.ScopeInvoke}, nil, "team")
	if err != nil {
		t.Fatal(err)
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{
			fnSpec("mine", func(s *briskv1.FunctionSpec) { s.Auth, s.Namespace = spec.AuthToken, "team" }),
			fnSpec("theirs", func(s *briskv1.FunctionSpec) { s.Auth = spec.AuthToken }), // namespace "" = default
		},
		Added: []*briskv1.Endpoint{ep("mine", "sb-1", addr), ep("theirs", "sb-2", addr)},
		Auth:  &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{grantOf(g)}}})
	for _, chunked := range []bool{false, true} {
		if r := callAs(t, srv.URL+"/function/mine", "Bearer "+tok, chunked); r.code != 200 {
			t.Fatalf("its own namespace's function: %d %s", r.code, r.body)
		}
		wantReason(t, callAs(t, srv.URL+"/function/theirs", "Bearer "+tok, chunked), 403, "forbidden", `function "theirs"`)
	}
}

// While auth is on, the data plane's /metrics is for admin tokens.
func TestMetricsNeedAnAdminToken(t *testing.T) {
	d, srv := newTestDP(t, nil)
	admin, ga := newToken(t, []string{auth.ScopeAdmin}, nil)
	invoke, gi := newToken(t, []string{auth.ScopeInvoke}, nil)
	get := func(authz string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		return do(t, req).code
	}
	if code := get(""); code != 200 {
		t.Fatalf("auth off: %d", code)
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Auth: &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{ga, gi}}})
	for authz, want := range map[string]int{"": 401, "Bearer " + invoke: 403, "Bearer " + admin: 200} {
		if code := get(authz); code != want {
			t.Errorf("/metrics with %.20q: %d, want %d", authz, code, want)
		}
	}
}

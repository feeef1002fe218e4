package dataplane

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Names are per namespace (spec.Qualify): a path or Host that names
// NAME.NAMESPACE reaches that function, not another namespace's NAME; the
// OpenFaaS default namespace and functions with bare names in a namespace
// (made before names were per namespace) are still reached by their
// suffixed form. Both the front end's fast path and the net/http path
// (a chunked body) route alike.
func TestNamesPerNamespace(t *testing.T) {
	d, srv := newTestDP(t, nil)
	named := func(id string) string {
		return newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, id)
		})
	}
	inNS := func(ns string) func(*briskv1.FunctionSpec) {
		return func(s *briskv1.FunctionSpec) { s.Namespace = ns }
	}
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("x"), fnSpec("x.team-a", inNS("team-a")), fnSpec("y", inNS("team-b")),
			fnSpec("other.team-c", inNS("team-c"))},
		Added: []*briskv1.Endpoint{ep("x", "default-x", named("default-x")), ep("x.team-a", "team-a-x", named("team-a-x")),
			ep("y", "legacy-y", named("legacy-y"))}})

	for _, tc := range []struct{ host, path, want string }{
		{"", "/function/x", "default-x"},
		{"", "/function/x.team-a", "team-a-x"},
		{"", "/function/x.team-a/sub", "team-a-x"},
		{"", "/function/x.openfaas-fn", "default-x"},
		{"", "/function/x.default", "default-x"},
		{"", "/function/x.team-b", "404"}, // not the default namespace's x
		{"", "/function/y.team-b", "legacy-y"},
		{"", "/function/y", "legacy-y"},
		{"", "/function/y.team-a", "404"},
		{"x.team-a.example.com", "/", "team-a-x"},
		{"X.Team-A.example.com:8080", "/", "team-a-x"},
		{"x.default.example.com", "/", "default-x"},
		{"x.example.com", "/", "default-x"},
		{"x:8080", "/", "default-x"},
		// A namespace's Host never reaches another namespace's function:
		// team-c has no x (its calls and tokens must not go to default's),
		// team-a no y (nor to team-b's bare-named one).
		{"x.team-c.brisk.local", "/", "404"},
		{"y.team-a.brisk.local", "/", "404"},
		{"y.team-b.brisk.local", "/", "legacy-y"},
	} {
		for _, chunked := range []bool{false, true} {
			var body io.Reader = strings.NewReader("{}")
			if chunked {
				body = io.MultiReader(strings.NewReader("{"), strings.NewReader("}")) // no length: chunked
			}
			req, err := http.NewRequest(http.MethodPost, srv.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			r := do(t, req)
			got := r.body
			if r.code == http.StatusNotFound {
				got = "404"
			} else if r.code != http.StatusOK {
				got = http.StatusText(r.code) + ": " + r.body
			}
			if got != tc.want {
				t.Errorf("Host %q %s (chunked %v): reached %q, want %q", tc.host, tc.path, chunked, got, tc.want)
			}
		}
	}
}

// A token bound to one namespace gets the same 403 for another
// namespace's function whether it exists or not (a 404 for the absent one
// told a tenant which names another had).
func TestOtherNamespacesNamesDoNotLeak(t *testing.T) {
	d, srv := newTestDP(t, nil)
	tok, g, err := auth.New([]string{auth.ScopeInvoke}, nil, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	priv := func(s *briskv1.FunctionSpec) { s.Namespace, s.Auth = "team-a", spec.AuthToken }
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("x.team-a", priv)},
		Added:     []*briskv1.Endpoint{ep("x.team-a", "sb-1", newSandbox(t, echo))},
		Auth:      &briskv1.AuthConfig{Enabled: true, Tokens: []*briskv1.TokenGrant{grantOf(g)}}})
	answer := func(name string, chunked bool) string {
		r := callAs(t, srv.URL+"/function/"+name, "Bearer "+tok, chunked)
		return strconv.Itoa(r.code) + " " + strings.ReplaceAll(r.body, name, "NAME")
	}
	for _, chunked := range []bool{false, true} {
		there, absent := answer("x.team-a", chunked), answer("nope.team-a", chunked)
		if there != absent || !strings.HasPrefix(there, "403") {
			t.Errorf("chunked %v: x.team-a: %s; nope.team-a: %s; want one 403", chunked, there, absent)
		}
	}
}

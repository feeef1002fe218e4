package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/admin"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Function names are per namespace (issue 36): two tenants deploy "x"
// each (x.team-a and x.team-b), and a refused create or read tells a
// tenant nothing about another namespace's names. Before, the second
// tenant's create got 409 "already exists": an oracle for every name.
func TestNamesArePerNamespace(t *testing.T) {
	adm, token := tenantCP(t, "team-a", "team-b")
	ctx := context.Background()
	ta := token(api.TokenRequest{Name: "a", Scopes: []string{auth.ScopeDeploy}, Namespace: "team-a"})
	tb := token(api.TokenRequest{Name: "b", Scopes: []string{auth.ScopeDeploy}, Namespace: "team-b"})
	status := func(err error) int {
		var e *client.Error
		if errors.As(err, &e) {
			return e.Status
		}
		if err == nil {
			return 200
		}
		return -1
	}
	x := func() *spec.Function { return &spec.Function{Name: "x", Builtin: "trace"} }

	if f, err := ta.Create(ctx, x()); err != nil || f.Name != "x.team-a" || f.Namespace != "team-a" {
		t.Fatalf("team-a's x: %+v %v, want x.team-a", f, err)
	}
	if f, err := tb.Create(ctx, x()); err != nil || f.Name != "x.team-b" {
		t.Fatalf("team-b's x while team-a has one: %+v %v, want x.team-b (409 was the oracle)", f, err)
	}
	if _, err := tb.Create(ctx, x()); status(err) != http.StatusConflict {
		t.Errorf("team-b's x again: %v, want 409 (its own)", err)
	}
	// Each tenant reaches its own x by the name it deployed it under.
	for tok, want := range map[*client.Client]string{ta: "x.team-a", tb: "x.team-b"} {
		if v, err := tok.Get(ctx, "x"); err != nil || v.Name != want {
			t.Errorf("Get x: %+v %v, want %s", v, err, want)
		}
	}
	// Another namespace's function and a name nobody has answer alike.
	for _, name := range []string{"x.team-a", "nope.team-a"} {
		if _, err := tb.Get(ctx, name); status(err) != http.StatusForbidden {
			t.Errorf("team-b reads %s: %v, want 403", name, err)
		}
	}
	for _, name := range []string{"x.team-a", "nope.team-a"} {
		if _, err := tb.Create(ctx, &spec.Function{Name: name, Builtin: "trace"}); status(err) != http.StatusForbidden {
			t.Errorf("team-b creates %s: %v, want 403", name, err)
		}
	}
	// The admin names them in full, or with ?namespace=.
	if _, err := adm.Get(ctx, "x"); status(err) != http.StatusNotFound {
		t.Errorf("admin reads bare x: %v, want 404 (there is none in the default namespace)", err)
	}
	if v, err := adm.Get(ctx, "x.team-b"); err != nil || v.Namespace != "team-b" {
		t.Errorf("admin reads x.team-b: %+v %v", v, err)
	}
	// An update keeps the full name, whichever form the body uses.
	if f, err := tb.Update(ctx, &spec.Function{Name: "x", Builtin: "trace", Env: map[string]string{"V": "2"}}); err != nil || f.Name != "x.team-b" {
		t.Errorf("team-b updates x: %+v %v", f, err)
	}
	// A token limited to function x of team-a acts on x.team-a.
	fx := token(api.TokenRequest{Name: "fx", Scopes: []string{auth.ScopeDeploy}, Functions: []string{"x"}, Namespace: "team-a"})
	if v, err := fx.Get(ctx, "x"); err != nil || v.Name != "x.team-a" {
		t.Errorf("function-limited token reads x: %+v %v", v, err)
	}
	if err := tb.Delete(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Get(ctx, "x"); err != nil {
		t.Errorf("team-b's delete of x took team-a's: %v", err)
	}
}

// tenantCP runs a control plane with the given namespaces and returns an
// admin client and a func that makes a token and a client for it.
func tenantCP(t *testing.T, namespaces ...string) (adm *client.Client, token func(api.TokenRequest) *client.Client) {
	t.Helper()
	admin, _, _ := auth.New([]string{auth.ScopeAdmin}, nil, "")
	cp, _ := runCP(t, Config{DataDir: t.TempDir(), AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		BootstrapAdminToken: admin, StartupGrace: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	as := func(tok string) *client.Client {
		c := client.New("http://"+cp.AdminAddr(), "")
		c.Token = tok
		return c
	}
	adm = as(admin)
	for _, ns := range namespaces {
		if _, err := adm.PutNamespace(context.Background(), ns, spec.Quota{}); err != nil {
			t.Fatal(err)
		}
	}
	return adm, func(req api.TokenRequest) *client.Client {
		t.Helper()
		v, err := adm.CreateToken(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return as(v.Token)
	}
}

// A function made before names were per namespace keeps its bare name, and
// its tenant reaches it by it; another tenant's refusal is the same as for
// a name nobody has (the legacy rule would otherwise echo the bare name).
func TestLegacyBareNames(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := st.PutNamespace(&store.Namespace{Name: ns}); err != nil {
			t.Fatal(err)
		}
	}
	legacy := &spec.Function{Name: "legacy", Namespace: "team-a", Builtin: "trace", UID: "0123456789abcdef0123456789abcdef", Revision: 1, Generation: 1}
	legacy.ApplyDefaults()
	if _, err := st.CreateFunction(legacy); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	cp, _ := runCP(t, Config{DataDir: dir, AdminAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		StartupGrace: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	admin, err := admin.ReadAdminToken(dir) // a used registry: the token written, not a given one
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	as := func(tok string) *client.Client {
		c := client.New("http://"+cp.AdminAddr(), "")
		c.Token = tok
		return c
	}
	adm := as(admin)
	token := func(ns string) *client.Client {
		v, err := adm.CreateToken(ctx, api.TokenRequest{Name: ns, Scopes: []string{auth.ScopeDeploy}, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		return as(v.Token)
	}
	ta, tb := token("team-a"), token("team-b")
	if v, err := ta.Get(ctx, "legacy"); err != nil || v.Name != "legacy" {
		t.Fatalf("team-a reads its legacy function: %+v %v", v, err)
	}
	refusal := func(name string) string {
		_, err := tb.Get(ctx, name+"?namespace=team-a")
		var e *client.Error
		if !errors.As(err, &e) || e.Status != http.StatusForbidden {
			t.Fatalf("team-b reads %s of team-a: %v, want 403", name, err)
		}
		return strings.ReplaceAll(e.Message, name, "NAME")
	}
	if a, b := refusal("legacy"), refusal("nothing"); a != b {
		t.Fatalf("the refusals differ:\nlegacy:  %s\nnothing: %s", a, b)
	}
}

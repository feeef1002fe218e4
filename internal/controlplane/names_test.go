package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
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

package controlplane

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestReservedLabels: labels under brisk.dev/ (the Function controller's
// mark of ownership) are set, changed and removed only by a token with
// deploy on every namespace; a token limited to a namespace or to
// functions may keep them as they are, but not forge them.
func TestReservedLabels(t *testing.T) {
	adm, token := tenantCP(t, "team-a")
	ctx := context.Background()
	tenant := token(api.TokenRequest{Name: "tenant", Scopes: []string{auth.ScopeDeploy}, Namespace: "team-a"})
	controller := token(api.TokenRequest{Name: "controller", Scopes: []string{auth.ScopeDeploy}})
	forbidden := func(what string, err error) {
		t.Helper()
		var e *client.Error
		if err == nil || !strings.Contains(err.Error(), "brisk.dev/kubernetes-function") {
			t.Errorf("%s: %v, want refused naming the label", what, err)
		} else if !errors.As(err, &e) || e.Status != http.StatusForbidden {
			t.Errorf("%s: %v, want 403", what, err)
		}
	}
	fn := func(name string, labels map[string]string) *spec.Function {
		return &spec.Function{Name: name, Namespace: "team-a", Builtin: "trace", Labels: labels}
	}
	mark := map[string]string{"brisk.dev/kubernetes-function": "team-a/x", "app": "a"}

	// The limited token cannot forge the mark, on a new function or its own.
	_, err := tenant.Create(ctx, fn("spoof", mark))
	forbidden("create with the mark by a namespace token", err)
	if _, err := tenant.Create(ctx, fn("spoof", map[string]string{"app": "a"})); err != nil {
		t.Fatal(err)
	}
	_, err = tenant.Update(ctx, fn("spoof", mark))
	forbidden("update adding the mark by a namespace token", err)
	// Other labels, brisk.dev-like but not under brisk.dev/, are its own.
	if _, err := tenant.Update(ctx, fn("spoof", map[string]string{"openfaas.brisk.dev/x": "1"})); err != nil {
		t.Errorf("a label outside brisk.dev/: %v", err)
	}

	// The controller's token (deploy, unlimited) sets it; the limited
	// token may then update the function keeping it, not change or drop it.
	if _, err := controller.Create(ctx, fn("x", mark)); err != nil {
		t.Fatalf("create with the mark by an unlimited deploy token: %v", err)
	}
	if _, err := tenant.Update(ctx, fn("x", map[string]string{"brisk.dev/kubernetes-function": "team-a/x", "app": "b"})); err != nil {
		t.Errorf("update keeping the mark: %v", err)
	}
	_, err = tenant.Update(ctx, fn("x", map[string]string{"brisk.dev/kubernetes-function": "team-a/y"}))
	forbidden("update changing the mark", err)
	_, err = tenant.Update(ctx, fn("x", nil))
	forbidden("update dropping the mark", err)
	// Nor through a rollback to a revision that had it otherwise.
	if _, err := controller.Update(ctx, fn("x", map[string]string{"brisk.dev/kubernetes-function": "team-a/z"})); err != nil {
		t.Fatal(err)
	}
	_, err = tenant.Rollback(ctx, "x", 0)
	forbidden("rollback to another mark", err)
	if v, err := adm.Get(ctx, "x.team-a"); err != nil || v.Labels["brisk.dev/kubernetes-function"] != "team-a/z" {
		t.Errorf("x after the refusals: %v %v", v, err)
	}
	if _, err := adm.Update(ctx, fn("x", nil)); err != nil {
		t.Errorf("an admin drops the mark: %v", err)
	}
}

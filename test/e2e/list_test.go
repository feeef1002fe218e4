package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/pkg/client"
)

// Function lists page (limit + continue token, as Kubernetes does) and
// filter by namespace, label and status, through the API, the SDK and the
// CLI.
func TestFunctionListPagesAndFilters(t *testing.T) {
	c := newCluster(t)
	c.up(t)
	ctx := context.Background()
	c.mustBrisk(t, "ns", "create", "team-a")
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("f%d", i)
		args := []string{"fn", "deploy", name, "--builtin", "trace"}
		if i%2 == 0 {
			args = append(args, "--namespace", "team-a")
			name += ".team-a" // its full name (names are per namespace)
		}
		c.mustBrisk(t, args...)
		want = append(want, name)
	}
	for _, name := range []string{"f1", "f2.team-a"} {
		v := c.fn(t, name)
		v.Labels = map[string]string{"tier": "web"}
		if name == "f2.team-a" {
			v.Labels["canary"] = "yes"
		}
		if _, err := c.cl.Update(ctx, v.Function); err != nil {
			t.Fatal(err)
		}
	}

	var got []string
	pages := 0
	for opts := (client.ListOptions{Limit: 3}); ; pages++ {
		fns, next, err := c.cl.ListPage(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(fns) > 3 {
			t.Fatalf("a page of %d, limit 3", len(fns))
		}
		for _, f := range fns {
			got = append(got, f.Name)
		}
		if next == "" {
			break
		}
		opts.Continue = next
	}
	if !slices.Equal(got, want) || pages != 2 {
		t.Fatalf("pages gave %v in %d continues, want %v in 2", got, pages, want)
	}
	names := func(opts client.ListOptions) []string {
		t.Helper()
		fns, next, err := c.cl.ListPage(ctx, opts)
		if err != nil || next != "" {
			t.Fatalf("list %+v: %v (next %q)", opts, err, next)
		}
		var out []string
		for _, f := range fns {
			out = append(out, f.Name)
		}
		return out
	}
	for _, tc := range []struct {
		opts client.ListOptions
		want []string
	}{
		{client.ListOptions{Namespace: "team-a"}, []string{"f0.team-a", "f2.team-a", "f4.team-a", "f6.team-a"}},
		{client.ListOptions{Labels: "tier=web"}, []string{"f1", "f2.team-a"}},
		{client.ListOptions{Labels: "tier=web,canary"}, []string{"f2.team-a"}},
		{client.ListOptions{Labels: "tier=db"}, nil},
		{client.ListOptions{Namespace: "team-a", Labels: "tier"}, []string{"f2.team-a"}},
		{client.ListOptions{Status: "scaled-to-zero"}, want},
		{client.ListOptions{Status: "function-failing"}, nil},
		{client.ListOptions{Status: "ok", Namespace: "default"}, []string{"f1", "f3", "f5"}},
	} {
		if got := names(tc.opts); !slices.Equal(got, tc.want) {
			t.Errorf("list %+v = %v, want %v", tc.opts, got, tc.want)
		}
	}
	for _, q := range []string{"status=sleepy", "limit=0", "limit=x", "continue=!!", "label=,"} {
		code := callWith(t, "GET", "http://"+c.admin+"/v1/functions?"+q, "Bearer "+adminToken(c.admin), "")
		if code != 400 {
			t.Errorf("GET /v1/functions?%s: %d, want 400", q, code)
		}
	}
	out := c.mustBrisk(t, "fn", "list", "--limit", "2")
	if !strings.Contains(out, "f0") || !strings.Contains(out, "f1") || strings.Contains(out, "f2") || !strings.Contains(out, "more: brisk fn list --limit 2 --continue ") {
		t.Fatalf("fn list --limit 2:\n%s", out)
	}
	if out := c.mustBrisk(t, "fn", "list", "-l", "tier=web", "--namespace", "default"); !strings.Contains(out, "f1") || strings.Contains(out, "f2") {
		t.Fatalf("fn list -l tier=web --namespace default:\n%s", out)
	}
}

package reconciler

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/internal/policy/templateset"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// offers are the nodes cmds offer fn's spec to.
func offers(cmds []Command, fn string) []string {
	var out []string
	for _, c := range cmds {
		if o, ok := c.(Offer); ok && o.Spec.Name == fn {
			out = append(out, o.Node)
		}
	}
	slices.Sort(out)
	return out
}

// A function from source is offered, at deploy, to the fraction of the
// live nodes that holds its template (templateset's choice, the one the
// simulator makes), and to every node by default; a node joining later is
// offered it only when it is among them; a dual-mode function goes to
// every node whatever the fraction.
func TestFunctionsFromSourceAreOfferedToTheirTemplateNodes(t *testing.T) {
	ids := make([]string, 8)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%d", i)
	}
	for _, frac := range []float64{0, 0.25, 0.5} {
		r, err := New(Config{Autoscale: autoscale.DefaultConfig(), NodeGrace: 10 * time.Second, FailureBackoff: time.Second,
			MaxFailureBackoff: time.Minute, Seed: 1, IDPrefix: "t", TemplateFraction: frac})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_000_000, 0)
		for _, id := range ids[:7] {
			r.Step(now, RegisterNode{Worker: &nodes.Worker{ID: id, Address: "127.0.0.1:1", Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 8192}}})
			r.Step(now, SessionUp{Node: id})
		}
		src := &spec.Function{Name: "py", Revision: 1, Command: []string{"python3"}, Concurrency: 1,
			Code: &spec.Code{Language: spec.LangPython, Handler: "app.handler", Digest: "sha256:00"}}
		got := offers(r.Step(now, UpsertFunction{Spec: src}), "py")
		var want []string
		f := frac
		if f == 0 {
			f = 1
		}
		for _, i := range templateset.Nodes("py", ids[:7], f) {
			want = append(want, ids[i])
		}
		if !slices.Equal(got, want) || len(want) != templateset.Count(f, 7) {
			t.Fatalf("fraction %v: offered to %v, want %v", frac, got, want)
		}
		dual := &spec.Function{Name: "d", Revision: 1, Builtin: "echo", Concurrency: 1, Scaling: spec.Scaling{Mode: spec.ModeDual}}
		if got := offers(r.Step(now, UpsertFunction{Spec: dual}), "d"); len(got) != 7 {
			t.Fatalf("fraction %v: a dual-mode function offered to %v, want all 7", frac, got)
		}
		// An eighth node: offered py only if it is now among py's nodes.
		r.Step(now, RegisterNode{Worker: &nodes.Worker{ID: ids[7], Address: "127.0.0.1:1", Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 8192}}})
		joined := offers(r.Step(now, SessionUp{Node: ids[7]}), "py")
		holds := slices.Contains(templateset.Nodes("py", ids, f), 7)
		if (len(joined) == 1) != holds {
			t.Fatalf("fraction %v: a joining node offered py %v; holds its template: %v", frac, joined, holds)
		}
	}
}

package sim

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/policy/templateset"
	"github.com/brisk-faas/brisk/internal/workload"
)

// traceSample is the first minutes of traces/azure_100 (the first one
// warm-up), as brisk sim draws it with seed 42.
func traceSample(t *testing.T, minutes int) *workload.Schedule {
	t.Helper()
	tr, err := workload.LoadTrace("../../traces/azure_100", workload.TraceOptions{Columns: minutes})
	if err != nil {
		t.Fatal(err)
	}
	s, err := workload.BuildSchedule(tr, workload.ScheduleConfig{Seed: 42, IAT: workload.Exponential, Granularity: workload.Minute, WarmupColumns: 1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func simNodeIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = nodeID(i)
	}
	return ids
}

// The simulator's per-function cut agrees with templateset.Nodes.
func TestTemplatesHoldsMatchTemplateNodes(t *testing.T) {
	for _, frac := range []float64{0.01, 0.1, 0.33, 0.9} {
		var nodes []*node
		for i := range 50 {
			nodes = append(nodes, &node{id: nodeID(i), idx: i})
		}
		tm := newTemplates(nodes, frac)
		for f := range 50 {
			fn := &function{name: fmt.Sprintf("trace-fn-%d", f)}
			want := templateset.Nodes(fn.name, simNodeIDs(50), frac)
			var got []int
			for _, n := range nodes {
				if tm.holds(fn, n) {
					got = append(got, n.idx)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("fraction %g, %s: simulator holds on %v, TemplateNodes %v", frac, fn.name, got, want)
			}
		}
	}
}

// Fraction 0 is the simulator without templates: the same records, events
// and sandboxes for the same seed, whatever TemplateStart says.
func TestTemplateFractionZeroIsUnchanged(t *testing.T) {
	s := traceSample(t, 3)
	for _, base := range []Config{
		{Nodes: 10, Seed: 7, Placement: "ch-rlu"},
		{Nodes: 10, Seed: 7, ScalingMode: "dual", KeepAlivePolicy: "ttl", StableWindow: 6 * time.Second},
	} {
		a, err := Run(s, base)
		if err != nil {
			t.Fatal(err)
		}
		with := base
		with.TemplateFraction, with.TemplateStart = 0, 5*time.Millisecond
		observed := false
		with.OnResult = func(*Result) { observed = true }
		b, err := Run(s, with)
		if err != nil {
			t.Fatal(err)
		}
		if !observed {
			t.Fatal("OnResult was not called")
		}
		if b.TemplateStarts != 0 || b.EmergencyTemplateStarts != 0 || b.TemplateNodes != 0 {
			t.Fatalf("fraction 0: %d template starts, %d emergency, %d nodes", b.TemplateStarts, b.EmergencyTemplateStarts, b.TemplateNodes)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: fraction 0 changed the run: %d/%d records, %d/%d sandboxes, %d/%d events", base.ScalingMode,
				len(a.Records), len(b.Records), a.SandboxesCreated, b.SandboxesCreated, a.Events, b.Events)
		}
	}
}

// Fraction 1: every creation forks a template and starts in TemplateStart,
// emergency sandboxes included.
func TestTemplateFractionOne(t *testing.T) {
	res, err := Run(traceSample(t, 3), Config{Nodes: 10, Seed: 1, ColdStart: 150 * time.Millisecond, TemplateFraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.SandboxesCreated == 0 || res.TemplateStarts != res.SandboxesCreated || res.TemplateNodes != 10 {
		t.Fatalf("%d template starts of %d creations on %d template nodes; want all, on 10", res.TemplateStarts, res.SandboxesCreated, res.TemplateNodes)
	}

	// One function: the first call waits for its sandbox, 5 ms (the
	// default) from a template against 150 ms without.
	first := func(frac float64) int64 {
		res, err := Run(schedule(5, time.Second, 100), Config{Nodes: 4, Seed: 1, ColdStart: 150 * time.Millisecond, TemplateFraction: frac})
		if err != nil {
			t.Fatal(err)
		}
		if res.SandboxesCreated != 1 || !res.Records[0].Cold {
			t.Fatalf("fraction %g: %d sandboxes, first call %+v", frac, res.SandboxesCreated, res.Records[0])
		}
		return res.Records[0].ResponseUs
	}
	if got, want := first(1), int64(105_000); got != want {
		t.Fatalf("from a template: the first call took %d µs, want %d", got, want)
	}
	if got, want := first(0), int64(250_000); got != want {
		t.Fatalf("without templates: the first call took %d µs, want %d", got, want)
	}

	// Dual: emergency sandboxes fork the template too (7 ms here, against
	// the 10 ms EmergencyStart).
	cfg := Config{Nodes: 2, Seed: 1, ScalingMode: "dual", ColdStart: 500 * time.Millisecond, StableWindow: 6 * time.Second,
		KeepAlivePolicy: "ttl", TemplateFraction: 1, TemplateStart: 7 * time.Millisecond}
	res, err = Run(schedule(10, 2*time.Minute, 100), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.EmergencyCalls != 10 || res.EmergencyTemplateStarts != 10 {
		t.Fatalf("%d emergency calls, %d from a template; want 10 and 10", res.EmergencyCalls, res.EmergencyTemplateStarts)
	}
	for _, r := range res.Records {
		if r.Sandbox[:3] != "ei-" || r.ResponseUs != 107_000 {
			t.Fatalf("emergency call %+v: want 100 ms of work after a 7 ms template start", r)
		}
	}
}

// The question the option answers: from no templates to templates
// everywhere, on a trace sample with a 150 ms fresh start, more template
// nodes never make the slowdown worse, and the hit rate grows.
func TestTemplateSlowdownImprovesWithFraction(t *testing.T) {
	s := traceSample(t, 4)
	var prevSlow, prevHit, slow0 float64
	for i, frac := range []float64{0, 0.1, 0.25, 0.5, 1} {
		res, err := Run(s, Config{Nodes: 20, Seed: 42, ColdStart: 150 * time.Millisecond, CachedColdStart: 150 * time.Millisecond,
			TemplateFraction: frac})
		if err != nil {
			t.Fatal(err)
		}
		sd, _ := workload.Slowdowns(res.Records, workload.SlowdownOptions{})
		hit := float64(res.TemplateStarts) / float64(res.SandboxesCreated)
		t.Logf("fraction %.2f: slowdown gmean p99 %.4f, %d sandboxes, template hit rate %.3f", frac, sd.GeomeanP99, res.SandboxesCreated, hit)
		if i > 0 && (sd.GeomeanP99 > prevSlow || hit < prevHit) {
			t.Fatalf("fraction %g: slowdown %.4f (was %.4f), hit rate %.3f (was %.3f): more templates made it worse",
				frac, sd.GeomeanP99, prevSlow, hit, prevHit)
		}
		switch frac {
		case 0:
			slow0 = sd.GeomeanP99
			if hit != 0 {
				t.Fatalf("fraction 0: hit rate %g", hit)
			}
		case 1: // and a clear gain, not a tie
			if hit != 1 || sd.GeomeanP99 > 0.9*slow0 {
				t.Fatalf("fraction 1: hit rate %g, slowdown %.4f against %.4f without templates", hit, sd.GeomeanP99, slow0)
			}
		}
		prevSlow, prevHit = sd.GeomeanP99, hit
	}
}

package controlplane

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

type dtoCounter struct{ dto.Metric }

// gaugesOf returns the metric family's value per function label.
func gaugesOf(t *testing.T, e *env, family string) map[string]float64 {
	t.Helper()
	mfs, err := e.cp.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[labelOf(m, "function")] = m.GetGauge().GetValue()
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Each function's autoscaler state is exported at scrape time, and a
// deleted function's series go with it.
func TestFunctionGaugesFollowTheTable(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.deploy("a", 2)
	e.deploy("b", 3)
	e.awaitConverged("a", 2)
	e.awaitConverged("b", 3)
	if got := gaugesOf(t, e, "brisk_function_desired_sandboxes"); len(got) != 2 || got["a"] != 2 || got["b"] != 3 {
		t.Fatalf("desired gauges %v, want a=2 b=3", got)
	}
	if got := gaugesOf(t, e, "brisk_function_panic_mode"); len(got) != 2 || got["a"] != 0 {
		t.Fatalf("panic gauges %v, want a=0 b=0", got)
	}
	if err := e.cp.store.DeleteFunction("a"); err != nil {
		t.Fatal(err)
	}
	e.cp.cluster.RemoveFunction("a")
	if got := gaugesOf(t, e, "brisk_function_desired_sandboxes"); len(got) != 1 || got["b"] != 3 {
		t.Fatalf("desired gauges after deleting a: %v, want b=3 only", got)
	}
}

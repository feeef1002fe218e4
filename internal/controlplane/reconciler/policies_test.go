package reconciler

import (
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/nodes"
	"github.com/brisk-faas/brisk/internal/policy/autoscale"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A predictor's forecast pre-warms a function at zero and raises its scale;
// without a forecast the KPA decides alone.
func TestPredictorPrewarms(t *testing.T) {
	forecast := map[string]float64{"f": 2.5}
	r, err := New(Config{Autoscale: autoscale.DefaultConfig(), Seed: 1, IDPrefix: "t",
		Predictor: autoscale.PredictorFunc(func(_ time.Time, key string) (float64, bool) {
			v, ok := forecast[key]
			return v, ok
		})})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, r: r, now: time.Unix(1_000_000, 0), running: map[string]map[string]string{}}
	w.step(RegisterNode{Worker: &nodes.Worker{ID: "n0", Address: "127.0.0.1:1", Capacity: spec.Resources{MilliCPU: 4000, MemoryMB: 8192}}})
	w.running["n0"] = map[string]string{}
	w.step(SessionUp{Node: "n0"})
	w.deploy("f", 0)
	w.deploy("g", 0)
	w.now = w.now.Add(2 * time.Second)
	w.step(Tick{})
	if r, _, _ := w.status("f"); r != 3 {
		t.Fatalf("f: %d ready, want ceil(2.5 / 1) = 3 from the forecast", r)
	}
	if r, _, _ := w.status("g"); r != 0 {
		t.Fatalf("g: %d ready with no forecast and no load", r)
	}
}

// The cluster's load-balancing default reaches data planes in the wire
// spec, and a spec's own choice wins.
func TestLoadBalancingDefault(t *testing.T) {
	r, err := New(Config{LoadBalancing: "power-of-two"})
	if err != nil {
		t.Fatal(err)
	}
	if lb := r.Publish(&spec.Function{Name: "f"}).LoadBalancing; lb != "power-of-two" {
		t.Fatalf("wire load balancing %q, want the cluster's", lb)
	}
	if lb := r.Publish(&spec.Function{Name: "f", LoadBalancing: "random"}).LoadBalancing; lb != "random" {
		t.Fatalf("wire load balancing %q, want the spec's", lb)
	}
	if p := r.PoliciesOf(&spec.Function{Name: "f"}); p.LoadBalancing != "power-of-two" || p.Placement != "kubernetes" || p.KeepAlivePolicy != "gd" || p.KeepAlive != "15m0s" {
		t.Fatalf("policies %+v", p)
	}
	if _, err := New(Config{LoadBalancing: "fastest"}); err == nil {
		t.Fatal("an unknown load-balancing default was accepted")
	}
}

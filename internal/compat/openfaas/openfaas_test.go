package openfaas

import (
	"encoding/json"
	"testing"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func TestDeploymentRoundTrip(t *testing.T) {
	d := &FunctionDeployment{Service: "f", Function: Function{Image: "img:1", Namespace: DefaultNamespace, EnvProcess: "cat",
		EnvVars: map[string]string{"A": "1"}, Labels: map[string]string{labelScaleMax: "3", "x": "y"},
		Annotations: map[string]string{"note": "n"}, Constraints: []string{"c"}, Secrets: []string{"s"},
		Limits: &Resources{Memory: "1Gi", CPU: "2"}, Requests: &Resources{Memory: "64Mi", CPU: "100m"}, ReadOnlyRootFilesystem: true}}
	f, err := ToSpec(d)
	if err != nil {
		t.Fatal(err)
	}
	if f.Namespace != "" || f.Env["fprocess"] != "cat" || f.Scaling.Max != 3 || f.Limits.MemoryMB != 1024 || f.Limits.MilliCPU != 2000 ||
		f.Resources.MemoryMB != 64 || f.WritableRoot || f.Auth != spec.AuthPublic {
		t.Fatalf("spec %+v", *f)
	}
	st := ToStatus(&api.FunctionView{Function: f})
	if st.Namespace != DefaultNamespace || st.EnvProcess != "cat" || st.EnvVars["A"] != "1" || st.EnvVars["fprocess"] != "" ||
		st.Labels["x"] != "y" || st.Labels[labelFunction] != "f" || st.Annotations["note"] != "n" || len(st.Annotations) != 1 ||
		len(st.Constraints) != 1 || len(st.Secrets) != 1 || st.Limits.Memory != "1024Mi" || st.Requests.CPU != "100m" || !st.ReadOnlyRootFilesystem {
		t.Fatalf("status %+v", st)
	}
	for what, bad := range map[string]*FunctionDeployment{
		"no name":        {Function: Function{Image: "i"}},
		"no image":       {Service: "f"},
		"bad min":        {Service: "f", Function: Function{Image: "i", Labels: map[string]string{labelScaleMin: "many"}}},
		"bad memory":     {Service: "f", Function: Function{Image: "i", Limits: &Resources{Memory: "lots"}}},
		"reserved annot": {Service: "f", Function: Function{Image: "i", Annotations: map[string]string{keepPrefix + "secrets": "[]"}}},
	} {
		if _, err := ToSpec(bad); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	if f, _ := ToSpec(&FunctionDeployment{Service: "t", Function: Function{Image: spec.BuiltinImagePrefix + "trace"}}); f.Builtin != "trace" || f.Image != "" {
		t.Fatalf("builtin image: %+v", f)
	}
}

// A function deployed with no annotations and no requests reports
// "annotations": {} (a Go OpenFaaS client dereferences the map) and no
// requests, not brisk's own defaults (issue 38).
func TestStatusOfAPlainFunction(t *testing.T) {
	f, err := ToSpec(&FunctionDeployment{Service: "plain", Function: Function{Image: "img:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if f.Scaling.Min != 1 {
		t.Errorf("min %d, want 1: OpenFaaS starts a function with one replica", f.Scaling.Min)
	}
	if z, _ := ToSpec(&FunctionDeployment{Service: "z", Function: Function{Image: "img:1", Labels: map[string]string{labelZero: "true"}}}); z.Scaling.Min != 0 {
		t.Errorf("with %s=true: min %d, want 0", labelZero, z.Scaling.Min)
	}
	if m, _ := ToSpec(&FunctionDeployment{Service: "m", Function: Function{Image: "img:1", Labels: map[string]string{labelScaleMin: "0"}}}); m.Scaling.Min != 0 {
		t.Errorf("with %s=0: min %d, want 0", labelScaleMin, m.Scaling.Min)
	}
	f.ApplyDefaults() // as the control plane stores it
	b, err := json.Marshal(ToStatus(&api.FunctionView{Function: f}))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if a, ok := got["annotations"].(map[string]any); !ok || len(a) != 0 {
		t.Errorf("annotations %#v in %s, want {}", got["annotations"], b)
	}
	if _, ok := got["requests"]; ok {
		t.Errorf("requests reported where none were asked: %s", b)
	}
}

// replicas is the autoscaler's desired count and availableReplicas the
// ready sandboxes up to it: idle sandboxes the keep-alive holds after a
// load are not replicas (issue 38: a min 1, max 2 function read as 2
// replicas for 15 minutes after its load).
func TestReplicasLeaveOutKeptSandboxes(t *testing.T) {
	f := &spec.Function{Name: "f"}
	for _, c := range []struct {
		desired, ready, pending int
		replicas, available     uint64
	}{
		{desired: 1, ready: 0, pending: 1, replicas: 1, available: 0}, // starting
		{desired: 2, ready: 2, replicas: 2, available: 2},             // under load
		{desired: 1, ready: 2, replicas: 1, available: 1},             // after it: one kept idle
		{desired: 0, ready: 1, replicas: 0, available: 0},             // scaled to zero, one kept
		{desired: 2, ready: 1, pending: 1, replicas: 2, available: 1}, // scaling up
	} {
		v := &api.FunctionView{Function: f}
		v.Status.Desired, v.Status.Ready, v.Status.Pending = c.desired, c.ready, c.pending
		st := ToStatus(v)
		if st.Replicas != c.replicas || st.AvailableReplicas != c.available {
			t.Errorf("desired %d ready %d: replicas %d available %d, want %d and %d", c.desired, c.ready, st.Replicas, st.AvailableReplicas, c.replicas, c.available)
		}
	}
}

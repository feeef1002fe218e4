package openfaas

import (
	"testing"

	"github.com/brisk-faas/brisk/internal/controlplane"
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
	st := ToStatus(&controlplane.FunctionView{Function: f})
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

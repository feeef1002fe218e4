package fncontroller

import (
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// object parses a Function object from YAML, as kubectl would send it.
func object(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(y), &m); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

const hello = `
apiVersion: brisk.dev/v1
kind: Function
metadata: {name: hello, namespace: team-a}
spec:
  image: registry.example/hello:1
  port: 9000
  env: {GREETING: hi}
  resources: {cpu_milli: 500, memory_mb: 256}
  concurrency: 4
  scaling: {min: 1, max: 10, target: 2.5, stable_window: 30s, mode: dual}
  queue: {timeout: 2s}
  timeout: 1m
  auth: public
  labels: {team: a}
  async: {max_attempts: 3, backoff: 500ms}
`

func TestToSpec(t *testing.T) {
	f, err := ToSpec(object(t, hello))
	if err != nil {
		t.Fatal(err)
	}
	want := &spec.Function{Name: "hello.team-a", Namespace: "team-a", Image: "registry.example/hello:1", Port: 9000,
		Env: map[string]string{"GREETING": "hi"}, Resources: spec.Resources{MilliCPU: 500, MemoryMB: 256}, Concurrency: 4,
		Scaling: spec.Scaling{Min: 1, Max: 10, Target: 2.5, StableWindow: spec.Duration(30 * time.Second), Mode: spec.ModeDual},
		Queue:   spec.Queue{Depth: spec.DefaultQueueDepth, Timeout: spec.Duration(2 * time.Second)},
		Timeout: spec.Duration(time.Minute), Auth: spec.AuthPublic,
		Labels: map[string]string{"team": "a", LabelObject: "team-a/hello"},
		Async:  spec.Async{MaxAttempts: 3, Backoff: spec.Duration(500 * time.Millisecond)}}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("ToSpec:\n got %+v\nwant %+v", f, want)
	}
	if err := f.Validate(); err != nil {
		t.Errorf("a valid object's spec does not validate: %v", err)
	}
}

func TestToSpecRefuses(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{`{image: x, replicas: 3}`, `unknown field "replicas"`},
		{`{image: x, name: other}`, "spec.name: not part of"},
		{`{image: x, traffic: []}`, "spec.traffic: not part of"},
		{`{image: x, port: "80"}`, "port"},
		{`{image: x, timeout: soon}`, `duration "soon"`},
		{`[1, 2]`, "not an object"},
	} {
		obj := object(t, "metadata: {name: f, namespace: default}\nspec: "+tc.spec)
		_, err := ToSpec(obj)
		if err == nil || !errors.Is(err, spec.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("spec %s: err %v, want ErrInvalid with %q", tc.spec, err, tc.want)
		}
	}
	// No spec at all decodes, and brisk's validation names what is missing.
	f, err := ToSpec(object(t, "metadata: {name: f, namespace: default}"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "exactly one must be set") {
		t.Errorf("empty spec: %v", err)
	}
}

// FromSpec and ToSpec are inverses: a function exported as an object and
// read back is the same function, and the object carries nothing brisk
// sets.
func TestFromSpecRoundTrip(t *testing.T) {
	f, err := ToSpec(object(t, hello))
	if err != nil {
		t.Fatal(err)
	}
	stored := *f
	stored.Revision, stored.CreatedAt, stored.UpdatedAt = 42, time.Now(), time.Now()
	stored.Traffic = []spec.TrafficTarget{{Revision: 0, Percent: 100}}
	obj, err := FromSpec(&stored, "")
	if err != nil {
		t.Fatal(err)
	}
	if obj.GetAPIVersion() != APIVersion || obj.GetKind() != Kind || obj.GetName() != "hello" || obj.GetNamespace() != "team-a" {
		t.Errorf("object %s %s %s/%s", obj.GetAPIVersion(), obj.GetKind(), obj.GetNamespace(), obj.GetName())
	}
	s := obj.Object["spec"].(map[string]any)
	for _, k := range serverSet {
		if _, ok := s[k]; ok {
			t.Errorf("spec.%s in the object", k)
		}
	}
	if l, _, _ := unstructured.NestedStringMap(obj.Object, "spec", "labels"); l[LabelObject] != "" {
		t.Errorf("the controller's label is in the object: %v", l)
	}
	if p, _, _ := unstructured.NestedInt64(obj.Object, "spec", "port"); p != 9000 {
		t.Errorf("spec.port %v, want the integer 9000", s["port"])
	}
	// What the apiserver would store and send back: JSON again.
	data, err := obj.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back := &unstructured.Unstructured{}
	if err := back.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	g, err := ToSpec(back)
	if err != nil {
		t.Fatal(err)
	}
	if !sameSpec(g, &stored) {
		t.Errorf("round trip changed the function:\n got %+v\nwant %+v", g, f)
	}
	if other, _ := FromSpec(&stored, "elsewhere"); other.GetNamespace() != "elsewhere" {
		t.Errorf("namespace %q, want the one asked for", other.GetNamespace())
	}
}

func TestSameSpec(t *testing.T) {
	a, _ := ToSpec(object(t, hello))
	b, _ := ToSpec(object(t, hello))
	b.Revision, b.Generation, b.CreatedAt, b.UpdatedAt = 7, 3, time.Now(), time.Now()
	b.Traffic = []spec.TrafficTarget{{Revision: 3, Percent: 100}}
	if !sameSpec(a, b) {
		t.Error("revision, generation, times and traffic make specs differ")
	}
	b.Env = map[string]string{"GREETING": "hello"}
	if sameSpec(a, b) {
		t.Error("a changed env is the same spec")
	}
}

func TestRefusedAndOutcome(t *testing.T) {
	o, err := refused(&client.Error{Status: 400, Message: "invalid function spec: scaling.min: 5 is above scaling.max 2"})
	if err != nil || o.status != metav1.ConditionFalse || o.reason != ReasonInvalidSpec || !strings.Contains(o.message, "scaling.min") {
		t.Errorf("400: %+v %v", o, err)
	}
	if o, err := refused(&client.Error{Status: 403, Message: "quota"}); err != nil || o.reason != ReasonForbidden {
		t.Errorf("403: %+v %v", o, err)
	}
	for _, e := range []error{&client.Error{Status: 503, Message: "not the leader"}, errors.New("connection refused")} {
		if o, err := refused(e); err == nil || o.status != metav1.ConditionUnknown || o.reason != ReasonUnavailable {
			t.Errorf("%v: %+v %v, want a retry", e, o, err)
		}
	}
	v := &api.FunctionView{Function: &spec.Function{Name: "f", Revision: 9}, Status: api.FunctionStatus{Ready: 2, Desired: 3}}
	if o := outcomeOf(v); o.status != metav1.ConditionTrue || o.reason != ReasonDeployed || o.message != "revision 9: 2 of 3 sandboxes ready" {
		t.Errorf("deployed: %+v", o)
	}
	v.Status.Condition, v.Status.Message = "function-failing", "3 starts failed"
	if o := outcomeOf(v); o.status != metav1.ConditionFalse || o.reason != ReasonFailing || o.message != "3 starts failed" {
		t.Errorf("failing: %+v", o)
	}
	v.Status.Condition = "some-new-thing"
	if o := outcomeOf(v); o.reason != "SomeNewThing" {
		t.Errorf("unknown condition: reason %q", o.reason)
	}
}

func TestStatusKeepsTransitionTime(t *testing.T) {
	c := &Controller{cfg: Config{Domain: "brisk.local"}}
	obj := object(t, hello)
	obj.SetGeneration(2)
	v := &api.FunctionView{Function: &spec.Function{Name: "hello", Revision: 9}, Status: api.FunctionStatus{Ready: 1, Desired: 1}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	obj.Object["status"] = c.statusFor(obj, outcomeOf(v), t0)
	if u, _, _ := unstructured.NestedString(obj.Object, "status", "url"); u != "http://hello.team-a.brisk.local" {
		t.Errorf("url %q", u)
	}
	v.Status.Ready = 3
	st := c.statusFor(obj, outcomeOf(v), t0.Add(time.Hour))
	if got := st["conditions"].([]any)[0].(map[string]any)["lastTransitionTime"]; got != t0.Format(time.RFC3339) {
		t.Errorf("still Ready: transition time %v, want the first one", got)
	}
	obj.Object["status"] = st
	// A refused update keeps showing the revision that serves.
	st = c.statusFor(obj, outcome{status: metav1.ConditionFalse, reason: ReasonInvalidSpec, message: "bad"}, t0.Add(2*time.Hour))
	if st["revision"] != int64(9) || st["conditions"].([]any)[0].(map[string]any)["lastTransitionTime"] != t0.Add(2*time.Hour).Format(time.RFC3339) {
		t.Errorf("refused update: %v", st)
	}
	obj.Object["status"] = st
	if !refusedNow(obj) {
		t.Error("refusedNow: false for a refused current generation")
	}
	obj.SetGeneration(3)
	if refusedNow(obj) {
		t.Error("refusedNow: true for a newer generation")
	}
}

func TestChanged(t *testing.T) {
	a := object(t, hello)
	a.SetResourceVersion("1")
	a.SetGeneration(1)
	b := a.DeepCopy()
	if !changed(a, b) {
		t.Error("a resync (same resource version) is not queued")
	}
	b.SetResourceVersion("2") // a status write
	if changed(a, b) {
		t.Error("a status write is queued")
	}
	b.SetFinalizers([]string{Finalizer}) // the controller's own
	if changed(a, b) {
		t.Error("the finalizer's addition is queued")
	}
	b.SetGeneration(2)
	if !changed(a, b) {
		t.Error("a new spec is not queued")
	}
	b = a.DeepCopy()
	b.SetResourceVersion("4")
	b.SetAnnotations(map[string]string{"retry": "1"})
	if !changed(a, b) {
		t.Error("an annotation is not queued")
	}
	b = a.DeepCopy()
	b.SetResourceVersion("3")
	now := metav1.Now()
	b.SetDeletionTimestamp(&now)
	if !changed(a, b) {
		t.Error("a deletion is not queued")
	}
}

// The CRD's schema has every field of brisk's spec, and the same choices
// for its enumerations, so that an object can say whatever the admin API
// takes.
func TestCRDMatchesSpec(t *testing.T) {
	data, err := os.ReadFile("../../../deploy/kubernetes/function-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	if g, _, _ := unstructured.NestedString(crd, "spec", "group"); g != Group {
		t.Errorf("group %q", g)
	}
	if p, _, _ := unstructured.NestedString(crd, "spec", "names", "plural"); p != Resource {
		t.Errorf("plural %q", p)
	}
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	if len(versions) != 1 || versions[0].(map[string]any)["name"] != Version {
		t.Fatalf("versions %v", versions)
	}
	props, _, _ := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties")
	checkFields(t, "spec", reflect.TypeFor[spec.Function](), props)
	enums := map[string][]string{"builtin": spec.Builtins, "load_balancing": spec.LoadBalancers, "placement": spec.Placements,
		"auth": {spec.AuthToken, spec.AuthPublic}}
	for field, want := range enums {
		got, _, _ := unstructured.NestedStringSlice(props, field, "enum")
		if !slices.Equal(got, want) {
			t.Errorf("spec.%s enum %v, want %v", field, got, want)
		}
	}
	if got, _, _ := unstructured.NestedStringSlice(props, "scaling", "properties", "mode", "enum"); !slices.Equal(got, spec.ScalingModes) {
		t.Errorf("scaling.mode enum %v", got)
	}
	if got, _, _ := unstructured.NestedStringSlice(props, "scaling", "properties", "keep_alive_policy", "enum"); !slices.Equal(got, spec.KeepAlivePolicies) {
		t.Errorf("scaling.keep_alive_policy enum %v", got)
	}
}

// checkFields checks that the schema's properties are typ's JSON fields,
// less those an object does not carry.
func checkFields(t *testing.T, path string, typ reflect.Type, props map[string]any) {
	t.Helper()
	want := map[string]reflect.Type{}
	for i := range typ.NumField() {
		sf := typ.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "-" || name == "" || (path == "spec" && slices.Contains(serverSet, name)) {
			continue
		}
		want[name] = sf.Type
	}
	for name, ft := range want {
		p, ok := props[name].(map[string]any)
		if !ok {
			t.Errorf("%s.%s: not in the CRD's schema", path, name)
			continue
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Time]() {
			sub, _ := p["properties"].(map[string]any)
			checkFields(t, path+"."+name, ft, sub)
		}
	}
	for name := range props {
		if _, ok := want[name]; !ok {
			t.Errorf("%s.%s: in the CRD's schema, not in brisk's spec", path, name)
		}
	}
}

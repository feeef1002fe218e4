package fncontroller

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// TestOwned: a function is an object's only with the object's label and
// in the object's brisk namespace; the label alone can be forged.
func TestOwned(t *testing.T) {
	f := func(ns, label string) *spec.Function {
		return &spec.Function{Name: "x", Namespace: ns, Labels: map[string]string{LabelObject: label}}
	}
	for _, tc := range []struct {
		f    *spec.Function
		want bool
	}{
		{f("team-a", "team-a/x"), true},
		{f("team-b", "team-a/x"), false}, // forged in another namespace
		{f("team-a", "team-a/y"), false},
		{f("", "team-a/x"), false}, // "" is brisk's default namespace
		{&spec.Function{Name: "x", Namespace: "team-a"}, false},
	} {
		if got := owned("team-a/x", tc.f); got != tc.want {
			t.Errorf("owned(team-a/x, %s %v) = %v, want %v", tc.f.Namespace, tc.f.Labels, got, tc.want)
		}
	}
	if !owned("default/x", f("", "default/x")) {
		t.Error("a function of the default namespace (\"\") is not its object's")
	}
}

// TestRefusedIn: brisk's "namespace does not exist" forgets the namespace
// and asks for a retry; other refusals are conditions only, and the
// namespace stays known.
func TestRefusedIn(t *testing.T) {
	c := &Controller{nsKnown: map[string]bool{"team-a": true}}
	o, err := c.refusedIn("team-a", &client.Error{Status: http.StatusBadRequest,
		Message: `invalid function spec: namespace: "team-a" does not exist (brisk ns create team-a)`})
	if err == nil || o.reason != ReasonNamespaceMissing || o.status != metav1.ConditionFalse || c.nsKnown["team-a"] {
		t.Errorf("namespace missing: %+v %v, known %v; want NamespaceMissing, a retry and the namespace forgotten", o, err, c.nsKnown)
	}
	c.nsKnown["team-a"] = true
	o, err = c.refusedIn("team-a", &client.Error{Status: http.StatusBadRequest, Message: `invalid function spec: secrets: db not found in namespace "team-a"`})
	if err != nil || o.reason != ReasonInvalidSpec || !c.nsKnown["team-a"] {
		t.Errorf("another 400: %+v %v, known %v", o, err, c.nsKnown)
	}
}

// TestBadObjectsNeverReachBrisk: whatever an object's spec holds (the
// apiserver's schema aside: an older CRD, a client that skips it), the
// controller neither crashes nor calls brisk; the object gets InvalidSpec
// and no retry.
func TestBadObjectsNeverReachBrisk(t *testing.T) {
	var calls []string
	cl := client.New("http://127.0.0.1:1", "")
	cl.HTTP = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls = append(calls, r.Method+" "+r.URL.Path)
		return nil, errors.New("brisk must not be called")
	})}
	c := &Controller{cfg: Config{Brisk: cl, Domain: "brisk.local"}, nsKnown: map[string]bool{}}
	manyEnv := map[string]any{}
	for i := range 10000 {
		manyEnv["K"+strconv.Itoa(i)] = strings.Repeat("v", 100)
	}
	deep := map[string]any{"builtin": "trace"}
	for cur, i := deep, 0; i < 1000; i++ {
		next := map[string]any{}
		cur["x"], cur = next, next
	}
	for name, s := range map[string]any{
		"string spec":  "builtin: trace",
		"number spec":  int64(3),
		"list spec":    []any{"a"},
		"env list":     map[string]any{"builtin": "trace", "env": []any{"A=1"}},
		"env numbers":  map[string]any{"builtin": "trace", "env": map[string]any{"A": int64(1)}},
		"huge image":   map[string]any{"image": strings.Repeat("i", 4<<20)},
		"10k env vars": map[string]any{"builtin": "trace", "env": manyEnv},
		"deep nesting": deep,
		"float port":   map[string]any{"builtin": "trace", "port": 1e300},
		"negative max": map[string]any{"builtin": "trace", "scaling": map[string]any{"max": int64(-1)}},
		"no runtime":   map[string]any{},
		"null spec":    nil,
	} {
		obj := &unstructured.Unstructured{Object: map[string]any{"spec": s}}
		obj.SetName("f")
		obj.SetNamespace("team-a")
		o, err := c.deploy(context.Background(), obj)
		if err != nil || o.reason != ReasonInvalidSpec || o.status != metav1.ConditionFalse {
			t.Errorf("%s: %+v %v, want InvalidSpec and no retry", name, o, err)
		}
		st := c.statusFor(obj, o, metav1.Now().Time)
		msg := st["conditions"].([]any)[0].(map[string]any)["message"].(string)
		if len(msg) > maxMessage+3 || !utf8.ValidString(msg) {
			t.Errorf("%s: a message of %d bytes", name, len(msg))
		}
	}
	if len(calls) > 0 {
		t.Errorf("brisk called for invalid objects: %v", calls)
	}
	// A long message (brisk echoing something) is cut to a valid string.
	obj := &unstructured.Unstructured{Object: map[string]any{}}
	st := c.statusFor(obj, outcome{status: metav1.ConditionFalse, reason: ReasonInvalidSpec, message: strings.Repeat("é", 5000)}, metav1.Now().Time)
	if msg := st["conditions"].([]any)[0].(map[string]any)["message"].(string); len(msg) > maxMessage+3 || !utf8.ValidString(msg) {
		t.Errorf("a long message: %d bytes, valid UTF-8 %v", len(msg), utf8.ValidString(msg))
	}
}

// TestRules: the controller may read and watch Namespaces (which are
// opted in); a Role, namespaced, cannot grant that, NamespaceReader does,
// for its one namespace.
func TestRules(t *testing.T) {
	hasNS := func(rules []string) bool { return slices.Contains(rules, "namespaces") }
	var cr []string
	for _, r := range ClusterRole("x").Rules {
		cr = append(cr, r.Resources...)
	}
	if !hasNS(cr) {
		t.Errorf("ClusterRole resources %v: no namespaces", cr)
	}
	nr := NamespaceReader("team-a", "x").Rules
	if len(nr) != 1 || !slices.Equal(nr[0].ResourceNames, []string{"team-a"}) || !slices.Equal(nr[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("NamespaceReader rules %+v", nr)
	}
	for _, r := range Role("team-a", "x").Rules {
		if hasNS(r.Resources) {
			t.Errorf("Role grants namespaces, which a Role cannot: %+v", r)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

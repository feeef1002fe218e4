package spec

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"
)

func valid() *Function {
	f := &Function{Name: "hello", Builtin: "trace"}
	f.ApplyDefaults()
	return f
}

func TestDefaults(t *testing.T) {
	f := valid()
	if f.Port != DefaultPort || f.Concurrency != 1 || f.Queue.Depth != DefaultQueueDepth ||
		time.Duration(f.Queue.Timeout) != DefaultQueueTimeout || time.Duration(f.Timeout) != DefaultTimeout ||
		f.Resources.MilliCPU != DefaultMilliCPU || f.Resources.MemoryMB != DefaultMemoryMB {
		t.Fatalf("defaults not applied: %+v", f)
	}
	if err := f.Validate(); err != nil {
		t.Fatalf("default builtin spec invalid: %v", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	tests := []struct {
		label string
		edit  func(f *Function)
		field string
	}{
		{"empty name", func(f *Function) { f.Name = "" }, "name"},
		{"uppercase name", func(f *Function) { f.Name = "Hello" }, "name"},
		{"long name", func(f *Function) { f.Name = strings.Repeat("a", 64) }, "name"},
		{"trailing dash", func(f *Function) { f.Name = "a-" }, "name"},
		{"two artifacts", func(f *Function) { f.Command = []string{"/bin/true"} }, "builtin/command/image/code"},
		{"no artifact", func(f *Function) { f.Builtin = "" }, "builtin/command/image/code"},
		{"unknown builtin", func(f *Function) { f.Builtin = "x" }, "builtin"},
		{"empty program", func(f *Function) { f.Builtin, f.Command = "", []string{" "} }, "command"},
		{"port zero", func(f *Function) { f.Port = -1 }, "port"},
		{"port high", func(f *Function) { f.Port = 65536 }, "port"},
		{"env name", func(f *Function) { f.Env = map[string]string{"A=B": "x"} }, "env"},
		{"negative cpu", func(f *Function) { f.Resources.MilliCPU = -1 }, "resources.cpu_milli"},
		{"negative memory", func(f *Function) { f.Resources.MemoryMB = -5 }, "resources.memory_mb"},
		{"negative concurrency", func(f *Function) { f.Concurrency = -1 }, "concurrency"},
		{"min above max", func(f *Function) { f.Scaling.Min, f.Scaling.Max = 5, 2 }, "scaling.min"},
		{"utilization", func(f *Function) { f.Scaling.TargetUtilization = 1.5 }, "scaling.target_utilization"},
		{"window", func(f *Function) { f.Scaling.StableWindow = Duration(10 * time.Millisecond) }, "scaling.stable_window"},
		{"window fraction", func(f *Function) { f.Scaling.StableWindow = Duration(1500 * time.Millisecond) }, "scaling.stable_window"},
		{"panic threshold", func(f *Function) { f.Scaling.PanicThreshold = 1 }, "scaling.panic_threshold"},
		{"queue depth", func(f *Function) { f.Queue.Depth = -1 }, "queue.depth"},
		{"timeout", func(f *Function) { f.Timeout = Duration(2 * time.Hour) }, "timeout"},
		{"lb", func(f *Function) { f.LoadBalancing = "fastest" }, "load_balancing"},
	}
	for _, tc := range tests {
		t.Run(tc.label, func(t *testing.T) {
			f := valid()
			tc.edit(f)
			err := f.Validate()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("want ErrInvalid, got %v", err)
			}
			if !strings.Contains(err.Error(), ": "+tc.field+": ") {
				t.Fatalf("error %q does not name field %q", err, tc.field)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	f, err := Decode([]byte(`{"name":"a","command":["/bin/srv","-x"],"timeout":"90s","queue":{"depth":3,"timeout":"1s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(f.Timeout) != 90*time.Second || f.Queue.Depth != 3 || f.Command[1] != "-x" {
		t.Fatalf("decoded %+v", f)
	}
	for _, bad := range []string{`{"name":"a","extra":1}`, `{"name":`, `{"name":"a"} {}`, `{"timeout": 30}`, `{"timeout": "soon"}`} {
		if _, err := Decode([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Decode(%s) = %v, want ErrInvalid", bad, err)
		}
	}
}

// Names are per namespace: NAME.NAMESPACE outside the default one.
func TestQualifiedNames(t *testing.T) {
	for _, tc := range []struct{ name, ns, want string }{
		{"api", "team-a", "api.team-a"}, {"api", DefaultNamespace, "api"}, {"api", "", "api"},
		{"api.team-a", "team-a", "api.team-a"}, {"", "team-a", ""},
	} {
		if got := Qualify(tc.name, tc.ns); got != tc.want {
			t.Errorf("Qualify(%q, %q) = %q, want %q", tc.name, tc.ns, got, tc.want)
		}
	}
	if ShortName("api.team-a") != "api" || ShortName("api") != "api" {
		t.Error("ShortName")
	}
	for name, valid := range map[string]bool{"api": true, "api.team-a": true, "a.b.c": false, ".a": false, "a.": false,
		"A": false, strings.Repeat("a", 61) + ".b": true, strings.Repeat("a", 62) + ".b": false} {
		if ValidName(name) != valid {
			t.Errorf("ValidName(%q) = %v", name, !valid)
		}
	}
	f := &Function{Name: "api.team-a", Builtin: "trace"}
	f.ApplyDefaults()
	if f.Namespace != "team-a" || f.Validate() != nil {
		t.Errorf("a qualified name names its namespace: %q %v", f.Namespace, f.Validate())
	}
	f = &Function{Name: "api.team-a", Namespace: "team-b", Builtin: "trace"}
	f.ApplyDefaults()
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), `namespace "team-a"`) {
		t.Errorf("a name of another namespace: %v", err)
	}
	f = &Function{Name: "api.default", Builtin: "trace"}
	f.ApplyDefaults()
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "bare names") {
		t.Errorf("NAME.default: %v, want refused (it would shadow NAME on the routes)", err)
	}
	f = &Function{Name: "api", Namespace: "team-b", Builtin: "trace"} // made before names were per namespace
	f.ApplyDefaults()
	if err := f.Validate(); err != nil {
		t.Errorf("a bare name in a namespace: %v", err)
	}
}

// Durations read and write as strings; the fast paths give what
// encoding/json gives.
func TestDurationJSON(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 1500 * time.Millisecond, 90 * time.Minute} {
		got, _ := Duration(d).MarshalJSON()
		want, _ := json.Marshal(d.String())
		if string(got) != string(want) {
			t.Errorf("%v: %s, want %s", d, got, want)
		}
		var back Duration
		if err := back.UnmarshalJSON(got); err != nil || time.Duration(back) != d {
			t.Errorf("%s read back as %v, %v", got, back, err)
		}
	}
	var d Duration
	if err := d.UnmarshalJSON([]byte(`"\u0031s"`)); err != nil || time.Duration(d) != time.Second {
		t.Errorf(`"\u0031s": %v, %v`, d, err)
	}
	for _, bad := range []string{`5`, `"5"`, `"`, `""`, `null`, `"1 s"`} {
		if err := d.UnmarshalJSON([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// nameRE is the pattern isLabel implements by hand.
var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestIsLabel(t *testing.T) {
	cases := []string{"", "a", "-", "a-", "-a", "a-b", "a--b", "A", "é", "0", "ab9", "a_b", "a.b", "a b", "x\x00", strings.Repeat("a", 70)}
	rnd := rand.New(rand.NewPCG(1, 2))
	const alphabet = "az09-A._\xff"
	for range 5000 {
		b := make([]byte, rnd.IntN(6))
		for i := range b {
			b[i] = alphabet[rnd.IntN(len(alphabet))]
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		if got, want := isLabel(s), nameRE.MatchString(s); got != want {
			t.Fatalf("isLabel(%q) = %v, the pattern says %v", s, got, want)
		}
	}
}

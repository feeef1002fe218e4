package spec

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
)

func TestDuplicateKey(t *testing.T) {
	for _, tc := range []struct{ doc, dup string }{
		{`{"a": 1, "b": 2}`, ""},
		{`{"a": 1, "a": 2}`, "a"},
		{`{"a": {"x": 1}, "b": {"x": 2}}`, ""},
		{`{"a": {"x": 1, "x": 2}}`, "x"},
		{`{"a": [{"x": 1}, {"x": 1}], "b": "a"}`, ""},
		{`{"a": [{"x": 1, "y": [1, {"z": 1, "z": 2}]}]}`, "z"},
		{`{"a": [], "a": []}`, "a"},
		{`{"s": "a", "t": "a"}`, ""},    // equal values are not keys
		{`{"command": ["a", "a"]}`, ""}, // nor array elements
		{`{"": 1, "": 2}`, ""},
	} {
		dup, err := duplicateKey([]byte(tc.doc))
		if err != nil || dup != tc.dup {
			t.Errorf("%s: %q %v, want %q", tc.doc, dup, err, tc.dup)
		}
	}
	if _, err := duplicateKey([]byte(`{"a": `)); err == nil {
		t.Error("truncated JSON: no error")
	}
}

// Bytes a process's argv, environment or an image reference must not carry
// are refused, naming the field; text where it belongs (a script's lines,
// a PEM in a variable) is not.
func TestValidateRefusesControlBytes(t *testing.T) {
	base := func() *Function {
		f := &Function{Name: "f", Command: []string{"/bin/sh", "-c", "echo one\necho two\t"}, Env: map[string]string{"PEM": "-----BEGIN\r\nabc\n-----END\n"}}
		f.ApplyDefaults()
		return f
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("a script with lines and a PEM: %v", err)
	}
	for _, tc := range []struct {
		field string
		mod   func(*Function)
	}{
		{"command[0]", func(f *Function) { f.Command[0] = "/bin/sh\n" }},
		{"command[2]", func(f *Function) { f.Command[2] = "echo \x00" }},
		{"command[1]", func(f *Function) { f.Command[1] = "\x1b[31m" }},
		{"env.PEM", func(f *Function) { f.Env["PEM"] = "a\x00b" }},
		{"env", func(f *Function) { f.Env["A\x01"] = "x" }},
		{"image", func(f *Function) { f.Command = nil; f.Image = "brisk.local/x:\x7f" }},
		{"command", func(f *Function) { f.Command = make([]string, 300); f.Command[0] = "/x" }},
		{"command", func(f *Function) { f.Command = []string{"/x", strings.Repeat("a", 70<<10)} }},
		{"env", func(f *Function) { f.Env["BIG"] = strings.Repeat("a", 70<<10) }},
	} {
		f := base()
		tc.mod(f)
		err := f.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), ": "+tc.field+": ") {
			t.Errorf("%s: %v, want an error naming %s", tc.field, err, tc.field)
		}
	}
}

func TestCapsNameFieldAndLimit(t *testing.T) {
	caps := Caps{MaxScale: 10, MaxQueueTimeout: time.Minute}.WithDefaults()
	ok := &Function{Name: "f", Builtin: "trace", Scaling: Scaling{Min: 10, Max: 10}}
	ok.ApplyDefaults()
	if err := caps.Check(ok); err != nil {
		t.Fatalf("at the caps: %v", err)
	}
	for _, tc := range []struct {
		want string
		mod  func(*Function)
	}{
		{"scaling.max: 11 is above this cluster's limit 10", func(f *Function) { f.Scaling.Max = 11 }},
		{"scaling.min: 11", func(f *Function) { f.Scaling.Min, f.Scaling.Max = 11, 0 }},
		{"queue.timeout: 2m0s is above this cluster's limit 1m0s", func(f *Function) { f.Queue.Timeout = Duration(2 * time.Minute) }},
		{"timeout: 2h0m0s", func(f *Function) { f.Timeout = Duration(2 * time.Hour) }},
		{"resources.cpu_milli", func(f *Function) { f.Resources.MilliCPU = 64_001 }},
		{"limits.memory_mb", func(f *Function) { f.Limits.MemoryMB = 1 << 17 }},
		{"concurrency", func(f *Function) { f.Concurrency = 10_001 }},
		{"queue.depth", func(f *Function) { f.Queue.Depth = 100_001 }},
	} {
		f := *ok
		tc.mod(&f)
		err := caps.Check(&f)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want an error with %q", err, tc.want)
		}
	}
}

// FuzzDecode: the admin API's spec parser never panics; what it accepts
// and validates converts to the wire form and back unchanged, and carries
// no control byte into a command or the environment.
// decodeCorners are inputs where encoding/json and the v2 decoder could
// disagree: escapes in names, nulls, numbers, UTF-8, embedded objects.
var decodeCorners = []string{
	`{"n\u0061me": "a", "builtin": "trace"}`,
	`{"name": "a", "NAME": "b"}`,
	`{"name": "a", "scaling": null, "env": null, "command": null}`,
	`null`,
	`{"name": "a", "port": 1e2}`,
	`{"name": "a", "port": 80.0}`,
	`{"name": "a", "port": -0}`,
	`{"name": "a", "port": 99999999999999999999}`,
	`{"name": "a", "concurrency": "1"}`,
	"{\"name\": \"a\xff\"}",
	"{\"name\": \"a\", \"env\": {\"K\xff\": \"v\"}}",
	`{"name": "a", "env": {"K": "v", "k": "w"}}`,
	`{"name": "a", "env": {"K": "v", "K": "w"}}`,
	`{"name": "a", "timeout": 5}`,
	`{"name": "a", "timeout": "5s", "queue": {"Depth": 1}}`,
	`{"name": "a"}   `,
	` {"name": "a"}`,
	`{"name": "a", "labels": {"": "x"}}`,
	`{"name": "a", "code": {"zip": "AAAA"}}`,
	`{"name": "a", "traffic": [{"revision": 1, "percent": 100}]}`,
	`{"name": "a", "command": ["x", 1]}`,
	`{"name": "a", "resources": {"cpu_milli": 100, "memory_mb": 64}}`,
	`{"name": "a", "resources": {"cpu": "100m"}}`,
}

// agree fails when the fast path accepts data and the strict decoder does
// not, or reads it otherwise.
func agree(t *testing.T, data []byte) {
	t.Helper()
	var fast Function
	if jsonv2.Unmarshal(data, &fast, jsonv2.RejectUnknownMembers(true)) != nil {
		return // the slow path decides alone
	}
	slow, err := decodeStrict(data)
	if err != nil {
		t.Fatalf("%q: the fast path accepted what the strict decoder refuses: %v", data, err)
	}
	if !reflect.DeepEqual(&fast, slow) {
		t.Fatalf("%q: the fast path read %+v, the strict decoder %+v", data, fast, *slow)
	}
}

func TestDecodePathsAgree(t *testing.T) {
	for _, s := range decodeCorners {
		agree(t, []byte(s))
	}
	// Invalid UTF-8 is refused by the fast path only: it still decodes,
	// as before.
	if f, err := Decode([]byte("{\"name\": \"a\xff\", \"builtin\": \"trace\"}")); err != nil || f.Name != "a\ufffd" {
		t.Fatalf("invalid UTF-8: %+v, %v", f, err)
	}
	// What the fast path refuses gets the strict decoder's precise error.
	for in, want := range map[string]string{
		`{"name": "p", "timeout": "1s", "timeout": "50m"}`: `key "timeout" appears twice`,
		`{"name": "x", "NAME": "y"}`:                       `unknown field "NAME" (field names are case-sensitive: "name")`,
		`{"name": "x", "colour": 1}`:                       `unknown field "colour"`,
		`{"name": "x"} {}`:                                 "trailing data",
	} {
		if _, err := Decode([]byte(in)); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", in, err, want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"name": "a", "builtin": "trace"}`,
		`{"name": "a", "command": ["/bin/sh", "-c", "x"], "env": {"K": "v"}, "scaling": {"min": 1, "max": 2}}`,
		`{"name": "a", "image": "brisk.local/a:latest", "port": 80, "queue": {"depth": 5, "timeout": "1s"}}`,
		`{"name": "a", "builtin": "trace", "name": "b"}`,
		`{"name": "a", "builtin": "trace"} {}`,
		`{"name": "a", "command": ["x\u0000"]}`,
		`[{"name": "a"}]`,
		`{"name": "a", "timeout": "-1s", "builtin": "trace"}`,
	} {
		f.Add([]byte(s))
	}
	for _, s := range decodeCorners {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		agree(t, data)
		fn, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		fn.ApplyDefaults()
		if fn.Validate() != nil || DefaultCaps().Check(fn) != nil {
			return
		}
		for _, a := range fn.Command {
			if strings.ContainsRune(a, 0) {
				t.Fatalf("a NUL passed into the command: %q", fn.Command)
			}
		}
		for k, v := range fn.Env {
			if strings.ContainsRune(k+v, 0) {
				t.Fatalf("a NUL passed into the environment: %q=%q", k, v)
			}
		}
	})
}

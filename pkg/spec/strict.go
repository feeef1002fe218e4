package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// Limits on what one spec may carry, whatever the cluster: bounds on the
// work a registration makes for every worker and data plane.
const (
	maxCommandArgs  = 256
	maxCommandBytes = 64 << 10
	maxEnvVars      = 256
	maxEnvBytes     = 64 << 10
	maxImageBytes   = 1024
)

// controlByte returns the index of the first C0 control byte or DEL in s,
// tab, newline and carriage return allowed when text is true (a shell
// script, a PEM in an environment variable), or -1.
func controlByte(s string, text bool) int {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if text && (b == '\t' || b == '\n' || b == '\r') {
			continue
		}
		if b < 0x20 || b == 0x7f {
			return i
		}
	}
	return -1
}

// validateStrings refuses NUL and control bytes where a process's argv,
// environment or an image reference would carry them, and bounds their
// sizes.
// Bounds of labels and annotations (each map).
const (
	maxMetaEntries = 64
	maxMetaBytes   = 64 << 10
)

func (f *Function) validateStrings(bad func(field, format string, args ...any) error) error {
	if len(f.Command) > maxCommandArgs {
		return bad("command", "%d arguments, more than %d", len(f.Command), maxCommandArgs)
	}
	size := 0
	for i, a := range f.Command {
		size += len(a)
		if j := controlByte(a, i > 0); j >= 0 {
			return bad(fmt.Sprintf("command[%d]", i), "control byte %#02x at offset %d", a[j], j)
		}
	}
	if size > maxCommandBytes {
		return bad("command", "%d bytes, more than %d", size, maxCommandBytes)
	}
	if len(f.Env) > maxEnvVars {
		return bad("env", "%d variables, more than %d", len(f.Env), maxEnvVars)
	}
	size = 0
	for k, v := range f.Env {
		size += len(k) + len(v)
		if j := controlByte(k, false); j >= 0 {
			return bad("env", "variable name %q has a control byte at offset %d", k, j)
		}
		if j := controlByte(v, true); j >= 0 {
			return bad("env."+k, "control byte %#02x at offset %d", v[j], j)
		}
	}
	if size > maxEnvBytes {
		return bad("env", "%d bytes, more than %d", size, maxEnvBytes)
	}
	for _, m := range []struct {
		field string
		kv    map[string]string
	}{{"labels", f.Labels}, {"annotations", f.Annotations}} {
		if len(m.kv) > maxMetaEntries {
			return bad(m.field, "%d entries, more than %d", len(m.kv), maxMetaEntries)
		}
		size := 0
		for k, v := range m.kv {
			size += len(k) + len(v)
			if k == "" || len(k) > 253 || controlByte(k, false) >= 0 {
				return bad(m.field, "key %q: want 1-253 bytes without control bytes", k)
			}
			if j := controlByte(v, true); j >= 0 {
				return bad(m.field+"."+k, "control byte %#02x at offset %d", v[j], j)
			}
		}
		if size > maxMetaBytes {
			return bad(m.field, "%d bytes, more than %d", size, maxMetaBytes)
		}
	}
	if len(f.Image) > maxImageBytes {
		return bad("image", "%d bytes, more than %d", len(f.Image), maxImageBytes)
	}
	for i := 0; i < len(f.Image); i++ {
		if b := f.Image[i]; b <= ' ' || b == 0x7f {
			return bad("image", "%q: control byte or space at offset %d", f.Image, i)
		}
	}
	return nil
}

// duplicateKey returns the first key that appears twice in one object of
// the JSON document data (at any depth), or "". encoding/json keeps the
// last of duplicates silently; a spec that says two things must be refused.
func duplicateKey(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		keys    map[string]bool // nil: an array
		wantKey bool
	}
	var stack []frame
	valueDone := func() { // in an object, a key comes next
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) > 0 {
				return "", io.ErrUnexpectedEOF
			}
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			if k, ok := tok.(string); ok {
				if stack[n-1].keys[k] {
					return k, nil
				}
				stack[n-1].keys[k] = true
				stack[n-1].wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

// inexactKey returns the first key of the JSON document data that names a
// struct field of t (at any depth) other than as the field's JSON name is
// spelled, with that name, or "". encoding/json matches field names
// ignoring case, so {"name":"a","NAME":"b"} passed the duplicate check with
// two different keys and registered "b"; a spec must spell its fields as
// documented. Keys of maps (env, labels, ...) are the user's and free.
func inexactKey(data []byte, t reflect.Type) (key, field string) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return "", "" // the strict decode says what is wrong
	}
	return walkKeys(v, t)
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func walkKeys(v any, t reflect.Type) (string, string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return "", "" // it reads its own form
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return "", ""
		}
		fields := jsonFields(t)
		for _, k := range slices.Sorted(maps.Keys(obj)) { // the same key reported every time
			if ft, ok := fields[k]; ok {
				if key, field := walkKeys(obj[k], ft); key != "" {
					return key, field
				}
				continue
			}
			for name := range fields {
				if strings.EqualFold(name, k) {
					return k, name
				}
			}
		}
	case reflect.Slice, reflect.Array:
		if arr, ok := v.([]any); ok {
			for _, e := range arr {
				if key, field := walkKeys(e, t.Elem()); key != "" {
					return key, field
				}
			}
		}
	case reflect.Map:
		if obj, ok := v.(map[string]any); ok {
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				if key, field := walkKeys(obj[k], t.Elem()); key != "" {
					return key, field
				}
			}
		}
	}
	return "", ""
}

// jsonFields maps struct t's JSON field names (embedded structs' fields
// included, as encoding/json flattens them) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if ft := f.Type; f.Anonymous && name == "" {
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

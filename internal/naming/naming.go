// Package naming holds the rules that name a call's function from its
// request: the path prefixes (/function/NAME, /async-function/NAME) and
// Host labels (NAME.NAMESPACE.DOMAIN). The data plane routes by them and
// the gateway hashes on exactly the same name, so both ways of naming a
// function reach one data plane.
package naming

import (
	"strconv"
	"strings"
)

// FunctionPrefix starts an OpenFaaS-style path: /function/NAME[/rest].
const FunctionPrefix = "/function/"

// AsyncPrefix starts an OpenFaaS-style asynchronous call: /async-function/NAME[/rest].
const AsyncPrefix = "/async-function/"

// PathName is the short name of the function a path segment names (NAME
// of /function/NAME.NAMESPACE): the gateway hashes on it, so that both
// ways of naming a function reach one data plane.
func PathName[S string | []byte](seg S) S {
	for i := 0; i < len(seg); i++ {
		if seg[i] == '.' {
			return seg[:i]
		}
	}
	return seg
}

// HostLabel returns the first DNS label of a Host header, lower-cased
// (Knative style: NAME.namespace.example.com, NAME:8080). It allocates only
// for a Host with upper-case letters.
func HostLabel(h string) string {
	first, _ := HostLabels(h)
	return first
}

// HostLabels returns the first DNS label of a Host header and its first
// two (NAME and NAME.NAMESPACE of NAME.NAMESPACE.example.com; both NAME
// for NAME:8080), lower-cased. It allocates only for a Host with
// upper-case letters.
func HostLabels(h string) (first, two string) {
	end, dot := len(h), -1
	for i := 0; i < len(h); i++ {
		if c := h[i]; c == ':' {
			end = i
			break
		} else if c == '.' {
			if dot >= 0 {
				end = i
				break
			}
			dot = i
		}
	}
	h = h[:end]
	for i := 0; i < len(h); i++ {
		if c := h[i]; 'A' <= c && c <= 'Z' {
			h = strings.ToLower(h)
			break
		}
	}
	if dot < 0 {
		return h, h
	}
	return h[:dot], h
}

// NamesFunction reports whether a Host label could be a function name, as
// opposed to an IP address or localhost.
func NamesFunction(label string) bool {
	if label == "" || label == "localhost" || strings.HasPrefix(label, "[") {
		return false
	}
	_, err := strconv.Atoi(label)
	return err != nil
}

// Package httpx holds what the data plane and the gateway share on the
// invocation path: the rules that name a request's function (so the gateway
// hashes on exactly the name the data plane routes by), the proxies'
// copy-buffer pool, per-code counters and metrics registry setup, and the
// pieces of their HTTP/1.1 upstream hop (relay.go).
package httpx

import (
	"strconv"
	"strings"
	"sync"
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

const copyBufSize = 32 << 10

// BufferPool recycles httputil.ReverseProxy copy buffers. It pools array
// pointers, which box without allocating, unlike []byte.
type BufferPool struct{ p sync.Pool }

// Get returns a 32 KiB buffer.
func (b *BufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[copyBufSize]byte); ok {
		return v[:]
	}
	return new([copyBufSize]byte)[:]
}

// Put returns a buffer Get gave out.
func (b *BufferPool) Put(buf []byte) {
	if cap(buf) >= copyBufSize {
		b.p.Put((*[copyBufSize]byte)(buf[:copyBufSize]))
	}
}

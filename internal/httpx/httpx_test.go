package httpx

import "testing"

func TestHostLabel(t *testing.T) {
	for in, want := range map[string]string{
		"hello.brisk.local": "hello", "Hello.Example.COM": "hello", "hello:8080": "hello",
		"hello": "hello", "": "", "127.0.0.1:8080": "127", "[::1]:8080": "[", "HeLLo": "hello",
	} {
		if got := HostLabel(in); got != want {
			t.Errorf("HostLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNamesFunction(t *testing.T) {
	for in, want := range map[string]bool{"hello": true, "f-1": true, "": false, "localhost": false, "127": false, "[": false} {
		if got := NamesFunction(in); got != want {
			t.Errorf("NamesFunction(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestBufferPoolRecycles(t *testing.T) {
	var p BufferPool
	b := p.Get()
	if len(b) != copyBufSize {
		t.Fatalf("buffer of %d bytes, want %d", len(b), copyBufSize)
	}
	p.Put(b)
	p.Put(make([]byte, 10)) // too small: dropped, not handed out later
	if got := p.Get(); len(got) != copyBufSize {
		t.Fatalf("recycled buffer of %d bytes", len(got))
	}
}

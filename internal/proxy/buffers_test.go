package proxy

import "testing"

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

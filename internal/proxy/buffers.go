package proxy

import "sync"

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

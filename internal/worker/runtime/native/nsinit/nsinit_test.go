package nsinit

import (
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFilterEncodingRoundTrips(t *testing.T) {
	prog := []unix.SockFilter{{Code: 0x20, K: 4}, {Code: 0x15, Jt: 1, Jf: 255, K: 0xc000003e}, {Code: 0x6, K: 0x7fff0000}}
	b := EncodeFilter(prog)
	if len(b) != 8*len(prog) {
		t.Fatalf("encoded %d bytes, want %d", len(b), 8*len(prog))
	}
	if got := decodeFilter(b); !slices.Equal(got, prog) {
		t.Errorf("decode(encode(p)) = %v, want %v", got, prog)
	}
}

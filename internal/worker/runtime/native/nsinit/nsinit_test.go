package nsinit

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFilterEncoding(t *testing.T) {
	prog := []unix.SockFilter{{Code: 0x20, K: 4}, {Code: 0x15, Jt: 1, Jf: 255, K: 0xc000003e}}
	b := EncodeFilter(prog)
	want := binary.NativeEndian.AppendUint16(nil, 0x20)
	want = append(want, 0, 0)
	want = binary.NativeEndian.AppendUint32(want, 4)
	want = binary.NativeEndian.AppendUint16(want, 0x15)
	want = append(want, 1, 255)
	want = binary.NativeEndian.AppendUint32(want, 0xc000003e)
	if !bytes.Equal(b, want) {
		t.Errorf("EncodeFilter = %x, want %x (struct sock_filter)", b, want)
	}
}

// TestEncodeLayout decodes a message by hand in the layout init.c reads.
func TestEncodeLayout(t *testing.T) {
	b := &Bind{Lower: "/img", Argv: []string{"f", "-x"}, Env: []string{"A=1"}, Dir: "/w", ExecFD: true,
		UID: 1000, GID: 1001, Hostname: "h", Caps: []int{0, 40}, Seccomp: make([]byte, 16),
		Secrets: []Secret{{Name: "k", Size: 7}}, Etc: []File{{Name: "resolv.conf", Data: "nameserver 10.0.0.1\n"}},
		Mounts: []Mount{{Source: "/state/code/ab", Target: "/var/task"}}}
	msg, err := b.Encode()
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(msg)
	next := func(n int) []byte {
		p := make([]byte, n)
		if _, err := r.Read(p); err != nil && n > 0 {
			t.Fatalf("cut short: %v", err)
		}
		return p
	}
	u32 := func() uint32 { return binary.NativeEndian.Uint32(next(4)) }
	str := func() string { return string(next(int(u32()))) }
	if m := string(next(4)); m != bindMagic {
		t.Fatalf("magic %q", m)
	}
	var got []string
	got = append(got, str())
	for range 2 {
		for n := u32(); n > 0; n-- {
			got = append(got, str())
		}
	}
	got = append(got, str())
	if strings.Join(got, "|") != "/img|f|-x|A=1|/w" {
		t.Errorf("strings %q", got)
	}
	if f, uid, gid := u32(), u32(), u32(); f != 1 || uid != 1000 || gid != 1001 {
		t.Errorf("flags %d uid %d gid %d", f, uid, gid)
	}
	if h := str(); h != "h" {
		t.Errorf("hostname %q", h)
	}
	if caps := binary.NativeEndian.Uint64(next(8)); caps != 1|1<<40 {
		t.Errorf("caps %x", caps)
	}
	if n := u32(); n != 16 {
		t.Errorf("seccomp %d bytes", n)
	}
	next(16)
	if n, name, size := u32(), str(), binary.NativeEndian.Uint64(next(8)); n != 1 || name != "k" || size != 7 {
		t.Errorf("secrets %d %q %d", n, name, size)
	}
	if n, name, data := u32(), str(), str(); n != 1 || name != "resolv.conf" || data != "nameserver 10.0.0.1\n" {
		t.Errorf("etc files %d %q %q", n, name, data)
	}
	if n, src, dst := u32(), str(), str(); n != 1 || src != "/state/code/ab" || dst != "/var/task" {
		t.Errorf("mounts %d %q %q", n, src, dst)
	}
	if r.Len() != 0 {
		t.Errorf("%d bytes left over", r.Len())
	}
}

func TestEncodeRefuses(t *testing.T) {
	for name, b := range map[string]*Bind{
		"NUL in an argument": {Argv: []string{"a\x00b"}},
		"NUL in the env":     {Argv: []string{"a"}, Env: []string{"A=\x00"}},
		"no arguments":       {},
		"capability 64":      {Argv: []string{"a"}, Caps: []int{64}},
		"torn seccomp":       {Argv: []string{"a"}, Seccomp: make([]byte, 9)},
		"too big":            {Argv: []string{strings.Repeat("a", MaxMessage)}},
		"relative mount":     {Argv: []string{"a"}, Mounts: []Mount{{Source: "code", Target: "/var/task"}}},
		"mount escaping":     {Argv: []string{"a"}, Mounts: []Mount{{Source: "/code", Target: "/var/../etc"}}},
	} {
		if _, err := b.Encode(); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

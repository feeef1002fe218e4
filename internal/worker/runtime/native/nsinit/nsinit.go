// Package nsinit is the first program of a native sandbox: a parked process,
// already in the sandbox's namespaces and cgroup, that waits for the worker
// to bind it to a function and then builds the root file system, drops its
// privileges and execs the function's entrypoint. The init itself is C
// (init.c), run from a constructor before the Go runtime of the binary it
// is linked into starts, so that a parked shell costs a third of a Go
// program's start; this package's Go side is the bind message the worker
// sends it. The worker does everything that needs more (image resolution,
// the seccomp program).
package nsinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Subcommand is the first argument that makes a binary linking this package
// (built with cgo) the init: brisk-sandbox-init, brisk itself when that is
// not installed, and the native runtime's test binary.
const Subcommand = "__native-init"

// BinaryName is the lean init binary the worker prefers (cmd/brisk-sandbox-init).
const BinaryName = "brisk-sandbox-init"

// ControlFD is the descriptor of the init's end of the control socket.
const ControlFD = 3

// TemplateFD is where a template finds its control socket (Bind.Template).
const TemplateFD = 10

// MaxMessage bounds the bind message (the seccomp program is most of it),
// below a SOCK_SEQPACKET socket's default send buffer (net.core.wmem_default,
// 208 KiB), so that a message Encode accepts can be sent.
// Secrets' values do not travel in it (Bind.Secrets).
const MaxMessage = 192 << 10

// SecretsDir is where a sandbox finds its secrets: spec.SecretsDir, which
// this package, linking only the standard library and x/sys, cannot import
// (the native runtime's tests check that the two agree).
const SecretsDir = "/var/openfaas/secrets"

// Secret is one file of SecretsDir: its name (a single path element) and
// the length of its value in the secrets descriptor.
type Secret struct {
	Name string
	Size int64
}

// Bind is what the worker sends to bind a parked init to a function, as
// Encode lays it out. The message carries the log file (for stdout and stderr), with ExecFD the
// executable, and with Secrets the secrets descriptor as SCM_RIGHTS
// descriptors, in that order.
type Bind struct {
	// Lower is the read-only lower layer of the root file system: an
	// unpacked image, or "/" to run on the host's root file system.
	Lower string
	// Argv, Env and Dir are the entrypoint; Argv[0] is looked up in the
	// PATH of Env inside the new root when it has no slash.
	Argv []string
	Env  []string
	Dir  string
	// ExecFD says Argv[0] is to be executed from the passed descriptor (a
	// binary the sandbox's user could not reach by path).
	ExecFD bool
	// Template makes the process a function's template (docs/languages.md):
	// the last descriptor passed is its control socket, which the function
	// finds at TemplateFD, and after dropping privileges it becomes root
	// of a user namespace of its own, mapped to UID and GID, before the
	// seccomp program is loaded.
	Template bool
	// Standby passes the last descriptor as a control socket at
	// TemplateFD too, with nothing else of a template: the process is a
	// sandbox parked until the worker hands it one (a Node standby,
	// package forkserver).
	Standby  bool
	UID      uint32
	GID      uint32
	Hostname string
	// Caps are the capabilities kept in the bounding set, and, for uid 0,
	// in the effective, permitted and inheritable sets.
	Caps []int
	// Seccomp is the classic BPF filter loaded just before exec, in the
	// kernel's struct sock_filter layout (EncodeFilter); empty means none.
	// The worker encodes it once, for every sandbox.
	Seccomp []byte
	// Secrets are the files of SecretsDir, in the order their values
	// follow one another in the secrets descriptor: a sealed memfd the
	// worker wrote them to. Up to 32 MiB of values would not fit a
	// datagram (MaxMessage), and in a memfd they never touch a disk. The
	// init mounts a tmpfs on SecretsDir in the new root, writes the files
	// (0444) and remounts it read-only before it drops privileges; the
	// mount lives and ends with the sandbox's mount namespace, which no
	// later sandbox shares (a shell is never bound twice).
	Secrets []Secret
	// Etc are files the init writes into the new root's /etc (its
	// writable layer) before the function starts, replacing what the
	// lower layer has there: the sandbox network's resolv.conf and hosts.
	// Names are plain file names; at most 16, their data without NUL.
	Etc []File
	// Mounts are host directories bound read-only into the new root
	// before the pivot (runtime.Spec.Mounts): at most 8, absolute paths.
	Mounts []Mount
}

// Mount is one of Bind.Mounts.
type Mount struct {
	Source, Target string
}

// File is one of Bind.Etc.
type File struct {
	Name, Data string
}

// EncodeFilter lays a BPF program out as the kernel's struct sock_filter
// array (u16 code, u8 jt, u8 jf, u32 k, native byte order), for Bind.Seccomp.
func EncodeFilter(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		out = binary.NativeEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out
}

// bindMagic opens every bind message: the layout's version (init.c checks it).
const bindMagic = "BRB3" // the version of the message: an init of another one refuses it by name

// Encode lays b out for init.c: bindMagic, then the fields in Bind's order,
// native byte order, strings and byte strings as a u32 length and the bytes,
// lists as a u32 count and the items, Caps as a u64 bit mask, ExecFD as bit
// 0 of a u32. Strings cannot hold NUL (the init passes them to C).
func (b *Bind) Encode() ([]byte, error) {
	e := encoder{out: append(make([]byte, 0, 1024+len(b.Seccomp)), bindMagic...)}
	e.str(b.Lower)
	e.strs(b.Argv)
	e.strs(b.Env)
	e.str(b.Dir)
	var flags uint32
	if b.ExecFD {
		flags |= 1
	}
	if b.Template {
		flags |= 2
	}
	if b.Standby {
		flags |= 4
	}
	e.u32(flags)
	e.u32(b.UID)
	e.u32(b.GID)
	e.str(b.Hostname)
	var caps uint64
	for _, c := range b.Caps {
		if c < 0 || c > 63 {
			return nil, fmt.Errorf("bind message: capability %d", c)
		}
		caps |= 1 << c
	}
	e.out = binary.NativeEndian.AppendUint64(e.out, caps)
	if len(b.Seccomp)%8 != 0 {
		return nil, fmt.Errorf("bind message: seccomp program of %d bytes", len(b.Seccomp))
	}
	e.u32(uint32(len(b.Seccomp)))
	e.out = append(e.out, b.Seccomp...)
	e.u32(uint32(len(b.Secrets)))
	for _, s := range b.Secrets {
		e.str(s.Name)
		e.out = binary.NativeEndian.AppendUint64(e.out, uint64(s.Size))
	}
	if len(b.Etc) > 16 {
		return nil, fmt.Errorf("bind message: %d files for /etc", len(b.Etc))
	}
	e.u32(uint32(len(b.Etc)))
	for _, f := range b.Etc {
		if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\x00") || strings.Contains(f.Data, "\x00") {
			return nil, fmt.Errorf("bind message: bad /etc file %q", f.Name)
		}
		e.str(f.Name)
		e.str(f.Data)
	}
	if len(b.Mounts) > 8 {
		return nil, fmt.Errorf("bind message: %d mounts", len(b.Mounts))
	}
	e.u32(uint32(len(b.Mounts)))
	for _, m := range b.Mounts {
		if !strings.HasPrefix(m.Source, "/") || !strings.HasPrefix(m.Target, "/") || strings.Contains(m.Target, "..") {
			return nil, fmt.Errorf("bind message: mount %q on %q: want absolute paths", m.Source, m.Target)
		}
		e.str(m.Source)
		e.str(m.Target)
	}
	if e.err != nil {
		return nil, e.err
	}
	if len(b.Argv) == 0 {
		return nil, errors.New("bind message: no arguments")
	}
	if len(e.out) > MaxMessage {
		return nil, fmt.Errorf("bind message of %d bytes", len(e.out))
	}
	return e.out, nil
}

type encoder struct {
	out []byte
	err error
}

func (e *encoder) u32(v uint32) { e.out = binary.NativeEndian.AppendUint32(e.out, v) }

func (e *encoder) str(s string) {
	if strings.IndexByte(s, 0) >= 0 && e.err == nil {
		e.err = fmt.Errorf("bind message: %q holds a NUL byte", s)
	}
	e.u32(uint32(len(s)))
	e.out = append(e.out, s...)
}

func (e *encoder) strs(v []string) {
	e.u32(uint32(len(v)))
	for _, s := range v {
		e.str(s)
	}
}

// Main is reached only in a binary built without cgo, which has no init:
// it tells the worker so and ends.
func Main() {
	msg := "init: this binary was built without cgo and cannot be a native sandbox's init (build brisk-sandbox-init with CGO_ENABLED=1)"
	_, _ = unix.Write(ControlFD, []byte(msg))
	fmt.Fprintln(os.Stderr, "brisk sandbox", msg)
	os.Exit(127)
}

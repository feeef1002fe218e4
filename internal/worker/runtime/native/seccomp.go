package native

import (
	"fmt"

	ctrdseccomp "github.com/containerd/containerd/contrib/seccomp"
	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// defaultCaps are the capabilities runc and containerd give a container by
// default, less CAP_MKNOD; a sandbox's bounding set is cut to them, and a
// sandbox running as uid 0 has exactly them. runc keeps CAP_MKNOD because
// its device cgroup allows only the default devices; this runtime has no
// device cgroup, so a root sandbox with CAP_MKNOD could make the host's
// disk a node of its /dev.
var defaultCaps = []struct {
	name string
	nr   int
}{
	{"CAP_CHOWN", unix.CAP_CHOWN}, {"CAP_DAC_OVERRIDE", unix.CAP_DAC_OVERRIDE}, {"CAP_FSETID", unix.CAP_FSETID},
	{"CAP_FOWNER", unix.CAP_FOWNER}, {"CAP_NET_RAW", unix.CAP_NET_RAW},
	{"CAP_SETGID", unix.CAP_SETGID}, {"CAP_SETUID", unix.CAP_SETUID}, {"CAP_SETFCAP", unix.CAP_SETFCAP},
	{"CAP_SETPCAP", unix.CAP_SETPCAP}, {"CAP_NET_BIND_SERVICE", unix.CAP_NET_BIND_SERVICE},
	{"CAP_SYS_CHROOT", unix.CAP_SYS_CHROOT}, {"CAP_KILL", unix.CAP_KILL}, {"CAP_AUDIT_WRITE", unix.CAP_AUDIT_WRITE},
}

func defaultCapNumbers() []int {
	out := make([]int, len(defaultCaps))
	for i, c := range defaultCaps {
		out[i] = c.nr
	}
	return out
}

// defaultSeccomp compiles containerd's default seccomp profile, for a
// container with the default capabilities (and extra ones: a template's
// CAP_SYS_ADMIN, which it holds in its own user namespace only), into a classic BPF program for
// this machine's architecture. Rules the compiler cannot express (none in
// the profile today) are left out, which denies what they would allow.
func defaultSeccomp(extra ...string) ([]unix.SockFilter, error) {
	names := make([]string, len(defaultCaps))
	for i, c := range defaultCaps {
		names[i] = c.name
	}
	names = append(names, extra...)
	sp := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{
		Bounding: names, Effective: names, Permitted: names,
	}}}
	return compileSeccomp(ctrdseccomp.DefaultProfile(sp))
}

// compileSeccomp turns an OCI seccomp profile into BPF with
// elastic/go-seccomp-bpf, which takes the same rules in its own terms.
func compileSeccomp(p *specs.LinuxSeccomp) ([]unix.SockFilter, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, err
	}
	pol := seccomp.Policy{DefaultAction: def}
	for _, rule := range p.Syscalls {
		act, err := action(rule.Action, rule.ErrnoRet)
		if err != nil {
			continue
		}
		conds, ok := conditions(rule.Args)
		if !ok {
			continue
		}
		g := seccomp.SyscallGroup{Action: act}
		for _, name := range rule.Names {
			if _, known := info.SyscallNames[name]; !known {
				continue // not a syscall of this architecture
			}
			if conds == nil {
				g.Names = append(g.Names, name)
			} else {
				g.NamesWithCondtions = append(g.NamesWithCondtions, seccomp.NameWithConditions{Name: name, Conditions: conds})
			}
		}
		if len(g.Names) > 0 || len(g.NamesWithCondtions) > 0 {
			pol.Syscalls = append(pol.Syscalls, g)
		}
	}
	insns, err := pol.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}

func action(a specs.LinuxSeccompAction, errno *uint) (seccomp.Action, error) {
	switch a {
	case specs.ActAllow:
		return seccomp.ActionAllow, nil
	case specs.ActErrno:
		e := uint(unix.EPERM)
		if errno != nil {
			e = *errno
		}
		if e == uint(unix.EPERM) {
			return seccomp.ActionErrno, nil // the library's Validate knows only the bare action; it adds EPERM
		}
		return seccomp.ActionErrno | seccomp.Action(e&0xffff), nil
	case specs.ActKillProcess:
		return seccomp.ActionKillProcess, nil
	case specs.ActKill, specs.ActKillThread:
		return seccomp.ActionKillThread, nil
	case specs.ActLog:
		return seccomp.ActionLog, nil
	}
	return 0, fmt.Errorf("seccomp action %s: not supported", a)
}

// conditions maps OCI argument rules (all must hold) to the library's; ok is
// false for a rule it cannot express. A nil result means "no conditions".
func conditions(args []specs.LinuxSeccompArg) (seccomp.ArgumentConditions, bool) {
	if len(args) == 0 {
		return nil, true
	}
	var out seccomp.ArgumentConditions
	for _, a := range args {
		c := seccomp.Condition{Argument: uint32(a.Index), Value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.Operation = seccomp.Equal
		case specs.OpNotEqual:
			c.Operation = seccomp.NotEqual
		case specs.OpLessThan:
			c.Operation = seccomp.LessThan
		case specs.OpLessEqual:
			c.Operation = seccomp.LessOrEqual
		case specs.OpGreaterThan:
			c.Operation = seccomp.GreaterThan
		case specs.OpGreaterEqual:
			c.Operation = seccomp.GreaterOrEqual
		case specs.OpMaskedEqual:
			if a.ValueTwo != 0 {
				return nil, false // (arg & mask) == v with v != 0
			}
			c.Operation = seccomp.BitsNotSet // (arg & mask) == 0
		default:
			return nil, false
		}
		out = append(out, c)
	}
	return out, true
}

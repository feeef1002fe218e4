package containerd

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/pkg/spec"
)

const (
	cfsPeriod = 100_000 // µs; the kernel's default CFS period
	// tmpSizeMB sizes /tmp when the sandbox has no memory limit; with one,
	// /tmp may fill the limit (tmpfs pages are charged to the cgroup).
	tmpSizeMB = 64
)

// specOpts builds the container's OCI spec on containerd's defaults (runc's
// default capabilities, masked and read-only /proc and /sys paths) plus:
// the image's entrypoint, env and working directory; the function's env
// and the sandbox's own variables, which a function cannot override; the
// pooled network namespace; the function's limits as cgroup limits; the
// default seccomp profile; and a read-only root file system (unless the
// spec asks for a writable one) with a tmpfs on /tmp; with secrets, their
// directory bound read-only on spec.SecretsDir (secrets.go); the sandbox
// network's /etc/resolv.conf and /etc/hosts, bound read-only (netfiles.go);
// the spec's Mounts (a function from source's code and runner), bound
// read-only; and the spec's Command, which replaces the image's.
func (r *Runtime) specOpts(img containerd.Image, s runtime.Spec, sb *sandbox) []oci.SpecOpts {
	f := s.Function
	env := make([]string, 0, len(f.Env)+3)
	for _, k := range slices.Sorted(maps.Keys(f.Env)) {
		env = append(env, k+"="+f.Env[k])
	}
	env = append(env,
		tracefn.EnvPort+"="+strconv.Itoa(f.Port),
		tracefn.EnvSandboxID+"="+s.ID,
		tracefn.EnvFunction+"="+f.Name,
	)
	lim := f.SandboxLimits()
	tmpMB := int64(tmpSizeMB)
	if lim.MemoryMB > 0 {
		tmpMB = lim.MemoryMB
	}
	mounts := []specs.Mount{{
		Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(tmpMB, 10) + "m"},
	}}
	mounts = append(mounts, netMounts(r.cfg.StateDir, r.cfg.Pool)...)
	if len(f.Secrets) > 0 {
		env = append(env, runtime.EnvSecretsDir+"="+spec.SecretsDir)
		mounts = append(mounts, secretsMount(r.secretsDir(s.ID)))
	}
	for _, m := range s.Mounts {
		mounts = append(mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source,
			Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithEnv(env),
		oci.WithHostname(s.ID),
		oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: sb.ep.NetNS}),
		oci.WithCgroup(sb.cgroup),
		oci.WithMounts(mounts),
		// A fork bomb fails at the limit instead of taking the node's pids.
		oci.WithPidsLimit(cgroups.DefaultMaxPids),
		seccomp.WithDefaultProfile(), // after the capabilities, which it reads
	}
	if len(f.Command) > 0 {
		// A function from source: the language runner in its base image
		// (package lang).
		opts = append(opts, oci.WithProcessArgs(f.Command...))
	}
	if !f.WritableRoot {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if lim.MemoryMB > 0 {
		limit := lim.MemoryMB << 20
		opts = append(opts, oci.WithMemoryLimit(uint64(limit)))
		// Swapping would show up as a mysteriously slow function rather than
		// an OOM kill: memory+swap gets the same limit where swap exists.
		if swapOn() && (r.v2 || exists(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))) {
			opts = append(opts, oci.WithMemorySwap(limit))
		}
	}
	if lim.MilliCPU > 0 {
		opts = append(opts, oci.WithCPUCFS(max(lim.MilliCPU*cfsPeriod/1000, 1000), cfsPeriod))
	}
	if f.Resources.MilliCPU > 0 {
		// The request weighs the sandbox's share of a busy CPU, as in
		// Kubernetes: 1024 shares per core.
		opts = append(opts, oci.WithCPUShares(uint64(max(f.Resources.MilliCPU*1024/1000, 2))))
	}
	return opts
}

// swapOn reports whether any swap device is active.
func swapOn() bool {
	b, err := os.ReadFile("/proc/swaps")
	return err == nil && strings.Count(string(b), "\n") > 1
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

package process

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/pkg/spec"
)

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read back limit: %v", err)
	}
	return strings.TrimSpace(string(b))
}

func inCgroup(t *testing.T, pid int, rel string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), ":/"+rel+"\n")
}

// cgroupParent is where the cgroups package puts a sandbox's cgroup:
// brisk/<sandbox-id> in each hierarchy.
const cgroupParent = "brisk"

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestCgroupLimits: the sandbox runs in its cgroup, which holds the
// function's limits (the cgroups package's tests check each file), and
// Kill removes it.
func TestCgroupLimits(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, Config{})
	if r.cg == nil {
		t.Fatalf("running as root but found no usable cgroups under %s", DefaultCgroupRoot)
	}
	f := echoFn("limited", nil)
	f.Resources = spec.Resources{MilliCPU: 100, MemoryMB: 64}
	f.Limits = spec.Resources{MilliCPU: 250} // memory limit defaults to the request
	inst := createReady(t, r, "sb-limited", f)
	pid := get(t, inst.Addr).PID
	cg := r.cg.Open(cgroupParent + "/sb-limited")

	if !inCgroup(t, pid, cg.Rel()) {
		t.Errorf("pid %d not in %s", pid, cg.Rel())
	}
	// Each limit file is there only in the directory of its controller
	// (v1) or with the controller delegated (v2).
	want := map[string]string{
		"cpu.max":               "25000 100000",
		"cpu.cfs_quota_us":      "25000",
		"cpu.cfs_period_us":     "100000",
		"memory.max":            strconv.Itoa(64 << 20),
		"memory.limit_in_bytes": strconv.Itoa(64 << 20),
	}
	var cpuSet, memSet bool
	for _, d := range cg.Dirs() {
		for file, v := range want {
			path := filepath.Join(d, file)
			if !exists(path) {
				continue
			}
			if got := readTrim(t, path); got != v {
				t.Errorf("%s = %q, want %q", path, got, v)
			}
			cpuSet = cpuSet || strings.HasPrefix(file, "cpu.")
			memSet = memSet || strings.HasPrefix(file, "memory.")
		}
	}
	cpu, mem := r.cg.Limits()
	switch {
	case cpu && !cpuSet:
		t.Error("the sandbox's cgroup has no CPU limit")
	case !cpu:
		t.Log("no cgroup cpu controller; CPU limit not checked")
	}
	switch {
	case mem && !memSet:
		t.Error("the sandbox's cgroup has no memory limit")
	case !mem:
		t.Log("no cgroup memory controller; memory limit not checked")
	}

	if err := r.Kill(context.Background(), "sb-limited"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	for _, d := range cg.Dirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s survived Kill (stat: %v)", d, err)
		}
	}
}

// TestCgroupV2CloneInto exercises the v2 path, clone(CLONE_INTO_CGROUP),
// even on hybrid hosts, where the v2 hierarchy has no controllers: the
// sandbox then gets a cgroup but no limits.
func TestCgroupV2CloneInto(t *testing.T) {
	testutil.RequiresRoot(t)
	root := ""
	for _, dir := range []string{DefaultCgroupRoot, filepath.Join(DefaultCgroupRoot, "unified")} {
		if exists(filepath.Join(dir, "cgroup.controllers")) {
			root = dir
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	r := newRuntime(t, Config{CgroupRoot: root})
	if !r.cg.V2() {
		t.Fatalf("%s not detected as cgroup v2", root)
	}
	inst := createReady(t, r, "sb-v2", echoFn("v2", nil))
	pid := get(t, inst.Addr).PID
	if !inCgroup(t, pid, cgroupParent+"/sb-v2") {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		t.Errorf("pid %d not cloned into brisk/sb-v2:\n%s", pid, b)
	}
	if err := r.Kill(context.Background(), "sb-v2"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if exists(filepath.Join(root, cgroupParent, "sb-v2")) {
		t.Error("cgroup survived Kill")
	}
}

func TestOOMKillIsReported(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, Config{})
	if r.cg == nil {
		t.Skip("no cgroups")
	}
	if _, mem := r.cg.Limits(); !mem {
		t.Skip("no cgroup memory controller")
	}
	f := echoFn("hog", nil, "hog")
	f.Resources.MemoryMB = 16
	f.Limits.MemoryMB = 32 // the message names the limit, not the request
	inst := create(t, r, "sb-hog", f)
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "memory hog never ended")
	err := inst.ExitErr()
	t.Logf("ExitErr: %v", err)
	if !errors.Is(err, ErrOOMKilled) || !strings.Contains(err.Error(), "OOM") || !strings.Contains(err.Error(), "memory limit 32 MiB") {
		logs, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", "hog", "sb-hog.log"))
		t.Fatalf("ExitErr = %v, want ErrOOMKilled (log: %q)", err, logs)
	}
}

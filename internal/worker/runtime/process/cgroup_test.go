package process

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/spec"
	"github.com/brisk-faas/brisk/internal/testutil"
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
	cg := r.cg.sandbox(cgroupParent + "/sb-limited")

	if r.cg.v2 {
		d := cg.dirs[0]
		if !inCgroup(t, pid, cg.rel) {
			t.Errorf("pid %d not in %s", pid, cg.rel)
		}
		if r.cg.cpuV2 {
			if got := readTrim(t, filepath.Join(d, "cpu.max")); got != "25000 100000" {
				t.Errorf("cpu.max = %q", got)
			}
		} else {
			t.Log("cgroup v2 cpu controller unavailable; CPU limit not checked")
		}
		if r.cg.memV2 {
			if got := readTrim(t, filepath.Join(d, "memory.max")); got != strconv.Itoa(64<<20) {
				t.Errorf("memory.max = %q", got)
			}
		} else {
			t.Log("cgroup v2 memory controller unavailable; memory limit not checked")
		}
	} else {
		if r.cg.cpuV1 != "" {
			d := filepath.Join(r.cg.cpuV1, cg.rel)
			if got := readTrim(t, filepath.Join(d, "cpu.cfs_quota_us")); got != "25000" {
				t.Errorf("cpu.cfs_quota_us = %q", got)
			}
			if got := readTrim(t, filepath.Join(d, "cpu.cfs_period_us")); got != "100000" {
				t.Errorf("cpu.cfs_period_us = %q", got)
			}
		}
		if r.cg.memV1 != "" {
			if got := readTrim(t, filepath.Join(cg.mem, "memory.limit_in_bytes")); got != strconv.Itoa(64<<20) {
				t.Errorf("memory.limit_in_bytes = %q", got)
			}
		}
		if !inCgroup(t, pid, cg.rel) {
			t.Errorf("pid %d not in %s", pid, cg.rel)
		}
	}

	if err := r.Kill(context.Background(), "sb-limited"); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	for _, d := range cg.dirs {
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
	if !r.cg.v2 {
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
	if r.cg == nil || (r.cg.v2 && !r.cg.memV2) || (!r.cg.v2 && r.cg.memV1 == "") {
		t.Skip("no cgroup memory controller")
	}
	f := echoFn("hog", nil, "hog")
	f.Resources.MemoryMB = 32
	inst := create(t, r, "sb-hog", f)
	testutil.Eventually(t, waitLong, func() bool { return closed(inst.Exited) }, "memory hog never ended")
	err := inst.ExitErr()
	t.Logf("ExitErr: %v", err)
	if !errors.Is(err, ErrOOMKilled) || !strings.Contains(err.Error(), "OOM") {
		logs, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", "hog", "sb-hog.log"))
		t.Fatalf("ExitErr = %v, want ErrOOMKilled (log: %q)", err, logs)
	}
}

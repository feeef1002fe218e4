package cgroups

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
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

// testName is a cgroup name no other test run uses.
func testName(what string) string {
	return "test-" + strconv.Itoa(os.Getpid()) + "-" + what
}

func warn(t *testing.T) func(msg string, args ...any) {
	return func(msg string, args ...any) { t.Log(append([]any{msg}, args...)...) }
}

func detect(t *testing.T, root string) *Hierarchy {
	t.Helper()
	h, err := Detect(root, warn(t))
	if err != nil {
		t.Fatalf("running as root but found no usable cgroups under %s: %v", root, err)
	}
	return h
}

// v2Root finds a mounted cgroup v2 hierarchy, "" if none.
func v2Root() string {
	for _, dir := range []string{DefaultRoot, filepath.Join(DefaultRoot, "unified")} {
		if exists(filepath.Join(dir, "cgroup.controllers")) {
			return dir
		}
	}
	return ""
}

// mountV1 mounts a named cgroup v1 hierarchy without controllers, as
// V1ForTest takes it.
func mountV1(t *testing.T) string {
	t.Helper()
	mnt := t.TempDir()
	if err := syscall.Mount("cgroup", mnt, "cgroup", 0, "none,name=brisk-cgroups-test"); err != nil {
		t.Skipf("cannot mount a named cgroup v1 hierarchy (kernel without cgroup v1, or no CAP_SYS_ADMIN here): %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Rmdir(filepath.Join(mnt, cgroupParent))
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return mnt
}

// startIn starts cmd in s, born there: cloned into its directory on v2,
// forked by a thread that joined it on v1.
func startIn(s *Cgroup, cmd *exec.Cmd) (err error) {
	if s.cg.V2() {
		fd, err := s.OpenDir()
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		return cmd.Start()
	}
	procs.SpawnThread(func() {
		leave, jerr := s.JoinThread()
		if jerr != nil {
			err = jerr
			return
		}
		err = cmd.Start()
		if lerr := leave(); lerr != nil && err == nil {
			err = lerr
		}
	})
	return err
}

func TestCreateLimits(t *testing.T) {
	testutil.RequiresRoot(t)
	cg := detect(t, DefaultRoot)
	s, err := cg.Create(testName("limits"), spec.Resources{MilliCPU: 250, MemoryMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.RemoveNow() })
	if want := cgroupParent + "/" + testName("limits"); s.Rel() != want {
		t.Errorf("Rel = %q, want %q", s.Rel(), want)
	}
	for _, d := range s.Dirs() {
		if !exists(d) {
			t.Errorf("Create did not make %s", d)
		}
	}
	if cg.v2 {
		d := s.dirs[0]
		if cg.cpuV2 {
			if got := readTrim(t, filepath.Join(d, "cpu.max")); got != "25000 100000" {
				t.Errorf("cpu.max = %q", got)
			}
		} else {
			t.Log("cgroup v2 cpu controller unavailable; CPU limit not checked")
		}
		if cg.memV2 {
			if got := readTrim(t, filepath.Join(d, "memory.max")); got != strconv.Itoa(64<<20) {
				t.Errorf("memory.max = %q", got)
			}
		} else {
			t.Log("cgroup v2 memory controller unavailable; memory limit not checked")
		}
	} else {
		if cg.cpuV1 != "" {
			d := filepath.Join(cg.cpuV1, s.rel)
			if got := readTrim(t, filepath.Join(d, "cpu.cfs_quota_us")); got != "25000" {
				t.Errorf("cpu.cfs_quota_us = %q", got)
			}
			if got := readTrim(t, filepath.Join(d, "cpu.cfs_period_us")); got != "100000" {
				t.Errorf("cpu.cfs_period_us = %q", got)
			}
			// The kernel's minimum quota is 1 ms.
			if err := s.Limit(spec.Resources{MilliCPU: 1}); err != nil {
				t.Fatal(err)
			}
			if got := readTrim(t, filepath.Join(d, "cpu.cfs_quota_us")); got != "1000" {
				t.Errorf("cpu.cfs_quota_us for 1 milli-CPU = %q, want the minimum 1000", got)
			}
		}
		if cg.memV1 != "" {
			if got := readTrim(t, filepath.Join(s.mem, "memory.limit_in_bytes")); got != strconv.Itoa(64<<20) {
				t.Errorf("memory.limit_in_bytes = %q", got)
			}
		}
	}
	if cpu, mem := cg.Limits(); cpu != (cg.cpuV2 || cg.cpuV1 != "") || mem != (cg.memV2 || cg.memV1 != "") {
		t.Errorf("Limits = %v, %v; want what was detected", cpu, mem)
	}
	if n, exact := s.OOMKills(); n != 0 || !exact {
		t.Errorf("OOMKills of a new cgroup = %d, %v; want 0, true", n, exact)
	}
	if err := s.RemoveNow(); err != nil {
		t.Fatal(err)
	}
	for _, d := range s.Dirs() {
		if exists(d) {
			t.Errorf("RemoveNow left %s", d)
		}
	}
	if err := s.RemoveNow(); err != nil {
		t.Errorf("RemoveNow of a removed cgroup: %v", err)
	}
}

// On v1 a child forked by a thread that joined the cgroup is in it in
// every hierarchy, the forking thread is not once it left, and Remove
// kills what runs in it.
func TestJoinThreadV1(t *testing.T) {
	testutil.RequiresRoot(t)
	hs := map[string]*Hierarchy{"named": V1ForTest(mountV1(t))}
	if h, err := Detect(DefaultRoot, warn(t)); err == nil && !h.V2() {
		hs["detected"] = h
	}
	for name, h := range hs {
		t.Run(name, func(t *testing.T) {
			s, err := h.Create(testName("join-"+name), spec.Resources{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Remove(context.Background()) })
			cmd := exec.Command("sleep", "1000")
			if err := startIn(s, cmd); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(b), ":/"+s.Rel()+"\n"); n != len(s.Dirs()) {
				t.Errorf("child in %s in %d of %d hierarchies:\n%s", s.Rel(), n, len(s.Dirs()), b)
			}
			if got := s.Procs(); !slices.Contains(got, cmd.Process.Pid) || slices.Contains(got, os.Getpid()) {
				t.Errorf("Procs = %v, want the child %d and not the test %d", got, cmd.Process.Pid, os.Getpid())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Remove(ctx); err != nil {
				t.Fatal(err)
			}
			var ee *exec.ExitError
			if err := <-exited; !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Errorf("child ended with %v, want SIGKILL", err)
			}
			for _, d := range s.Dirs() {
				if exists(d) {
					t.Errorf("Remove left %s", d)
				}
			}
		})
	}
}

// On v2 a child cloned into the cgroup's directory (OpenDir) is in it from
// its start, and Kill ends it.
func TestOpenDirV2(t *testing.T) {
	testutil.RequiresRoot(t)
	root := v2Root()
	if root == "" {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	h := detect(t, root)
	if !h.V2() {
		t.Fatalf("%s not detected as cgroup v2", root)
	}
	s, err := h.Create(testName("clone"), spec.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background()) })
	fd, err := s.OpenDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	err = cmd.Start()
	_ = syscall.Close(fd)
	if errors.Is(err, syscall.ENOSYS) {
		t.Skip("no clone3 here")
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Procs(); !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("Procs = %v, want [%d]", got, cmd.Process.Pid)
	}
	s.Kill()
	if err := cmd.Wait(); err == nil {
		t.Error("the child survived Kill")
	}
	if err := s.RemoveNow(); err != nil {
		t.Errorf("RemoveNow after Kill: %v", err)
	}
}

// Freeze stops a v1 cgroup with a freezer; its processes run again once
// thawed.
func TestFreeze(t *testing.T) {
	testutil.RequiresRoot(t)
	h := detect(t, DefaultRoot)
	if !h.v2 && h.freezerV1 == "" && exists(filepath.Join(DefaultRoot, "freezer", "tasks")) {
		// Detect looks for freezer.state, which the hierarchy's root
		// cgroup lacks: only its children have one.
		h = &Hierarchy{freezerV1: filepath.Join(DefaultRoot, "freezer")}
	}
	if h.v2 || h.freezerV1 == "" {
		t.Skip("no v1 freezer")
	}
	s, err := h.Create(testName("freeze"), spec.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background()) })
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	if err := s.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	state := func() string { return readTrim(t, filepath.Join(s.freezer, "freezer.state")) }
	thaw := s.Freeze()
	if got := state(); got != "FROZEN" {
		t.Errorf("freezer.state after Freeze = %q", got)
	}
	thaw()
	if got := state(); got != "THAWED" {
		t.Errorf("freezer.state after thaw = %q", got)
	}
}

func TestOOMKillsWithoutMemoryController(t *testing.T) {
	if n, exact := V1ForTest(t.TempDir()).Open("brisk/x").OOMKills(); n != 0 || !exact {
		t.Errorf("OOMKills without memory = %d, %v; want 0, true", n, exact)
	}
}

func TestField(t *testing.T) {
	b := []byte("oom 3\noom_kill 2\noom_group_kill 0\n")
	if n, ok := field(b, "oom_kill"); n != 2 || !ok {
		t.Errorf("field oom_kill = %d, %v", n, ok)
	}
	if _, ok := field(b, "absent"); ok {
		t.Error("field found an absent key")
	}
	if !hasLine([]byte("populated 1\nfrozen 1\n"), "frozen 1") || hasLine([]byte("frozen 0\n"), "frozen 1") {
		t.Error("hasLine")
	}
}

// A reset cgroup reads as a new one with no limits does.
func TestReset(t *testing.T) {
	testutil.RequiresRoot(t)
	cg := detect(t, DefaultRoot)
	fresh, err := cg.Create(testName("reset-fresh"), spec.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fresh.RemoveNow() })
	s, err := cg.Create(testName("reset"), spec.Resources{MilliCPU: 250, MemoryMB: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.RemoveNow() })
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"cpu.max": s.dirs[0], "memory.max": s.dirs[0]}
	if !cg.v2 {
		files = map[string]string{"memory.limit_in_bytes": s.mem, "memory.memsw.limit_in_bytes": s.mem}
		if cg.cpuV1 != "" {
			files["cpu.cfs_quota_us"] = filepath.Join(cg.cpuV1, s.rel)
		}
	}
	checked := 0
	for file, dir := range files {
		want, err := os.ReadFile(filepath.Join(strings.Replace(dir, testName("reset"), testName("reset-fresh"), 1), file))
		if err != nil {
			continue // the controller or swap accounting is absent
		}
		if got := readTrim(t, filepath.Join(dir, file)); got != strings.TrimSpace(string(want)) {
			t.Errorf("%s after Reset = %q, want a new cgroup's %q", file, got, strings.TrimSpace(string(want)))
		}
		checked++
	}
	if checked == 0 {
		t.Skip("no cpu or memory controller to check")
	}
	// Limits set after a reset apply.
	if err := s.Limit(spec.Resources{MemoryMB: 32}); err != nil {
		t.Fatal(err)
	}
}

// A sandbox's processes cannot fork past its pids.max: a fork bomb stays
// inside its cgroup's limit, its failed forks are counted, and teardown
// ends what it made.
func TestPidsLimit(t *testing.T) {
	testutil.RequiresRoot(t)
	h := detect(t, DefaultRoot)
	if !h.pidsV2 && h.pidsV1 == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no pids controller on the CI machine")
		}
		t.Skip("no pids controller here")
	}
	const limit = 8
	h.SetMaxPids(limit)
	s, err := h.Create(testName("pids"), spec.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background()) })
	if got := readTrim(t, filepath.Join(s.pidsDir(), "pids.max")); got != strconv.Itoa(limit) {
		t.Fatalf("pids.max = %q, want %d", got, limit)
	}
	// 30 sleepers, each forked by the shell: at most limit of the shell
	// and its children can exist at once.
	cmd := exec.Command("sh", "-c", "for i in $(seq 1 30); do sleep 1000 & done; wait")
	if err := startIn(s, cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	testutil.Eventually(t, 20*time.Second, func() bool {
		n, ok := s.PidsLimited()
		return ok && n > 0
	}, "no fork refused at pids.max %d (processes now: %d)", limit, len(s.Procs()))
	if n := len(s.Procs()); n > limit {
		cur, _ := os.ReadFile(filepath.Join(s.pidsDir(), "pids.current"))
		pp, _ := os.ReadFile(filepath.Join(s.pidsDir(), "cgroup.procs"))
		ev, _ := os.ReadFile(filepath.Join(s.pidsDir(), "pids.events"))
		t.Errorf("%d processes in the cgroup, over its pids.max %d (pids.current %q, pids.events %q, cgroup.procs %q)", n, limit, cur, ev, pp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	<-exited
}

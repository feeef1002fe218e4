package process

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/cgroups"
	"github.com/brisk-faas/brisk/internal/worker/runtime/logpipe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Issue 18, least-privilege sandboxes: what a sandbox's processes are
// (uid, no_new_privs, environment) and that none of them escapes its
// cgroup or outlives Kill.

// escapeFn is a function whose command, before it execs the server, forks
// a child, a setsid grandchild and a double-forked setsid daemon, each a
// "sleep <marker>" that the test finds by its command line.
func escapeFn(name string) (f *spec.Function, markers []string) {
	base := 10_000_000 + rand.IntN(80_000_000)
	for i := range 3 {
		markers = append(markers, strconv.Itoa(base+i))
	}
	script := "sleep " + markers[0] + " & setsid sleep " + markers[1] + " & " +
		"sh -c 'setsid sleep " + markers[2] + " &' & exec \"$0\""
	return &spec.Function{Name: name, Revision: 1, Command: []string{"/bin/sh", "-c", script, helper}}, markers
}

// sleepers returns the live processes running "sleep <marker>".
func sleepers(marker string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err == nil && strings.HasSuffix(string(b), "\x00"+marker+"\x00") && strings.Contains(string(b), "sleep\x00") && !gone(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// statusField returns a field of /proc/<pid>/status, e.g. "Uid".
func statusField(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatalf("status of %d: %v", pid, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	t.Fatalf("/proc/%d/status has no %s line", pid, key)
	return ""
}

func environ(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatalf("environ of %d: %v", pid, err)
	}
	env := map[string]string{}
	for kv := range strings.SplitSeq(strings.TrimSuffix(string(b), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

// cgroupHits counts the lines of /proc/<pid>/cgroup naming rel.
func cgroupHits(t *testing.T, pid int, rel string) (int, string) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return -1, err.Error()
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasSuffix(line, ":/"+rel) {
			n++
		}
	}
	return n, string(b)
}

// runEscapeTest runs escapeFn as sandbox id and asserts that the server
// and all three sleepers run inside the sandbox's cgroup in every hierarchy
// it has, and that after Kill none of them runs any more.
func runEscapeTest(t *testing.T, r *Runtime, id string) {
	t.Helper()
	f, markers := escapeFn("escape")
	inst := createReady(t, r, id, f)
	server := get(t, inst.Addr).PID
	pids := map[string]int{"server": server}
	testutil.Eventually(t, waitLong, func() bool {
		for i, m := range markers {
			p := sleepers(m)
			if len(p) != 1 {
				return false
			}
			pids["sleeper "+strconv.Itoa(i)] = p[0]
		}
		return true
	}, "the command's three sleepers never all ran")

	r.mu.Lock()
	cg := r.sandboxes[id].cg
	r.mu.Unlock()
	if cg == nil {
		t.Fatal("sandbox has no cgroup")
	}
	for name, pid := range pids {
		if n, all := cgroupHits(t, pid, cg.Rel()); n != len(cg.Dirs()) {
			t.Errorf("%s (pid %d) is in %s in %d of the sandbox's %d hierarchies:\n%s", name, pid, cg.Rel(), n, len(cg.Dirs()), all)
		}
	}
	// On v1 a worker thread forked the sandbox from inside its cgroup; it
	// must have left (the kill would otherwise hit the worker).
	if slices.Contains(cg.Procs(), os.Getpid()) {
		t.Errorf("the worker (pid %d) is still in the sandbox's cgroup", os.Getpid())
	}
	if err := r.Kill(context.Background(), id); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	testutil.Eventually(t, waitLong, func() bool {
		for _, pid := range pids {
			if !gone(pid) {
				return false
			}
		}
		return true
	}, "processes of the sandbox survived Kill: %v", pids)
	for _, d := range cg.Dirs() {
		if exists(d) {
			t.Errorf("cgroup %s survived Kill", d)
		}
	}
}

// TestSandboxChildrenStayInCgroupAndDie: children forked at start, before
// the server runs, land inside the sandbox's cgroup (v1: in every hierarchy
// it has), and Kill ends them all, setsid and double-forked ones included.
func TestSandboxChildrenStayInCgroupAndDie(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, Config{})
	if r.cg == nil {
		t.Fatalf("running as root but found no usable cgroups under %s", DefaultCgroupRoot)
	}
	t.Logf("cgroup v2: %v", r.cg.V2())
	runEscapeTest(t, r, "sb-escape")
}

// TestSandboxRunsUnprivileged: as root the sandbox runs as its function's
// own user (as the worker's own user otherwise), with no supplementary
// groups and no_new_privs set, down to its children.
func TestSandboxRunsUnprivileged(t *testing.T) {
	r := newRuntime(t, Config{})
	uid, gid := strconv.Itoa(os.Getuid()), strconv.Itoa(os.Getgid())
	f := echoFn("unpriv", map[string]string{"ECHO_SPAWN_CHILD": "1"})
	if os.Geteuid() == 0 {
		id, err := r.identityOf(f)
		if err != nil || id.uid < FunctionUIDBase || id.gid != id.uid {
			t.Fatalf("function user %v, %v: want one of its own from %d", id, err, FunctionUIDBase)
		}
		uid, gid = strconv.Itoa(int(id.uid)), strconv.Itoa(int(id.gid))
	}
	inst := createReady(t, r, "sb-unpriv", f)
	got := get(t, inst.Addr)
	for _, pid := range []int{got.PID, got.Child} {
		if s := statusField(t, pid, "Uid"); s != strings.Repeat(uid+" ", 3)+uid {
			t.Errorf("pid %d: Uid %q, want %s everywhere", pid, s, uid)
		}
		if s := statusField(t, pid, "Gid"); s != strings.Repeat(gid+" ", 3)+gid {
			t.Errorf("pid %d: Gid %q, want %s everywhere", pid, s, gid)
		}
		if s := statusField(t, pid, "NoNewPrivs"); s != "1" {
			t.Errorf("pid %d: NoNewPrivs %q, want 1", pid, s)
		}
		if os.Geteuid() == 0 {
			if s := statusField(t, pid, "Groups"); s != "" {
				t.Errorf("pid %d: supplementary groups %q, want none", pid, s)
			}
			if s := statusField(t, pid, "CapEff"); strings.Trim(s, "0") != "" {
				t.Errorf("pid %d: effective capabilities %s, want none", pid, s)
			}
		}
	}
}

// TestSandboxCleanEnvironment: the sandbox sees the spec's env, PORT, the
// listen host, the builtin's variables, a fixed PATH and HOME, and nothing
// of the worker's.
func TestSandboxCleanEnvironment(t *testing.T) {
	t.Setenv("BRISK_TEST_SECRET", "hunter2")
	r := newRuntime(t, Config{})
	inst := createReady(t, r, "sb-env", echoFn("env", map[string]string{"ECHO_ENV": "hello", "PORT": "1"}))
	got := get(t, inst.Addr)
	env := environ(t, got.PID)
	_, port, _ := strings.Cut(inst.Addr, ":")
	want := map[string]string{
		"ECHO_ENV": "hello", "PORT": port, "BRISK_SANDBOX_ID": "sb-env", "BRISK_FUNCTION": "env",
		"PATH": DefaultPath, "HOME": "/", "BRISK_LISTEN_HOST": DefaultListenHost,
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("sandbox env %s=%q, want %q", k, env[k], v)
		}
	}
	for k := range env {
		if _, ok := want[k]; !ok {
			t.Errorf("sandbox env has %s=%q, which is neither the spec's nor the runtime's", k, env[k])
		}
	}
	if wd, err := os.Readlink("/proc/" + strconv.Itoa(got.PID) + "/cwd"); err != nil || wd != "/" {
		t.Errorf("sandbox cwd %q (%v), want /", wd, err)
	}
	// The spec may set PATH and HOME.
	f := echoFn("env2", map[string]string{"PATH": "/opt/fn/bin:/bin", "HOME": "/opt/fn"})
	inst = createReady(t, r, "sb-env2", f)
	env = environ(t, get(t, inst.Addr).PID)
	if env["PATH"] != "/opt/fn/bin:/bin" || env["HOME"] != "/opt/fn" {
		t.Errorf("spec's PATH and HOME not honoured: PATH=%q HOME=%q", env["PATH"], env["HOME"])
	}
}

// TestSandboxChildrenStayInCgroupV2: the same on a cgroup v2 hierarchy,
// also on hybrid hosts, whose v2 hierarchy has no controllers (the
// sandbox then gets a cgroup but no limits).
func TestSandboxChildrenStayInCgroupV2(t *testing.T) {
	testutil.RequiresRoot(t)
	root := v2Root()
	if root == "" {
		t.Skip("no cgroup v2 hierarchy mounted")
	}
	r := newRuntime(t, Config{CgroupRoot: root})
	if !r.cg.V2() {
		t.Fatalf("%s not detected as cgroup v2", root)
	}
	runEscapeTest(t, r, "sb-escape-v2")
}

// TestSandboxChildrenStayInCgroupV1: the same on a cgroup v1 hierarchy
// mounted for the test. It is a named one without controllers, which can
// be mounted beside a v2 hierarchy that holds all controllers (as in CI);
// the placement (the forking thread joins first) and the teardown (kill
// every listed process, without a freezer) are those of any v1 hierarchy.
func TestSandboxChildrenStayInCgroupV1(t *testing.T) {
	testutil.RequiresRoot(t)
	mnt := t.TempDir()
	if err := syscall.Mount("cgroup", mnt, "cgroup", 0, "none,name=brisk-test"); err != nil {
		t.Skipf("cannot mount a named cgroup v1 hierarchy (kernel without cgroup v1, or no CAP_SYS_ADMIN here): %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Rmdir(filepath.Join(mnt, cgroupParent))
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	r := newRuntime(t, Config{DisableCgroups: true})
	r.cg = cgroups.V1ForTest(mnt)
	runEscapeTest(t, r, "sb-escape-v1")
}

// v2Root finds a mounted cgroup v2 hierarchy, "" if none.
func v2Root() string {
	for _, dir := range []string{DefaultCgroupRoot, filepath.Join(DefaultCgroupRoot, "unified")} {
		if exists(filepath.Join(dir, "cgroup.controllers")) {
			return dir
		}
	}
	return ""
}

func TestResolveUser(t *testing.T) {
	self := identity{uid: uint32(os.Getuid()), gid: uint32(os.Getgid())}
	if id, err := resolveUser("", 1000); err != nil || id.cred != nil || id.uid != self.uid || id.gid != self.gid {
		t.Errorf(`resolveUser("") not as root = %+v, %v; want the worker's own user, no credential switch`, id, err)
	}
	if id, err := resolveUser("", 0); err != nil || id.cred == nil || id.uid == 0 || id.gid == 0 || len(id.cred.Groups) != 0 {
		t.Errorf(`resolveUser("") as root = %+v, %v; want nobody with no groups`, id, err)
	}
	for _, c := range []struct {
		spec     string
		uid, gid uint32
	}{{"12345:23456", 12345, 23456}, {"root", 0, 0}, {"0:0", 0, 0}, {"4000000", 4000000, 4000000}} {
		id, err := resolveUser(c.spec, 0)
		if err != nil || id.cred == nil || id.uid != c.uid || id.gid != c.gid || id.cred.Uid != c.uid || id.cred.Gid != c.gid {
			t.Errorf("resolveUser(%q) = %+v, %v; want uid %d gid %d", c.spec, id, err, c.uid, c.gid)
		}
	}
	for _, spec := range []string{"brisk-no-such-user", ":1", "1:brisk-no-such-group"} {
		if id, err := resolveUser(spec, 0); err == nil {
			t.Errorf("resolveUser(%q) = %+v, want an error", spec, id)
		}
	}
	other := strconv.Itoa(os.Getuid() + 1)
	if _, err := resolveUser(other, os.Getuid()+1000); err == nil || !strings.Contains(err.Error(), "only root") {
		t.Errorf("resolveUser(%s) not as root = %v, want only root can", other, err)
	}
}

// TestSandboxConfiguredUser: --sandbox-user uid:gid is what the sandbox
// runs as, and a command the user cannot reach fails saying why.
func TestSandboxConfiguredUser(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, Config{User: "12345:23456"})
	inst := createReady(t, r, "sb-user", echoFn("user", nil))
	pid := get(t, inst.Addr).PID
	if s := statusField(t, pid, "Uid"); s != "12345 12345 12345 12345" {
		t.Errorf("Uid %q, want 12345", s)
	}
	if s := statusField(t, pid, "Gid"); s != "23456 23456 23456 23456" {
		t.Errorf("Gid %q, want 23456", s)
	}
	private := filepath.Join(t.TempDir(), "fn") // t.TempDir is 0700: only root gets in
	if err := os.Symlink(helper, private); err != nil {
		t.Fatal(err)
	}
	_, err := r.Create(context.Background(), runtime.Spec{ID: "sb-private", Function: &spec.Function{Name: "private", Command: []string{private}}})
	if err == nil || !strings.Contains(err.Error(), "uid 12345 gid 23456") {
		t.Errorf("Create of a command the sandbox user cannot reach = %v, want an error naming the user", err)
	}
}

// A sandbox that floods its output (256 MiB as fast as it can) puts at
// most the log pipe's burst and rate into its log, is told nothing (its
// writes succeed and it runs to its end), and the log says how much was
// dropped.
func TestFloodingSandboxIsBounded(t *testing.T) {
	r := newRuntime(t, Config{})
	f := &spec.Function{Name: "flood", Revision: 1, Command: []string{"/bin/sh", "-c", `head -c 268435456 /dev/zero | tr '\0' x`}}
	start := time.Now()
	inst := create(t, r, "flood-1", f)
	select {
	case <-inst.Exited:
	case <-time.After(waitLong):
		t.Fatal("the flooding sandbox did not finish: its writes were held up")
	}
	if err := inst.ExitErr(); err == nil || !strings.Contains(err.Error(), "status 0") {
		t.Fatalf("the flooding sandbox ended with %v, want status 0 (its writes must succeed)", err)
	}
	logpipe.Wait()
	took := time.Since(start)
	st, err := os.Stat(filepath.Join(r.cfg.StateDir, "logs", "flood", "flood-1.log"))
	if err != nil {
		t.Fatal(err)
	}
	bound := logpipe.Default.Burst + int64(took.Seconds()*float64(logpipe.Default.Rate)) + 64<<10
	if st.Size() > bound {
		t.Fatalf("%d bytes in the log after %v; bound %d", st.Size(), took, bound)
	}
	b, _ := os.ReadFile(filepath.Join(r.cfg.StateDir, "logs", "flood", "flood-1.log"))
	if !strings.Contains(string(b[max(0, len(b)-4096):]), "bytes of this sandbox's output dropped") {
		t.Fatal("the log does not say what was dropped")
	}
	t.Logf("256 MiB written in %v; %d bytes kept", took, st.Size())
}

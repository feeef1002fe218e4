package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// DefaultRoot is where cgroup file systems are mounted on every mainstream
// distribution.
const DefaultRoot = "/sys/fs/cgroup"

// cgroupParent is the cgroup, relative to each hierarchy's root, under which
// every sandbox gets brisk/<sandbox-id>. Sandboxes hang off the root rather
// than the worker's own cgroup because on cgroup v2 a cgroup holding
// processes (the worker's) cannot hand cpu and memory to children.
const cgroupParent = "brisk"

const cfsPeriod = 100_000 // µs; the kernel's default CFS period

// DefaultMaxPids bounds the processes and threads of one sandbox: a
// function that forks without end (a fork bomb, or a bug) fails to fork
// past it instead of taking the worker's pid space, which every other
// sandbox and the worker itself need. Generous for a function: language
// runtimes start tens of threads.
const DefaultMaxPids = 1024

// Hierarchy creates, limits, watches and removes sandbox cgroups on either
// cgroup v2 (one unified hierarchy) or v1 (one hierarchy per controller,
// mounted at <root>/cpu and <root>/memory, possibly next to a controller-less
// v2 mount as on hybrid systems).
type Hierarchy struct {
	v2 bool
	// v2: the unified hierarchy's mount point.
	root string
	// v2: whether brisk/ could be given the controller; v1: the
	// controller's hierarchy mount point, "" when absent.
	cpuV2, memV2, pidsV2 bool
	cpuV1, memV1, pidsV1 string
	// maxPids is each sandbox's pids.max (SetMaxPids); 0: no limit.
	maxPids int64
	// v1: the freezer hierarchy's mount point, "" when absent; teardown
	// freezes the sandbox before it kills, so nothing forks meanwhile.
	freezerV1 string
	// v1: further hierarchies a sandbox joins without limits (tests use a
	// named, controller-less one: V1ForTest).
	otherV1 []string
}

// V1ForTest returns a cgroup v1 Hierarchy made of the named, controller-less
// hierarchies mounted at mounts, which sandboxes join without limits. It is
// a test hook: it lets tests exercise the v1 placement (JoinThread) and
// teardown (Kill without a freezer) on hosts whose controllers all sit in a
// v2 hierarchy. Detect is what runtimes use.
func V1ForTest(mounts ...string) *Hierarchy {
	h := &Hierarchy{otherV1: mounts}
	if len(mounts) > 0 {
		h.root = mounts[0]
	}
	return h
}

// Detect inspects root and prepares brisk/ under it. It returns an error
// when root holds no usable cgroup hierarchy; controllers it cannot get are
// reported through warn and their limits are skipped.
func Detect(root string, warn func(msg string, args ...any)) (*Hierarchy, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return setupV2(root, warn)
	}
	cg := &Hierarchy{root: root}
	for _, name := range []string{"cpu", "cpu,cpuacct", "cpuacct,cpu"} {
		if exists(filepath.Join(root, name, "cpu.cfs_quota_us")) {
			cg.cpuV1 = filepath.Join(root, name)
			break
		}
	}
	if exists(filepath.Join(root, "memory", "memory.limit_in_bytes")) {
		cg.memV1 = filepath.Join(root, "memory")
	}
	if exists(filepath.Join(root, "pids", "cgroup.procs")) {
		cg.pidsV1 = filepath.Join(root, "pids")
	}
	// The root of a v1 freezer hierarchy has no freezer.state (its children do).
	if exists(filepath.Join(root, "freezer", "tasks")) {
		cg.freezerV1 = filepath.Join(root, "freezer")
	}
	if cg.cpuV1 == "" && cg.memV1 == "" {
		return nil, fmt.Errorf("no cgroup v2 hierarchy and no v1 cpu or memory hierarchy under %s", root)
	}
	if cg.cpuV1 == "" {
		warn("cgroup v1 cpu controller not mounted; sandboxes run without CPU limits", "root", root)
	}
	if cg.memV1 == "" {
		warn("cgroup v1 memory controller not mounted; sandboxes run without memory limits", "root", root)
	}
	if cg.freezerV1 == "" {
		warn("cgroup v1 freezer not mounted; teardown kills a sandbox's processes without freezing them first", "root", root)
	}
	if cg.pidsV1 == "" {
		warn("cgroup v1 pids controller not mounted; sandboxes may fork without limit", "root", root)
	}
	cg.maxPids = DefaultMaxPids
	return cg, nil
}

func setupV2(root string, warn func(msg string, args ...any)) (*Hierarchy, error) {
	cg := &Hierarchy{v2: true, root: root, maxPids: DefaultMaxPids}
	parent := filepath.Join(root, cgroupParent)
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	avail, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	for _, c := range []struct {
		name string
		ok   *bool
	}{{"cpu", &cg.cpuV2}, {"memory", &cg.memV2}, {"pids", &cg.pidsV2}} {
		if !hasWord(avail, c.name) {
			warn("cgroup v2 controller not available; sandboxes run without its limits", "controller", c.name, "root", root)
			continue
		}
		// Delegate the controller from the root to brisk/ and from brisk/
		// to each sandbox. Writing to the root fails with EBUSY inside a
		// container whose cgroup namespace root holds processes.
		err := writeFile(filepath.Join(root, "cgroup.subtree_control"), "+"+c.name)
		if err == nil {
			err = writeFile(filepath.Join(parent, "cgroup.subtree_control"), "+"+c.name)
		}
		if err != nil {
			warn("cannot enable cgroup v2 controller; sandboxes run without its limits", "controller", c.name, "err", err)
			continue
		}
		*c.ok = true
	}
	return cg, nil
}

// V2 reports whether h is the unified cgroup v2 hierarchy, whose sandboxes
// are cloned into their cgroup (Cgroup.OpenDir); on v1 the forking thread
// joins it first (Cgroup.JoinThread).
func (h *Hierarchy) V2() bool { return h.v2 }

// Limits reports which limits sandboxes get: CPU and memory each when its
// controller is mounted (v1) or could be delegated to brisk/ (v2).
func (h *Hierarchy) Limits() (cpu, memory bool) {
	if h.v2 {
		return h.cpuV2, h.memV2
	}
	return h.cpuV1 != "", h.memV1 != ""
}

// SetMaxPids sets the pids.max of the sandboxes created from now on (0: no
// limit); Detect sets DefaultMaxPids.
func (h *Hierarchy) SetMaxPids(n int64) { h.maxPids = max(n, 0) }

// Cgroup is one sandbox's cgroup: one directory on v2, one per mounted
// controller on v1.
type Cgroup struct {
	cg      *Hierarchy
	rel     string   // brisk/<name>
	dirs    []string // absolute; dirs[0] is the memory one when there is one
	mem     string   // the directory holding memory.* files, "" without memory
	freezer string   // v1: the directory holding freezer.state, "" without
}

// Open returns the cgroup at rel (as Cgroup.Rel gives it, e.g. one a
// runtime recorded before a restart) without creating or changing it.
func (cg *Hierarchy) Open(rel string) *Cgroup {
	s := &Cgroup{cg: cg, rel: rel}
	if cg.v2 {
		d := filepath.Join(cg.root, rel)
		s.dirs = []string{d}
		if cg.memV2 {
			s.mem = d
		}
		return s
	}
	if cg.memV1 != "" {
		s.mem = filepath.Join(cg.memV1, rel)
		s.dirs = append(s.dirs, s.mem)
	}
	if cg.cpuV1 != "" {
		s.dirs = append(s.dirs, filepath.Join(cg.cpuV1, rel))
	}
	if cg.pidsV1 != "" {
		s.dirs = append(s.dirs, filepath.Join(cg.pidsV1, rel))
	}
	if cg.freezerV1 != "" {
		s.freezer = filepath.Join(cg.freezerV1, rel)
		s.dirs = append(s.dirs, s.freezer)
	}
	for _, h := range cg.otherV1 {
		s.dirs = append(s.dirs, filepath.Join(h, rel))
	}
	return s
}

// Create makes the sandbox's cgroup, brisk/<name>, and applies its limits;
// zero resources mean "no limit". On error nothing is left behind.
func (cg *Hierarchy) Create(name string, res spec.Resources) (s *Cgroup, err error) {
	s = cg.Open(cgroupParent + "/" + name)
	for _, d := range s.dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			s.RemoveNow()
			return nil, fmt.Errorf("cgroup %s: %w", s.rel, err)
		}
	}
	if err := s.Limit(res); err != nil {
		s.RemoveNow()
		return nil, fmt.Errorf("cgroup %s: %w", s.rel, err)
	}
	if d := s.pidsDir(); d != "" && cg.maxPids > 0 {
		if err := writeFile(filepath.Join(d, "pids.max"), strconv.FormatInt(cg.maxPids, 10)); err != nil {
			s.RemoveNow()
			return nil, fmt.Errorf("cgroup %s: %w", s.rel, err)
		}
	}
	return s, nil
}

// pidsDir is the directory holding the cgroup's pids.* files, "" without
// the pids controller.
func (s *Cgroup) pidsDir() string {
	switch {
	case s.cg.v2 && s.cg.pidsV2:
		return s.dirs[0]
	case !s.cg.v2 && s.cg.pidsV1 != "":
		return filepath.Join(s.cg.pidsV1, s.rel)
	}
	return ""
}

// PidsLimited reports how many times a fork in the cgroup failed at its
// pids.max; ok is false without the pids controller.
func (s *Cgroup) PidsLimited() (n int64, ok bool) {
	d := s.pidsDir()
	if d == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(d, "pids.events"))
	if err != nil {
		return 0, false
	}
	return field(b, "max")
}

// List returns the names of the cgroups under brisk/ that start with
// prefix, in any hierarchy: what an earlier worker left, for a restarted
// one to reap or adopt.
func (cg *Hierarchy) List(prefix string) []string {
	seen := map[string]bool{}
	for _, d := range cg.Open(cgroupParent).dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
				seen[e.Name()] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Rel is the cgroup's path relative to each hierarchy's root: brisk/<name>.
func (s *Cgroup) Rel() string { return s.rel }

// Dirs returns the cgroup's directories, absolute: one on v2, one per
// hierarchy it is in on v1. They exist only between Create and Remove.
func (s *Cgroup) Dirs() []string { return slices.Clone(s.dirs) }

// Limit applies res to the cgroup; zero resources mean "no limit" (an
// earlier limit stays). Controllers the Hierarchy lacks are skipped.
func (s *Cgroup) Limit(res spec.Resources) error {
	quota := int64(-1)
	if res.MilliCPU > 0 {
		quota = max(res.MilliCPU*cfsPeriod/1000, 1000) // the kernel's minimum is 1 ms
	}
	mem := int64(-1)
	if res.MemoryMB > 0 {
		mem = res.MemoryMB << 20
	}
	cg := s.cg
	if cg.v2 {
		d := s.dirs[0]
		if cg.cpuV2 && quota > 0 {
			if err := writeFile(filepath.Join(d, "cpu.max"), fmt.Sprintf("%d %d", quota, cfsPeriod)); err != nil {
				return err
			}
		}
		if cg.memV2 && mem > 0 {
			if err := writeFile(filepath.Join(d, "memory.max"), strconv.FormatInt(mem, 10)); err != nil {
				return err
			}
			// A function over its limit should be OOM-killed, not swapped:
			// swapping would show up as a mysteriously slow function.
			_ = writeFile(filepath.Join(d, "memory.swap.max"), "0") // absent without swap accounting
		}
		return nil
	}
	if cg.cpuV1 != "" && quota > 0 {
		d := filepath.Join(cg.cpuV1, s.rel)
		if err := writeFile(filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriod)); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(d, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
			return err
		}
	}
	if s.mem != "" && mem > 0 {
		if err := writeFile(filepath.Join(s.mem, "memory.limit_in_bytes"), strconv.FormatInt(mem, 10)); err != nil {
			return err
		}
		// memory+swap must not be below memory alone, so it is set second.
		_ = writeFile(filepath.Join(s.mem, "memory.memsw.limit_in_bytes"), strconv.FormatInt(mem, 10)) // absent without swap accounting
	}
	return nil
}

// Reset lifts the CPU and memory limits, so that a cgroup kept for reuse
// limits its next sandbox as a new one would. Counters (OOMKills) and
// page-cache charges of earlier members stay; the charges are reclaimed
// under the next limit like any cache.
func (s *Cgroup) Reset() error {
	cg := s.cg
	if cg.v2 {
		d := s.dirs[0]
		if cg.cpuV2 {
			if err := writeFile(filepath.Join(d, "cpu.max"), "max "+strconv.Itoa(cfsPeriod)); err != nil {
				return err
			}
		}
		if cg.memV2 {
			return writeFile(filepath.Join(d, "memory.max"), "max")
		}
		return nil
	}
	if cg.cpuV1 != "" {
		if err := writeFile(filepath.Join(cg.cpuV1, s.rel, "cpu.cfs_quota_us"), "-1"); err != nil {
			return err
		}
	}
	if s.mem != "" {
		// memory+swap may not be below memory alone: it is raised first.
		_ = writeFile(filepath.Join(s.mem, "memory.memsw.limit_in_bytes"), "-1") // absent without swap accounting
		return writeFile(filepath.Join(s.mem, "memory.limit_in_bytes"), "-1")
	}
	return nil
}

// MemoryUsage is the memory charged to the cgroup now, in bytes; ok is
// false without a memory controller.
func (s *Cgroup) MemoryUsage() (bytes int64, ok bool) {
	var path string
	switch {
	case s.cg.v2 && s.cg.memV2:
		path = filepath.Join(s.dirs[0], "memory.current")
	case !s.cg.v2 && s.mem != "":
		path = filepath.Join(s.mem, "memory.usage_in_bytes")
	default:
		return 0, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// OpenDir opens the v2 cgroup directory for clone(CLONE_INTO_CGROUP).
func (s *Cgroup) OpenDir() (int, error) {
	fd, err := syscall.Open(s.dirs[0], syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cgroup %s: %w", s.rel, err)
	}
	return fd, nil
}

// JoinThread moves the calling thread into the cgroup in every v1
// hierarchy, so that a child it forks is born there, and returns what moves
// it back to where it was. v1 (unlike v2) lets the threads of one process
// sit in different cgroups. The caller runs on a thread of its own
// (procs.SpawnThread): while it is in the sandbox's cgroup the worker's pid
// is listed in the cgroup's cgroup.procs, which is why Kill skips it.
func (s *Cgroup) JoinThread() (leave func() error, err error) {
	tid := strconv.Itoa(unix.Gettid())
	type move struct{ mount, from string }
	var moved []move
	leave = func() error {
		var errs []error
		for _, m := range moved {
			// Back where it was; failing that (a cgroup namespace may
			// name the old cgroup differently), to the hierarchy's root.
			if err := writeFile(filepath.Join(m.mount, m.from, "tasks"), tid); err != nil {
				if err2 := writeFile(filepath.Join(m.mount, "tasks"), tid); err2 != nil {
					errs = append(errs, err, err2)
				}
			}
		}
		return errors.Join(errs...)
	}
	before, err := threadCgroups()
	if err != nil {
		return nil, err
	}
	for _, d := range s.dirs {
		if err := writeFile(filepath.Join(d, "tasks"), tid); err != nil {
			_ = leave()
			return nil, fmt.Errorf("cgroup %s: %w", s.rel, err)
		}
		after, err := threadCgroups()
		if err != nil {
			_ = leave()
			return nil, err
		}
		// The hierarchy that has just changed to the sandbox's cgroup is
		// d's; its old path is where the thread goes back to.
		m := move{mount: strings.TrimSuffix(d, "/"+s.rel), from: "/"}
		for h, p := range after {
			if p == "/"+s.rel && before[h] != p {
				m.from = before[h]
			}
		}
		moved = append(moved, m)
		before = after
	}
	return leave, nil
}

// threadCgroups reads the calling thread's cgroups: hierarchy id (and
// controllers) → path.
func threadCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if i := strings.LastIndexByte(line, ':'); i > 0 {
			m[line[:i]] = line[i+1:]
		}
	}
	return m, nil
}

// Rename gives the cgroup another name, brisk/<name>, with its processes
// and limits: a process becomes another sandbox without migrating (a
// migration waits for an RCU grace period per hierarchy, milliseconds on
// v1, and more for a process with many threads). On error the cgroup
// keeps its name.
func (s *Cgroup) Rename(name string) (*Cgroup, error) {
	to := s.cg.Open(cgroupParent + "/" + name)
	for i, d := range s.dirs {
		if err := os.Rename(d, to.dirs[i]); err != nil {
			for j := range i {
				_ = os.Rename(to.dirs[j], s.dirs[j])
			}
			return nil, fmt.Errorf("cgroup %s: %w", s.rel, err)
		}
	}
	return to, nil
}

// AddProc moves pid into the cgroup: the v2 fallback when clone3 is
// unavailable.
func (s *Cgroup) AddProc(pid int) error {
	for _, d := range s.dirs {
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup %s: %w", s.rel, err)
		}
	}
	return nil
}

// OOMKills returns how many processes the kernel OOM killer killed in this
// cgroup: v2 memory.events oom_kill, v1 memory.oom_control oom_kill (kernel
// 4.13+). Older v1 kernels lack the counter; there it returns
// memory.failcnt (how often the limit was hit) with exact false, which only
// suggests an OOM kill when the process also died of SIGKILL.
func (s *Cgroup) OOMKills() (n int64, exact bool) {
	if s.mem == "" {
		return 0, true
	}
	file := "memory.oom_control"
	if s.cg.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(s.mem, file))
	if err != nil {
		return 0, true
	}
	if n, ok := field(b, "oom_kill"); ok {
		return n, true
	}
	if !s.cg.v2 {
		if b, err := os.ReadFile(filepath.Join(s.mem, "memory.failcnt")); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return n, false
		}
	}
	return 0, true
}

// Procs lists the pids in the cgroup. Zombies have left it already.
func (s *Cgroup) Procs() []int {
	var pids []int
	for _, d := range s.dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	// On v1 a process is in the cgroup of each hierarchy: list it once.
	slices.Sort(pids)
	return slices.Compact(pids)
}

// Kill SIGKILLs every process in the cgroup, including any that left the
// sandbox's process group (setsid, double-forked daemons). v2 kernels from
// 5.14 do it atomically with cgroup.kill. Elsewhere the cgroup is frozen
// first (v2 cgroup.freeze from 5.2, the v1 freezer), so that no process
// forks between the listing and the kill, then every process listed is
// killed and the cgroup thawed, which lets the killed ones die. Without a
// freezer a process forking in a loop could outrun one pass, which is why
// Remove retries.
func (s *Cgroup) Kill() {
	if s.cg.v2 && writeFile(filepath.Join(s.dirs[0], "cgroup.kill"), "1") == nil {
		return
	}
	thaw := s.Freeze()
	self := os.Getpid() // on v1, while a worker thread forks a sandbox in it
	for _, pid := range s.Procs() {
		if pid != self {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	thaw()
}

// freezeWait bounds how long Kill waits for a cgroup to freeze: a task in
// uninterruptible sleep delays it, and killing unfrozen is still better
// than not killing.
const freezeWait = 100 * time.Millisecond

// Freeze freezes the cgroup when it can and returns what thaws it.
func (s *Cgroup) Freeze() (thaw func()) {
	var file, on, off, state, frozen string
	switch {
	case s.cg.v2:
		file, on, off = filepath.Join(s.dirs[0], "cgroup.freeze"), "1", "0"
		state, frozen = filepath.Join(s.dirs[0], "cgroup.events"), "frozen 1"
	case s.freezer != "":
		file, on, off = filepath.Join(s.freezer, "freezer.state"), "FROZEN", "THAWED"
		state, frozen = file, "FROZEN"
	default:
		return func() {}
	}
	if writeFile(file, on) != nil {
		return func() {}
	}
	deadline := time.Now().Add(freezeWait)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(state); err != nil || hasLine(b, frozen) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return func() { _ = writeFile(file, off) }
}

func hasLine(b []byte, line string) bool {
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// Remove deletes the cgroup, killing and waiting out any process still in
// it. rmdir fails with EBUSY until the last member has exited.
func (s *Cgroup) Remove(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.RemoveNow()
		if err == nil {
			return nil
		}
		s.Kill()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s: %w (last: %v)", s.rel, ctx.Err(), err)
		}
	}
}

// RemoveNow tries each directory once; missing ones count as removed.
func (s *Cgroup) RemoveNow() error {
	var errs []error
	for _, d := range s.dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func writeFile(path, v string) error {
	// cgroup files are written in one write(2) with no O_CREAT or O_TRUNC.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", v, path, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func hasWord(b []byte, w string) bool {
	for _, f := range strings.Fields(string(b)) {
		if f == w {
			return true
		}
	}
	return false
}

// field finds "key value" lines, the format of memory.events and
// memory.oom_control.
func field(b []byte, key string) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

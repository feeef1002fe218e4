package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// probeFn is a function whose sandbox tries what a hostile tenant would
// against the sandbox whose process is pid and whose address is addr:
// read its environment, list its root (its mount namespace, secrets
// included), signal it and connect to it past the data plane; it prints
// each attempt's exit status to its log, then idles.
func probeFn(name, uid string, pid int, addr string) *spec.Function {
	host, port, _ := strings.Cut(addr, ":")
	script := fmt.Sprintf(`cat /proc/%[1]d/environ >/dev/null 2>&1; echo "environ=$?"
ls /proc/%[1]d/root/ >/dev/null 2>&1; echo "root=$?"
kill -0 %[1]d 2>/dev/null; echo "signal=$?"
/usr/bin/python3 -c 'import socket; socket.create_connection(("%[2]s", %[3]s), 5).close()' 2>/dev/null; echo "connect=$?"
echo done; exec sleep 60`, pid, host, port)
	return &spec.Function{Name: name, UID: uid, Revision: 1, Command: []string{"/bin/sh", "-c", script}}
}

// probe runs probeFn as sandbox id and returns its report.
func probe(t *testing.T, r *Runtime, id string, f *spec.Function) string {
	t.Helper()
	if _, err := r.Create(context.Background(), runtime.Spec{ID: id, Function: f}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(r.cfg.StateDir, "logs", f.Name, id+".log")
	var out string
	testutil.Eventually(t, waitLong, func() bool {
		b, _ := os.ReadFile(path)
		out = string(b)
		return strings.Contains(out, "done")
	}, "the probe's report in %s", path)
	return out
}

// As root each function's sandboxes run as a user of their own: another
// function's sandbox can neither read a sandbox's environment, enter its
// mount namespace through /proc, signal it, nor connect to its port on
// loopback (the loopback guard), where a sandbox of the same function (the
// same user: the control) can; a deleted function's
// name taken again is another function and another user; a restarted
// runtime gives a function the user it had.
func TestFunctionsRunAsUsersOfTheirOwn(t *testing.T) {
	testutil.RequiresRoot(t)
	state := t.TempDir()
	r := newRuntime(t, Config{StateDir: state})
	victim := echoFn("victim", map[string]string{"VICTIM_SECRET": "s3cret"})
	victim.UID = "uid-victim"
	inst := createReady(t, r, "victim-1", victim)
	pid := get(t, inst.Addr).PID
	victimUID := statusField(t, pid, "Uid")

	other := probe(t, r, "other-1", probeFn("other", "uid-other", pid, inst.Addr))
	for _, want := range []string{"environ=1", "root=2", "signal=1", "connect=1"} {
		if !strings.Contains(other, want) {
			t.Errorf("another function's sandbox: %q, want %s (refused)", other, want)
		}
	}
	same := probeFn("victim", "uid-victim", pid, inst.Addr) // the victim's own function, so its user
	if got := probe(t, r, "victim-probe", same); !strings.Contains(got, "environ=0") || !strings.Contains(got, "signal=0") || !strings.Contains(got, "connect=0") {
		t.Fatalf("a sandbox of the same function: %q; the control must succeed, or the refusals above prove nothing", got)
	}
	taken := probeFn("victim", "uid-victim-recreated", pid, inst.Addr) // the name deleted and made again
	if got := probe(t, r, "taken-1", taken); !strings.Contains(got, "environ=1") || !strings.Contains(got, "connect=1") {
		t.Errorf("a new function under a deleted one's name read its sandbox's environment: %q", got)
	}

	// The host's own processes (the data plane, the probe) still connect.
	if got := get(t, inst.Addr); got.PID != pid {
		t.Fatalf("the host reached %+v", got)
	}

	// A new runtime on the same state: the function keeps its user, and
	// the guard its adopted sandbox's port.
	r2 := newRuntime(t, Config{StateDir: state})
	inst2 := createReady(t, r2, "victim-2", victim)
	if got := statusField(t, get(t, inst2.Addr).PID, "Uid"); got != victimUID {
		t.Errorf("after a restart the function runs as %q, before as %q", got, victimUID)
	}
	if got := probe(t, r2, "other-2", probeFn("other", "uid-other", pid, inst.Addr)); !strings.Contains(got, "connect=1") {
		t.Errorf("after a restart another function connects to the adopted sandbox: %q", got)
	}
	id, _ := r2.identityOf(&spec.Function{Name: "fresh", UID: "uid-fresh"})
	if s := strconv.Itoa(int(id.uid)); strings.HasPrefix(victimUID, s+" ") {
		t.Errorf("a new function got the victim's uid %s", s)
	}
}

// As root each sandbox has a /tmp, /var/tmp and /dev/shm of its own: a
// file one function leaves there world-readable (the default umask) is not
// in another function's, nor in the host's.
func TestSandboxesHavePrivateTmp(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, Config{})
	name := fmt.Sprintf("brisk-private-%d", os.Getpid())
	writer := &spec.Function{Name: "writer", UID: "uid-writer", Revision: 1, Command: []string{"/bin/sh", "-c", fmt.Sprintf(
		`for d in /tmp /var/tmp /dev/shm; do echo secret > $d/%[1]s; done; cat /tmp/%[1]s >/dev/null; echo "self=$?"; echo done; exec sleep 60`, name)}}
	if got := probe(t, r, "writer-1", writer); !strings.Contains(got, "self=0") {
		t.Fatalf("the writer cannot read its own file: %q", got)
	}
	reader := &spec.Function{Name: "reader", UID: "uid-reader", Revision: 1, Command: []string{"/bin/sh", "-c", fmt.Sprintf(
		`for d in /tmp /var/tmp /dev/shm; do cat $d/%[1]s >/dev/null 2>&1; echo "$d=$?"; done; echo done; exec sleep 60`, name)}}
	got := probe(t, r, "reader-1", reader)
	for _, want := range []string{"/tmp=1", "/var/tmp=1", "/dev/shm=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("another function's sandbox: %q, want %s (no such file)", got, want)
		}
	}
	for _, d := range []string{"/tmp", "/var/tmp", "/dev/shm"} {
		if _, err := os.Stat(filepath.Join(d, name)); !os.IsNotExist(err) {
			t.Errorf("the sandbox's file is in the host's %s: %v", d, err)
		}
	}
	killAll(t, r)
}

package process

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/procs"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// testSecrets are two secrets, one of them binary.
var testSecrets = map[string][]byte{
	"api-key":  []byte("process-test-key"),
	"blob.bin": {0, '\n', 0xff, 'b', 0, '\r', '\n', 0xfe},
}

func withSecrets(f *spec.Function) *spec.Function {
	f.Secrets = []string{"api-key", "blob.bin"}
	f.SecretData = testSecrets
	return f
}

func secretsReport(t *testing.T, addr string) secretsprobe.Report {
	t.Helper()
	resp, err := http.Get("http://" + addr + secretsprobe.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r secretsprobe.Report
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return r
}

// hostSecretsMounts lists this (the host's) mount namespace's mounts at
// spec.SecretsDir.
func hostSecretsMounts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == spec.SecretsDir {
			out = append(out, line)
		}
	}
	return out
}

// The classic watchdog forks its fprocess per request; the fprocess
// inherits the sandbox's mount namespace and reads the secret there.
func TestSecretsWatchdogFprocess(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, Config{})
	for i, name := range []string{"api-key", "blob.bin"} {
		f := withSecrets(&spec.Function{Name: "watchdog-secrets", Builtin: tracefn.Watchdog,
			Env: map[string]string{"fprocess": "cat " + spec.SecretsDir + "/" + name}})
		id := "sb-wd-" + string(rune('a'+i))
		inst := createReady(t, r, id, f)
		resp, err := http.Post("http://"+inst.Addr+"/", "text/plain", strings.NewReader("ignored"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Equal(body, testSecrets[name]) {
			t.Errorf("fprocess cat %s: %s %q, want 200 %q", name, resp.Status, body, testSecrets[name])
		}
		if err := r.Kill(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	if m := hostSecretsMounts(t); len(m) != 0 {
		t.Errorf("the host has mounts at %s: %q", spec.SecretsDir, m)
	}
}

// Where the host's mounts propagate (a shared mount above spec.SecretsDir,
// as systemd makes "/"), the sandbox's tmpfs still does not reach the
// host: the sandbox's namespace receives, never sends.
func TestSecretsDoNotPropagateToTheHost(t *testing.T) {
	testutil.RequiresRoot(t)
	if err := mkdirPublic(spec.SecretsDir); err != nil {
		t.Fatal(err)
	}
	parent := filepath.Dir(spec.SecretsDir)
	if err := unix.Mount(parent, parent, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(parent, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the test's bind mount on %s: %v", parent, err)
		}
	})
	if err := unix.Mount("", parent, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	r := newRuntime(t, Config{})
	inst := createReady(t, r, "sb-shared", withSecrets(echoFn("shared", nil)))
	if got := secretsReport(t, inst.Addr); !bytes.Equal(got.Files["blob.bin"], testSecrets["blob.bin"]) {
		t.Errorf("sandbox reads %q", got.Files)
	}
	if m := hostSecretsMounts(t); len(m) != 0 {
		t.Errorf("the sandbox's mount reached the host: %q", m)
	}
	if err := r.Kill(context.Background(), "sb-shared"); err != nil {
		t.Fatal(err)
	}
}

// Without root (here: as root, with the mount namespace turned off and
// sandboxes run as root so that they can enter the 0700 directory, as a
// non-root worker's sandboxes, its own user, can), secrets are files under
// the state directory that $BRISK_SECRETS_DIR names; Kill, List's drop of
// an ended sandbox, a failed Create and a restarted runtime remove them.
func TestSecretsWithoutMountNamespace(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	r := newRuntime(t, Config{StateDir: dir, User: "0"})
	r.secretsNS = false
	root := filepath.Join(dir, secretsDirName)

	inst := createReady(t, r, "sb-files", withSecrets(echoFn("files", nil)))
	got := secretsReport(t, inst.Addr)
	if got.Env != filepath.Join(root, "sb-files") || got.Dir != got.Env {
		t.Errorf("%s=%q, looked in %s; want %s", runtime.EnvSecretsDir, got.Env, got.Dir, filepath.Join(root, "sb-files"))
	}
	for name, v := range testSecrets {
		if !bytes.Equal(got.Files[name], v) || got.Modes[name] != "-r--r--r--" {
			t.Errorf("%s: %q mode %s, want %q -r--r--r--", name, got.Files[name], got.Modes[name], v)
		}
	}
	if st, err := os.Stat(root); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, %v; want mode 0700", root, st.Mode(), err)
	}
	if st, err := os.Stat(got.Env); err != nil || st.Mode().Perm() != 0o555 {
		t.Errorf("%s: %v, %v; want mode 0555", got.Env, st.Mode(), err)
	}
	if err := r.Kill(context.Background(), "sb-files"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(got.Env); !os.IsNotExist(err) {
		t.Errorf("Kill left %s (stat: %v)", got.Env, err)
	}

	// An ended sandbox's are removed when List drops it.
	crash := create(t, r, "sb-crash", withSecrets(&spec.Function{Name: "crash", Command: []string{"/bin/sh", "-c", "exit 3"}}))
	testutil.Eventually(t, waitLong, func() bool { return closed(crash.Exited) }, "Exited never closed")
	for range 2 {
		if _, err := r.List(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "sb-crash")); !os.IsNotExist(err) {
		t.Errorf("List's drop of an ended sandbox left its secrets (stat: %v)", err)
	}

	// A failed Create leaves none.
	if _, err := r.Create(context.Background(), runtime.Spec{ID: "sb-bad", Function: withSecrets(&spec.Function{Name: "bad", Command: []string{"/no/such/binary"}})}); err == nil {
		t.Fatal("Create of a missing binary succeeded")
	}
	if _, err := os.Stat(filepath.Join(root, "sb-bad")); !os.IsNotExist(err) {
		t.Errorf("a failed Create left its secrets (stat: %v)", err)
	}

	// A restarted runtime keeps the secrets of the sandbox it adopts and
	// removes those no sandbox claims.
	kept := createReady(t, r, "sb-kept", withSecrets(echoFn("kept", nil)))
	orphan := filepath.Join(root, "sb-orphan")
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "api-key"), []byte("orphaned"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(orphan, 0o555); err != nil {
		t.Fatal(err)
	}
	r2 := newRuntime(t, Config{StateDir: dir, User: "0"})
	r2.secretsNS = false
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the restarted runtime left the orphaned %s (stat: %v)", orphan, err)
	}
	if got := secretsReport(t, kept.Addr); !bytes.Equal(got.Files["api-key"], testSecrets["api-key"]) {
		t.Errorf("the adopted sandbox reads %q after the restart", got.Files)
	}
	if err := r2.Kill(context.Background(), "sb-kept"); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(root); err != nil || len(ents) != 0 {
		t.Errorf("%s after the last Kill: %v, %v", root, ents, err)
	}
}

// A function without secrets gets no BRISK_SECRETS_DIR and no mount.
func TestNoSecretsNoEnv(t *testing.T) {
	f := echoFn("plain", nil)
	for _, kv := range (&Runtime{}).sandboxEnv(runtime.Spec{ID: "sb", Function: f}, 1, "") {
		if strings.HasPrefix(kv, runtime.EnvSecretsDir+"=") {
			t.Errorf("env of a function without secrets has %s", kv)
		}
	}
	// After the function's own variables, which cannot override it.
	f = withSecrets(echoFn("s", map[string]string{runtime.EnvSecretsDir: "/elsewhere"}))
	env := (&Runtime{}).sandboxEnv(runtime.Spec{ID: "sb", Function: f}, 1, "")
	if i, j := slices.Index(env, runtime.EnvSecretsDir+"=/elsewhere"), slices.Index(env, runtime.EnvSecretsDir+"="+spec.SecretsDir); j < 0 || j < i {
		t.Errorf("env %q: want %s=%s after the function's variables", env, runtime.EnvSecretsDir, spec.SecretsDir)
	}
}

// A sandbox's secrets mount while other sandboxes start: a fork between
// the open and the close of a value's file gave the child a copy of the
// descriptor until its exec, and the read-only remount then failed with
// EBUSY (a template that failed to start, once in CI). Forks (exec.Command
// here, as Create's) run all along; every mount must succeed.
func TestSecretsMountWhileOthersFork(t *testing.T) {
	testutil.RequiresRoot(t)
	f := &spec.Function{Name: "many", Secrets: make([]string, 0, 64), SecretData: map[string][]byte{}}
	for i := range 64 {
		name := fmt.Sprintf("s%02d", i)
		f.Secrets = append(f.Secrets, name)
		f.SecretData[name] = bytes.Repeat([]byte{'x'}, 4096)
	}
	stop := make(chan struct{})
	var forkers sync.WaitGroup
	for range 2 {
		forkers.Add(1)
		go func() {
			defer forkers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = exec.Command("/bin/true").Run()
			}
		}()
	}
	var failed []error
	for range 200 {
		procs.SpawnThread(func() {
			// The thread ends with the goroutine (still locked): its mount
			// namespace goes with it.
			if err := mountSecrets(f); err != nil {
				failed = append(failed, err)
			}
		})
	}
	close(stop)
	forkers.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of 200 mounts failed, the first: %v", len(failed), failed[0])
	}
}

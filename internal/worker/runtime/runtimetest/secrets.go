package runtimetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A sandbox of a function with secrets reads exactly their values, one
// file each, at spec.SecretsDir (or $BRISK_SECRETS_DIR: SecretsElsewhere)
// and cannot write there; no other sandbox sees them, before or after;
// the host never has a mount at spec.SecretsDir; and once the sandbox is
// killed, also by a restarted runtime, nothing under the state directory
// holds a secret's name or value. A secret without a value, or whose name
// is no file name, fails Create, naming the secret and never a value.
func testSecrets(t *testing.T, h Harness) {
	if h.Secrets == nil {
		t.Skip("the runtime has no file system for secrets (Harness.Secrets)")
	}
	if secretsprobe.Dir != spec.SecretsDir || secretsprobe.EnvDir != runtime.EnvSecretsDir {
		t.Fatalf("secretsprobe looks in %s=%s, the runtimes use %s=%s",
			secretsprobe.EnvDir, secretsprobe.Dir, runtime.EnvSecretsDir, spec.SecretsDir)
	}
	e := newEnv(t, h)
	mounts := secretsMounts(t)
	before := e.leaks()
	mark := make([]byte, 12)
	_, _ = rand.Read(mark)
	s := secretsCase{e: e, mark: hex.EncodeToString(mark), mounts: mounts, data: map[string][]byte{
		"api-key": []byte("key-" + hex.EncodeToString(mark)),
		// Binary: NUL, newlines, a byte that is no UTF-8, no final newline.
		"blob.bin": append([]byte("\x00\n\xff\x00blob-"+hex.EncodeToString(mark)+"\r\n\x00"), 0xfe),
	}}

	for name, change := range map[string]func(*spec.Function){
		"absent": func(f *spec.Function) { f.Secrets = append(f.Secrets, "absent") },
		"../escape": func(f *spec.Function) {
			f.Secrets = append(f.Secrets, "../escape")
			f.SecretData["../escape"] = []byte(s.mark)
		},
	} {
		f := s.function()
		change(f)
		id := e.newID()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		inst, err := e.runtime().Create(ctx, runtime.Spec{ID: id, Function: f})
		cancel()
		switch {
		case err == nil:
			t.Errorf("Create with secret %q succeeded: %+v", name, inst)
		case !strings.Contains(err.Error(), name):
			t.Errorf("Create with secret %q failed with %q, which does not name it", name, err)
		case strings.Contains(err.Error(), s.mark):
			t.Errorf("Create's error shows a secret's value: %v", err)
		}
		if got := listed(e.list(), id); len(got) != 0 {
			t.Errorf("List after a refused Create shows %+v", got)
		}
	}
	e.awaitLeaks(before, "Creates refused for their secrets")
	s.checkGone("after the refused Creates")

	id := e.newID()
	inst := e.createServing(id, s.function())
	s.check(s.report(inst.Addr, id), id)
	s.checkMounts("while a sandbox with secrets runs")
	other := e.createServing(e.newID(), h.Secrets(t))
	s.checkNone(other.Addr, other.ID, "beside it")

	if err := e.kill(id); err != nil {
		t.Fatalf("Kill %s: %v", id, err)
	}
	if err := e.stopped(inst.Addr, id); err != nil {
		t.Error(err)
	}
	checkKilledExit(t, id, inst.Exited, inst.ExitErr)
	s.checkGone("after Kill")
	// A later sandbox, perhaps on what the first one left to a pool.
	next := e.createServing(e.newID(), h.Secrets(t))
	s.checkNone(next.Addr, next.ID, "after it")
	for _, id := range []string{other.ID, next.ID} {
		if err := e.kill(id); err != nil {
			t.Errorf("Kill %s: %v", id, err)
		}
	}
	e.awaitLeaks(before, "sandboxes with and without secrets after Kill")

	if !h.Restartable {
		return
	}
	id = e.newID()
	inst = e.createServing(id, s.function())
	e.restart()
	s.check(s.report(inst.Addr, id), id+" after a restart")
	if err := e.kill(id); err != nil {
		t.Fatalf("Kill %s by the restarted runtime: %v", id, err)
	}
	s.checkGone("after Kill by a restarted runtime")
	e.awaitLeaks(before, "sandbox with secrets killed after a restart")
}

type secretsCase struct {
	e      *env
	mark   string // in every value, hex
	data   map[string][]byte
	mounts []string // the host's mounts at spec.SecretsDir before
}

func (s *secretsCase) function() *spec.Function {
	f := s.e.h.Secrets(s.e.t)
	f.Secrets = slices.Sorted(maps.Keys(s.data))
	f.SecretData = maps.Clone(s.data)
	return f
}

func (s *secretsCase) report(addr, id string) secretsprobe.Report {
	t := s.e.t
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+secretsprobe.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.e.h.Route != nil {
		s.e.h.Route(req, id)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s of %s: %v", secretsprobe.Path, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r secretsprobe.Report
	if err := json.Unmarshal(b, &r); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("GET %s of %s: %s %q (%v)", secretsprobe.Path, id, resp.Status, b, err)
	}
	return r
}

// check checks what the sandbox of s.function() reported.
func (s *secretsCase) check(r secretsprobe.Report, what string) {
	t := s.e.t
	t.Helper()
	switch {
	case s.e.h.SecretsElsewhere && (r.Env == "" || r.Env == spec.SecretsDir || r.Dir != r.Env):
		t.Errorf("%s: %s=%q, looked in %s; want a directory of its own", what, runtime.EnvSecretsDir, r.Env, r.Dir)
	case !s.e.h.SecretsElsewhere && (r.Env != spec.SecretsDir || r.Dir != spec.SecretsDir):
		t.Errorf("%s: %s=%q, looked in %s; want %s", what, runtime.EnvSecretsDir, r.Env, r.Dir, spec.SecretsDir)
	}
	if r.ReadErr != "" {
		t.Errorf("%s: reading the secrets: %s", what, r.ReadErr)
	}
	if !s.e.h.SecretsElsewhere {
		for _, flag := range []string{"ro", "nosuid", "nodev", "noexec"} {
			if !slices.Contains(r.Flags, flag) {
				t.Errorf("%s: %s is mounted %q, want it %s", what, r.Dir, r.Flags, flag)
			}
		}
	}
	if got, want := slices.Sorted(maps.Keys(r.Modes)), slices.Sorted(maps.Keys(s.data)); !slices.Equal(got, want) {
		t.Errorf("%s: %s holds %q, want %q", what, r.Dir, got, want)
	}
	for name, v := range s.data {
		if got, ok := r.Files[name]; !ok || !bytes.Equal(got, v) {
			t.Errorf("%s: %s reads %q, want %q", what, name, got, v)
		}
		if m := r.Modes[name]; m != "-r--r--r--" {
			t.Errorf("%s: %s has mode %s, want -r--r--r--", what, name, m)
		}
	}
	if r.CreateErr == "" {
		t.Errorf("%s: creating a file in %s succeeded", what, r.Dir)
	}
	if r.WriteErr == "" {
		t.Errorf("%s: writing to a secret in %s succeeded", what, r.Dir)
	}
}

// checkNone checks that the sandbox at addr, of a function without
// secrets, sees none of s's.
func (s *secretsCase) checkNone(addr, id, what string) {
	t := s.e.t
	t.Helper()
	r := s.report(addr, id)
	if r.Env != "" {
		t.Errorf("sandbox without secrets %s: %s=%q", what, runtime.EnvSecretsDir, r.Env)
	}
	for name := range s.data {
		if _, ok := r.Modes[name]; ok {
			t.Errorf("sandbox without secrets %s sees %s in %s", what, name, r.Dir)
		}
	}
	for name, b := range r.Files {
		if bytes.Contains(b, []byte(s.mark)) {
			t.Errorf("sandbox without secrets %s reads a secret's value in %s/%s", what, r.Dir, name)
		}
	}
}

// checkGone checks that the host has no more mounts at spec.SecretsDir
// than before and that no file under the state directory holds a secret's
// name or value.
func (s *secretsCase) checkGone(what string) {
	s.e.t.Helper()
	s.checkMounts(what)
	for _, l := range s.stateLeaks() {
		s.e.t.Errorf("%s: %s", what, l)
	}
}

func (s *secretsCase) checkMounts(what string) {
	t := s.e.t
	t.Helper()
	if now := secretsMounts(t); !slices.Equal(now, s.mounts) {
		t.Errorf("%s: the host's mounts at %s are\n  %s\nwere\n  %s", what, spec.SecretsDir,
			strings.Join(now, "\n  "), strings.Join(s.mounts, "\n  "))
	}
}

// stateLeaks lists the paths under the state directory named as a secret
// or holding a value's mark.
func (s *secretsCase) stateLeaks() []string {
	var out []string
	_ = filepath.WalkDir(s.e.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile (a table rewritten), or unreadable
		}
		if _, ok := s.data[d.Name()]; ok {
			out = append(out, "left behind: "+p)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err != nil || info.Size() > 64<<20 {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s.mark)) {
			out = append(out, "a secret's value in "+p)
		}
		return nil
	})
	return out
}

// secretsMounts lists the lines of /proc/self/mountinfo (the host's, for
// a test run on the host) mounted at spec.SecretsDir or below it.
func secretsMounts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp, err := unescapeMountinfo(f[4])
		if err != nil {
			t.Fatalf("mountinfo: %v", err)
		}
		if mp == spec.SecretsDir || strings.HasPrefix(mp, spec.SecretsDir+"/") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	slices.Sort(out)
	return out
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			n, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
			if err != nil {
				return "", fmt.Errorf("escape in %q: %w", s, err)
			}
			b.WriteByte(byte(n))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String(), nil
}

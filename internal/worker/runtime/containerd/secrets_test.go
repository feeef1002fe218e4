package containerd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
	"github.com/brisk-faas/brisk/pkg/spec"
)

var testSecrets = map[string][]byte{
	"api-key":  []byte("containerd-test-key"),
	"blob.bin": {0, '\n', 0xff, 'b', 0, '\r', '\n', 0xfe},
}

func withSecrets(f *spec.Function) *spec.Function {
	f.Secrets = []string{"api-key", "blob.bin"}
	f.SecretData = testSecrets
	return f
}

func secretsReport(t *testing.T, addr string) secretsprobe.Report {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + secretsprobe.Path)
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

// importEchoAs imports the echo image again as ref, running as user.
func importEchoAs(t *testing.T, ref, user string) {
	t.Helper()
	img, err := image.Build(image.Options{Path: echoBin, ExposedPorts: []int{8080}})
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.User = user
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "echo-user.tar")
	if err := image.WriteArchive(archive, img, ref); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := image.Import(context.Background(), client, testNamespace, image.DefaultSnapshotter, f); err != nil {
		t.Fatal(err)
	}
}

// A container running as an unprivileged user reads its secrets and
// cannot write them; the OCI spec binds them read-only, nosuid, nodev,
// noexec from a directory only root reaches, which Kill removes.
func TestSecretsForAnUnprivilegedUser(t *testing.T) {
	testutil.RequiresRoot(t)
	r := newRuntime(t, newPool(t, 1), "")
	ref := image.LocalDomain + "/containerd-test-echo-nobody:latest"
	importEchoAs(t, ref, "65534:65534")
	id := newID()
	f := withSecrets(echoFn("nobody", nil))
	f.Image = ref
	inst := createReady(t, r, id, f)
	got := secretsReport(t, inst.Addr)
	if got.UID != 65534 {
		t.Errorf("the container runs as uid %d, want 65534", got.UID)
	}
	for name, v := range testSecrets {
		if !bytes.Equal(got.Files[name], v) || got.Modes[name] != "-r--r--r--" {
			t.Errorf("%s: %q mode %s, want %q -r--r--r--", name, got.Files[name], got.Modes[name], v)
		}
	}
	if got.CreateErr == "" || got.WriteErr == "" || !slices.Contains(got.Flags, "ro") {
		t.Errorf("writes: create %q, write %q, flags %q; want both refused on a read-only mount", got.CreateErr, got.WriteErr, got.Flags)
	}

	c, err := client.LoadContainer(nsCtx(), id)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Spec(nsCtx())
	if err != nil {
		t.Fatal(err)
	}
	dir := r.secretsDir(id)
	found := false
	for _, m := range s.Mounts {
		if m.Destination != spec.SecretsDir {
			continue
		}
		found = true
		if m.Type != "bind" || m.Source != dir {
			t.Errorf("secrets mount %+v, want a bind of %s", m, dir)
		}
		for _, o := range []string{"rbind", "ro", "nosuid", "nodev", "noexec"} {
			if !slices.Contains(m.Options, o) {
				t.Errorf("secrets mount options %q lack %s", m.Options, o)
			}
		}
	}
	if !found {
		t.Errorf("no mount at %s in the spec: %+v", spec.SecretsDir, s.Mounts)
	}
	if st, err := os.Stat(filepath.Dir(dir)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v, %v; want 0700", filepath.Dir(dir), st.Mode(), err)
	}
	if err := r.Kill(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Kill left %s (stat: %v)", dir, err)
	}
}

// A restarted worker that cannot adopt a sandbox tears it down with its
// secrets, and removes secrets directories no sandbox claims (a worker
// that died during a Create).
func TestRestartRemovesLeftoverSecrets(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	r1 := newRuntime(t, newPool(t, 1), dir)
	id := newID()
	createReady(t, r1, id, withSecrets(echoFn("orphan-secrets", nil)))
	r1.Close()
	orphan := filepath.Join(dir, secretsDirName, "never-created")
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "api-key"), []byte("orphaned"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(orphan, 0o555); err != nil {
		t.Fatal(err)
	}

	r2 := newRuntime(t, newPool(t, 1), dir)
	if list, err := r2.List(context.Background()); err != nil || len(list) != 0 {
		t.Fatalf("List after restart = %+v, %v; want the leftover removed", list, err)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, secretsDirName)); err != nil || len(ents) != 0 {
		t.Errorf("secrets left after the restart: %v, %v", ents, err)
	}
}

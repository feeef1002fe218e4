package install

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/brisk-faas/brisk/internal/image"
)

// staticBinary builds the sandbox init (scripts/build-sandbox-init.sh: C,
// static, built in a moment) into dir/name. The image test uses it for
// both of the image's binaries: what it checks is the image, and a
// CGO_ENABLED=0 build of brisk takes minutes on a shared CI machine.
func staticBinary(t *testing.T, dir, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	if b, err := exec.Command("../../../scripts/build-sandbox-init.sh", out).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no C compiler to build a static binary with: %v\n%s", err, b)
		}
		t.Fatalf("build-sandbox-init.sh: %v\n%s", err, b)
	}
	return out
}

// TestBuildImage builds brisk's image, writes it as the OCI archive `ctr
// images import` reads, and reads it back: the index names it, the config
// runs brisk as user 65532, and the one layer holds both binaries,
// executable, beside each other in /usr/local/bin, and a /tmp.
func TestBuildImage(t *testing.T) {
	dir := t.TempDir()
	brisk := staticBinary(t, dir, "brisk")
	init := staticBinary(t, dir, "brisk-sandbox-init")
	img, err := BuildImage(brisk, init)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "brisk.tar")
	if err := image.WriteArchive(archive, img, ImageRef); err != nil {
		t.Fatal(err)
	}

	// Unpack the archive as an importer would and read it with the OCI
	// layout reader.
	lay := filepath.Join(dir, "layout")
	untar(t, archive, lay)
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations[image.AnnotationRefName] != "brisk.local/brisk:latest" {
		t.Fatalf("index: %+v", im.Manifests)
	}
	got, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/brisk"}) || cf.Config.User != "65532:65532" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config: entrypoint %q, user %q, platform %s/%s", cf.Config.Entrypoint, cf.Config.User, cf.OS, cf.Architecture)
	}
	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(got))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimSuffix(h.Name, "/")] = h
		if h.Typeflag == tar.TypeReg {
			contents[h.Name], _ = io.ReadAll(tr)
		}
	}
	for name, src := range map[string]string{"usr/local/bin/brisk": brisk, "usr/local/bin/brisk-sandbox-init": init} {
		h := files[name]
		if h == nil {
			t.Errorf("the image has no /%s", name)
			continue
		}
		want, _ := os.ReadFile(src)
		if h.Mode&0o111 != 0o111 || h.Uid != 0 || !bytes.Equal(contents[name], want) {
			t.Errorf("/%s: mode %o, uid %d, %d bytes (want %d, executable by all, owned by root)", name, h.Mode, h.Uid, len(contents[name]), len(want))
		}
	}
	if h := files["tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp: %+v, want a sticky world-writable directory", h)
	}

	// The same binaries give the same image: nodes that have it keep it.
	again, err := BuildImage(brisk, init)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same binaries: %s and %s", d1, d2)
	}
}

func TestBuildImageRefusesDynamic(t *testing.T) {
	dir := t.TempDir()
	static := staticBinary(t, dir, "init")
	for _, dyn := range []string{"/bin/sh", "/bin/ls"} {
		if ok, err := image.IsStatic(dyn); err != nil || ok {
			continue
		}
		if _, err := BuildImage(dyn, static); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("BuildImage(%s): %v, want a refusal", dyn, err)
		}
		return
	}
	t.Skip("no dynamically linked binary on this machine")
}

func TestBuildImageMissing(t *testing.T) {
	if _, err := BuildImage("/no/such/brisk", "/no/such/init"); err == nil || !strings.Contains(err.Error(), "/no/such/brisk") {
		t.Errorf("missing binary: %v", err)
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("archive entry %q leaves the directory", h.Name)
		}
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

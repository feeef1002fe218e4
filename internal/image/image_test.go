package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// layerEntries lists the names and modes in img's only layer.
func layerEntries(t *testing.T, img v1.Image) map[string]tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want 1", len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCIUncompressedLayer {
		t.Errorf("layer media type %s", mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = *h
	}
}

func TestBuildFromFile(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "server")
	if err := os.WriteFile(bin, []byte("#!/bin/false\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{Path: bin, Env: []string{"A=1"}, ExposedPorts: []int{8080}}
	img, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !slices.Equal(cf.Config.Entrypoint, []string{"/server"}) ||
		!slices.Contains(cf.Config.Env, "A=1") || len(cf.Config.ExposedPorts) != 1 {
		t.Errorf("config %+v", cf.Config)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	ents := layerEntries(t, img)
	h, ok := ents["server"]
	if len(ents) != 1 || !ok || h.Mode&0o777 != 0o755 || h.Uid != 0 || !h.ModTime.Equal(time.Unix(0, 0)) {
		t.Errorf("layer entries %v", ents)
	}
	// The same input gives the same image.
	again, _ := Build(opts)
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("rebuild changed the digest: %s, %s", d1, d2)
	}
}

func TestBuildFromDirectory(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "bin", "app"), []byte("x"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o644))
	must(os.Symlink("bin/app", filepath.Join(dir, "app")))
	img, err := Build(Options{Path: dir, Entrypoint: []string{"/app"}, WorkingDir: "/"})
	must(err)
	ents := layerEntries(t, img)
	for name, typ := range map[string]byte{"bin/": tar.TypeDir, "bin/app": tar.TypeReg, "config.json": tar.TypeReg, "app": tar.TypeSymlink} {
		if h, ok := ents[name]; !ok || h.Typeflag != typ {
			t.Errorf("entry %s: %+v (present %v), want type %c", name, h, ok, typ)
		}
	}
	if ents["app"].Linkname != "bin/app" {
		t.Errorf("symlink target %q", ents["app"].Linkname)
	}
	if _, err := Build(Options{Path: filepath.Join(dir, "missing")}); err == nil {
		t.Error("Build of a missing path succeeded")
	}
	if _, err := Build(Options{Path: dir, Env: []string{"NOEQUALS"}}); err == nil {
		t.Error("Build with a malformed env succeeded")
	}
}

func TestWriteArchiveIsAnOCILayoutNamingTheRef(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fn")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Options{Path: bin})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "fn.tar")
	if err := WriteArchive(archive, img, Ref("fn")); err != nil {
		t.Fatal(err)
	}
	// Unpack the archive and read it back as a layout.
	out := filepath.Join(dir, "out")
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(out, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		b, _ := io.ReadAll(tr)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, b, 0o644)
	}
	var idx struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	b, err := os.ReadFile(filepath.Join(out, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", b, err)
	}
	if got := idx.Manifests[0].Annotations[AnnotationRefName]; got != "brisk.local/fn:latest" {
		t.Errorf("ref annotation %q", got)
	}
	ii, err := layout.ImageIndexFromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	got, err := ii.Image(want)
	if err != nil {
		t.Fatalf("image %s not in the layout: %v", want, err)
	}
	if _, err := got.Layers(); err != nil {
		t.Error(err)
	}
}

func TestIsStatic(t *testing.T) {
	static, err := IsStatic("/bin/sh")
	if err != nil || static {
		t.Errorf("IsStatic(/bin/sh) = %v, %v; want a dynamic executable", static, err)
	}
	if _, err := IsStatic(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("IsStatic of a missing file succeeded")
	}
}

func TestImportIntoContainerd(t *testing.T) {
	testutil.RequiresRoot(t)
	c, err := containerd.New(DefaultContainerdAddress, containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("containerd at %s: %v", DefaultContainerdAddress, err)
	}
	defer c.Close()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fn")
	if err := os.WriteFile(bin, []byte("imported"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Options{Path: bin})
	if err != nil {
		t.Fatal(err)
	}
	const ns, ref = "brisk-image-test", LocalDomain + "/import-test:latest"
	archive := filepath.Join(dir, "fn.tar")
	if err := WriteArchive(archive, img, ref); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	refs, err := Import(context.Background(), c, ns, DefaultSnapshotter, f)
	if err != nil || !slices.Equal(refs, []string{ref}) {
		t.Fatalf("Import = %v, %v", refs, err)
	}
	ctx := namespaces.WithNamespace(context.Background(), ns)
	defer c.ImageService().Delete(ctx, ref)
	got, err := c.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got.Target().Digest.String() != want.String() {
		t.Errorf("imported digest %s, built %s", got.Target().Digest, want)
	}
	if ok, err := got.IsUnpacked(ctx, DefaultSnapshotter); !ok || err != nil {
		t.Errorf("IsUnpacked = %v, %v", ok, err)
	}
}

// The trace image is built around the lean brisk-trace binary found beside
// the brisk executable, with its own entrypoint; without one (and with the
// source tree at hand) brisk-trace is built from source, never the whole brisk.
func TestTraceBuildOptionsPrefersTheLeanBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds brisk-trace with the go command")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "brisk")
	lean := filepath.Join(dir, "brisk-trace")
	if err := goBuild(context.Background(), sourceTree(), "./cmd/brisk-trace", lean); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	opts, err := TraceBuildOptions(context.Background(), exe, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Path != lean || !slices.Equal(opts.Entrypoint, []string{"/brisk-trace"}) {
		t.Fatalf("options %+v: want %s with entrypoint /brisk-trace", opts, lean)
	}

	os.Remove(lean)
	out := t.TempDir()
	opts, err = TraceBuildOptions(context.Background(), exe, out)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Path != filepath.Join(out, "brisk-trace") || !slices.Equal(opts.Entrypoint, []string{"/brisk-trace"}) {
		t.Fatalf("without a lean binary beside brisk: options %+v, want one built into %s", opts, out)
	}
	if ok, err := IsStatic(opts.Path); err != nil || !ok {
		t.Fatalf("built brisk-trace static=%v err=%v", ok, err)
	}
}

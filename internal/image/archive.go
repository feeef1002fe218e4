package image

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations naming an image in an index: the OCI one, and containerd's,
// which its importer prefers when both are present.
const (
	AnnotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

// WriteLayout writes img as an OCI image layout in dir (created if needed),
// its index naming it ref. An existing layout in dir is replaced.
func WriteLayout(dir string, img v1.Image, ref string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	p, err := layout.Write(dir, idx)
	if err != nil {
		return fmt.Errorf("image %s: layout %s: %w", ref, dir, err)
	}
	anns := map[string]string{AnnotationRefName: ref, annotationContainerdRef: ref}
	plat := v1.Platform{OS: "linux", Architecture: "amd64"}
	if err := p.AppendImage(img, layout.WithAnnotations(anns), layout.WithPlatform(plat)); err != nil {
		return fmt.Errorf("image %s: layout %s: %w", ref, dir, err)
	}
	return nil
}

// WriteArchive writes img as an OCI archive at path: a tar of its image
// layout, the form `ctr images import` and containerd's Import read. The
// file is replaced atomically.
func WriteArchive(path string, img v1.Image, ref string) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".layout-*")
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	defer os.RemoveAll(dir)
	if err := WriteLayout(dir, img, ref); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".archive-*.tar")
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	err = TarDir(f, dir)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("image %s: archive %s: %w", ref, path, err)
	}
	return nil
}

// TarDir writes the regular files and directories under dir to w as a tar
// stream with paths relative to dir.
func TarDir(w io.Writer, dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err == nil && p != dir {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		return err
	}
	slices.Sort(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if !st.IsDir() && !st.Mode().IsRegular() {
			continue
		}
		if err := addEntry(tw, p, filepath.ToSlash(rel), st); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addEntry(tw *tar.Writer, path, name string, st fs.FileInfo) error {
	if st.IsDir() {
		hdr, err := tar.FileInfoHeader(st, "")
		if err != nil {
			return err
		}
		normalize(hdr, name)
		return tw.WriteHeader(hdr)
	}
	return addFile(tw, path, name, st)
}

package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/brisk-faas/brisk/internal/image/ref"
)

// LocalDomain is the domain of the references brisk gives images it builds
// (package ref).
const LocalDomain = ref.LocalDomain

// Ref is the default reference of an image built under name:
// brisk.local/<name>:latest.
func Ref(name string) string { return ref.Of(name) }

// nameRE is the path component grammar of OCI references.
var nameRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$`)

// Options describe an image to build.
type Options struct {
	// Path is a file, which goes to /<basename>, or a directory, whose
	// content goes to / (symlinks are kept as links).
	Path string
	// Files are host files put at paths of their own, after Path's
	// content (HostFiles collects them).
	Files []File
	// Entrypoint and Cmd are the image's; when both are empty and Path is a
	// file, the entrypoint is that file.
	Entrypoint, Cmd []string
	Env             []string // KEY=VALUE
	WorkingDir      string
	User            string // uid[:gid] the image's processes run as; "" root
	ExposedPorts    []int  // TCP
}

// Build builds a linux/amd64 OCI image with one uncompressed layer holding
// Path. Layer entries have fixed owners (0:0) and times (the Unix epoch), so
// the same input always yields the same digests and a rebuilt image reuses
// the layer a worker has already unpacked. The layer is built in memory.
func Build(o Options) (v1.Image, error) {
	if o.Path == "" && len(o.Files) == 0 {
		return nil, errors.New("image: no path to put in the image")
	}
	for _, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("image: env %q: want KEY=VALUE", kv)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if o.Path != "" {
		st, err := os.Stat(o.Path)
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		if st.IsDir() {
			err = addDir(tw, o.Path)
		} else {
			err = addFile(tw, o.Path, filepath.Base(o.Path), st)
			if err == nil && len(o.Entrypoint) == 0 && len(o.Cmd) == 0 {
				o.Entrypoint = []string{"/" + filepath.Base(o.Path)}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("image: layer from %s: %w", o.Path, err)
		}
	}
	if err := addFiles(tw, o.Files); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	layer := static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint, cf.Config.Cmd = o.Entrypoint, o.Cmd
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, o.Env...)
	cf.Config.WorkingDir = o.WorkingDir
	cf.Config.User = o.User
	if len(o.ExposedPorts) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range o.ExposedPorts {
			cf.Config.ExposedPorts[strconv.Itoa(p)+"/tcp"] = struct{}{}
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// ValidName reports whether name can be the last path component of an
// image reference (lowercase letters, digits and separators).
func ValidName(name string) bool { return len(name) <= 128 && nameRE.MatchString(name) }

func addFile(tw *tar.Writer, path, name string, st fs.FileInfo) error {
	return addFileTimed(tw, path, name, st, false)
}

// addFileTimed is addFile, keeping the file's modification time when
// keepTime is set.
func addFileTimed(tw *tar.Writer, path, name string, st fs.FileInfo, keepTime bool) error {
	hdr, err := tar.FileInfoHeader(st, "")
	if err != nil {
		return err
	}
	normalize(hdr, name)
	if keepTime {
		hdr.ModTime = st.ModTime().Truncate(time.Second)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(tw, f)
	return err
}

// addDir adds dir's content at the root, in lexical order.
func addDir(tw *tar.Writer, dir string) error {
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
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		name := filepath.ToSlash(rel)
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case st.Mode().IsRegular():
			if err := addFile(tw, p, name, st); err != nil {
				return err
			}
		case st.IsDir() || st.Mode()&fs.ModeSymlink != 0:
			link := ""
			if st.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			}
			hdr, err := tar.FileInfoHeader(st, link)
			if err != nil {
				return err
			}
			normalize(hdr, name)
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: %v files cannot go into an image", p, st.Mode().Type())
		}
	}
	return nil
}

func normalize(hdr *tar.Header, name string) {
	if hdr.Typeflag == tar.TypeDir {
		name += "/"
	}
	hdr.Name = name
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
	hdr.Format = tar.FormatUnknown // the writer picks the smallest that fits
}

package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// File is one entry of an image's layer taken from the host: a regular
// file's content, a symbolic link, or a directory.
type File struct {
	Name   string // absolute path in the image
	Source string // host file whose content Name gets; "" for links and directories
	Link   string // symlink target, as the host has it
	Dir    bool
}

// HostFiles collects host paths into image entries that reproduce them at
// the same paths: every symlink met on the way, in a path's directories
// as in its last component, becomes a link in the image too and is
// followed, so that an interpreter, its loader, libraries and library
// directories resolve in the image exactly as on the host. Directories are
// added with what is under them, except what Skip refuses.
type HostFiles struct {
	// Skip, when set, leaves out a directory's entry (and what is under
	// it) when it returns true for its host path and name.
	Skip  func(hostPath string, d fs.DirEntry) bool
	files map[string]File
}

// maxLinks bounds the symlinks followed for one path, as the kernel's
// ELOOP does.
const maxLinks = 40

// Add adds host path p (absolute).
func (h *HostFiles) Add(p string) error {
	if h.files == nil {
		h.files = map[string]File{}
	}
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s: want an absolute path", p)
	}
	p = filepath.Clean(p)
	for range maxLinks {
		next, err := h.resolveOnce(p)
		if err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		p = next
	}
	return fmt.Errorf("%s: too many levels of symbolic links", p)
}

// resolveOnce adds p's directories up to the first symlink among p and
// them; it returns the path that symlink leads to, or "" once p itself
// has been added.
func (h *HostFiles) resolveOnce(p string) (string, error) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		cur = filepath.Join(cur, part)
		st, err := os.Lstat(cur)
		if err != nil {
			return "", err
		}
		rest := filepath.Join(parts[i+1:]...)
		switch {
		case st.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(cur)
			if err != nil {
				return "", err
			}
			h.files[cur] = File{Name: cur, Link: target}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(cur), target)
			}
			return filepath.Join(target, rest), nil
		case i < len(parts)-1:
			if !st.IsDir() {
				return "", fmt.Errorf("%s: not a directory", cur)
			}
			h.files[cur] = File{Name: cur, Dir: true}
		case st.IsDir():
			return "", h.addTree(cur)
		case st.Mode().IsRegular():
			h.files[cur] = File{Name: cur, Source: cur}
		default:
			return "", fmt.Errorf("%s: %v files cannot go into an image", cur, st.Mode().Type())
		}
	}
	return "", nil
}

// addTree adds dir and what is under it; symlinks under it are kept as
// links, not followed.
func (h *HostFiles) addTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir && h.Skip != nil && h.Skip(p, d) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch t := d.Type(); {
		case t.IsDir():
			h.files[p] = File{Name: p, Dir: true}
		case t&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.files[p] = File{Name: p, Link: target}
		case t.IsRegular():
			h.files[p] = File{Name: p, Source: p}
		}
		// Sockets, devices and pipes are left out.
		return nil
	})
}

// Files returns the entries, each directory before what is in it.
func (h *HostFiles) Files() []File {
	out := make([]File, 0, len(h.files))
	for _, f := range h.files {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// addFiles writes files, each directory's parents first.
func addFiles(tw *tar.Writer, files []File) error {
	have := map[string]bool{}
	var parents func(name string) error
	parents = func(name string) error {
		d := path.Dir(name)
		if d == "." || d == "" || have[d] {
			return nil
		}
		if err := parents(d); err != nil {
			return err
		}
		have[d] = true
		return writeDir(tw, d)
	}
	for _, f := range files {
		name := strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(f.Name)), "/")
		if name == "" {
			continue
		}
		if err := parents(name); err != nil {
			return err
		}
		switch {
		case f.Dir:
			if have[name] {
				continue
			}
			have[name] = true
			if err := writeDir(tw, name); err != nil {
				return err
			}
		case f.Link != "":
			hdr := &tar.Header{Typeflag: tar.TypeSymlink, Linkname: f.Link, Mode: 0o777}
			normalize(hdr, name)
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case f.Source != "":
			st, err := os.Stat(f.Source)
			if err != nil {
				return err
			}
			if !st.Mode().IsRegular() {
				return fmt.Errorf("%s: not a regular file", f.Source)
			}
			// Host files keep their times: Python checks a cached
			// module (.pyc) against its source's, and recompiles every
			// module on every start when they differ.
			if err := addFileTimed(tw, f.Source, name, st, true); err != nil {
				return err
			}
		default:
			return errors.New("image: a file entry with no source, link or directory: " + f.Name)
		}
	}
	return nil
}

func writeDir(tw *tar.Writer, name string) error {
	hdr := &tar.Header{Typeflag: tar.TypeDir, Mode: 0o755}
	normalize(hdr, name)
	return tw.WriteHeader(hdr)
}

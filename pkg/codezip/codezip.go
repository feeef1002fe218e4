// Package codezip checks, packs and unpacks the zip archives functions are
// deployed from (spec.Code): the control plane checks one when it is
// uploaded, a worker unpacks it into the directory its sandboxes run from.
package codezip

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// ErrInvalid wraps every reason an archive is refused.
var ErrInvalid = errors.New("invalid code archive")

// Digest is the archive's name everywhere: "sha256:" and its hex SHA-256.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Archive is a checked archive.
type Archive struct {
	r     *zip.Reader
	Files []string // regular files' paths, sorted
	Size  int64    // their unpacked bytes
}

// Open checks an archive: a zip of at most spec.MaxCodeBytes, with at most
// spec.MaxCodeFiles entries and spec.MaxCodeUnpackedBytes unpacked,
// holding only directories and regular files under relative, clean paths
// (no "..", no absolute path, no symbolic link, no device).
func Open(data []byte) (*Archive, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if len(data) > spec.MaxCodeBytes {
		return nil, bad("%d bytes, at most %d", len(data), spec.MaxCodeBytes)
	}
	r, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, bad("not a zip file (%v)", err)
	}
	if len(r.File) > spec.MaxCodeFiles {
		return nil, bad("%d entries, at most %d", len(r.File), spec.MaxCodeFiles)
	}
	a := &Archive{r: r}
	seen := make(map[string]bool, len(r.File))
	for _, f := range r.File {
		name, err := cleanName(f.Name)
		if err != nil {
			return nil, bad("%v", err)
		}
		mode := f.Mode()
		switch {
		case mode.IsDir():
			continue
		case !mode.IsRegular():
			return nil, bad("%s: a %s; only regular files and directories are allowed", f.Name, kind(mode))
		}
		if seen[name] {
			return nil, bad("%s: listed twice", name)
		}
		seen[name] = true
		if f.UncompressedSize64 > spec.MaxCodeUnpackedBytes {
			return nil, bad("%s: %d bytes unpacked", name, f.UncompressedSize64)
		}
		a.Size += int64(f.UncompressedSize64)
		if a.Size > spec.MaxCodeUnpackedBytes {
			return nil, bad("more than %d bytes unpacked", spec.MaxCodeUnpackedBytes)
		}
		a.Files = append(a.Files, name)
	}
	if len(a.Files) == 0 {
		return nil, bad("no files")
	}
	slices.Sort(a.Files)
	return a, nil
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		return "device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// cleanName is an entry's path as unpacked, refused if it is absolute or
// leaves the archive's root.
func cleanName(n string) (string, error) {
	if n == "" || strings.ContainsRune(n, 0) || strings.Contains(n, `\`) {
		return "", fmt.Errorf("entry name %q is not a clean relative path", n)
	}
	c := path.Clean(strings.TrimSuffix(n, "/"))
	if path.IsAbs(c) || c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("entry name %q leaves the archive's root", n)
	}
	return c, nil
}

// Has reports whether the archive holds the regular file name.
func (a *Archive) Has(name string) bool {
	_, ok := slices.BinarySearch(a.Files, name)
	return ok
}

// CheckHandler says whether the archive holds the module c's handler
// names, and, when not, which files it looked for and some it has.
func (a *Archive) CheckHandler(c *spec.Code) error {
	want := c.ModuleFiles()
	for _, f := range want {
		if a.Has(f) {
			return nil
		}
	}
	have := a.Files[:min(len(a.Files), 8)]
	more := ""
	if len(a.Files) > len(have) {
		more = fmt.Sprintf(", and %d more", len(a.Files)-len(have))
	}
	return fmt.Errorf("handler %s: the code archive has no %s (it holds %s%s)", c.Handler, strings.Join(want, " or "), strings.Join(have, ", "), more)
}

// Unpack writes the archive's files under dir (made; it must not exist),
// readable by everyone (0644, 0755 for executables and directories), as
// a sandbox of any user must read them. Nothing is written outside dir.
func (a *Archive) Unpack(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	var total int64
	for _, f := range a.r.File {
		name, err := cleanName(f.Name)
		if err != nil {
			return err
		}
		if f.Mode().IsDir() {
			if err := mkdirAll(root, name); err != nil {
				return err
			}
			continue
		}
		if d := path.Dir(name); d != "." {
			if err := mkdirAll(root, d); err != nil {
				return err
			}
		}
		perm := os.FileMode(0o644)
		if f.Mode()&0o111 != 0 {
			perm = 0o755
		}
		n, err := writeFile(root, name, f, perm, spec.MaxCodeUnpackedBytes-total)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		total += n
	}
	return nil
}

func mkdirAll(root *os.Root, name string) error {
	p := ""
	for _, el := range strings.Split(name, "/") {
		p = path.Join(p, el)
		if err := root.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// writeFile copies one entry, at most limit bytes: the sizes a zip
// declares are not to be trusted.
func writeFile(root *os.Root, name string, f *zip.File, perm os.FileMode, limit int64) (int64, error) {
	rc, err := f.Open()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	out, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, io.LimitReader(rc, limit+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > limit {
		err = fmt.Errorf("%w: more than %d bytes unpacked", ErrInvalid, spec.MaxCodeUnpackedBytes)
	}
	if err == nil {
		err = root.Chmod(name, perm) // umask-independent
	}
	return n, err
}

// ZipFile packs one file into an archive, at its root.
func ZipFile(p string) ([]byte, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	return ZipFiles(map[string][]byte{filepath.Base(p): data})
}

// ZipFiles packs files (archive path → content) into an archive, in path
// order, the same files always into the same bytes.
func ZipFiles(files map[string][]byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, Modified: zipTime})
		if err != nil {
			return nil, err
		}
		if _, err := w.Write(files[name]); err != nil {
			return nil, err
		}
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// zipTime dates every entry the packers write: the same files, the same
// bytes and digest, whatever their mtimes.
var zipTime = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)

// Zip packs the files under dir (regular files and directories; symbolic
// links are refused, as Open would) into an archive: what the CLI uploads
// for `fn deploy --code DIR`.
func Zip(dir string) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if d.Name() == "__pycache__" || d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: a %s; the code may hold only regular files and directories", rel, kind(d.Type()))
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := zip.FileInfoHeader(info)
		if err != nil {
			return err
		}
		h.Name, h.Method = rel, zip.Deflate
		h.Modified = zipTime
		w, err := zw.CreateHeader(h)
		if err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(w, src)
		if err == nil && buf.Len() > spec.MaxCodeBytes {
			err = fmt.Errorf("the code is over %d bytes zipped", spec.MaxCodeBytes)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

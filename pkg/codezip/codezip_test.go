package codezip

import (
	"archive/zip"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/spec"
)

type entry struct {
	name string
	mode fs.FileMode
	data string
}

func archive(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		h.SetMode(e.mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestOpenRefusesWhatCannotBeUnpackedSafely(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{"not a zip", []byte("hello"), "not a zip file"},
		{"parent", archive(t, entry{"../evil.py", 0o644, "x"}), "leaves the archive's root"},
		{"nested parent", archive(t, entry{"a/../../evil.py", 0o644, "x"}), "leaves the archive's root"},
		{"absolute", archive(t, entry{"/etc/passwd", 0o644, "x"}), "leaves the archive's root"},
		{"backslash", archive(t, entry{`..\evil.py`, 0o644, "x"}), "not a clean relative path"},
		{"symlink", archive(t, entry{"link", fs.ModeSymlink | 0o777, "/etc/shadow"}), "symbolic link"},
		{"device", archive(t, entry{"dev", fs.ModeDevice | 0o600, ""}), "device"},
		{"twice", archive(t, entry{"a.py", 0o644, "1"}, entry{"./a.py", 0o644, "2"}), "listed twice"},
		{"empty", archive(t, entry{"dir/", fs.ModeDir | 0o755, ""}), "no files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.data)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Open: %v; want ErrInvalid saying %q", err, tc.wantErr)
			}
		})
	}
}

func TestOpenBoundsUnpackedSize(t *testing.T) {
	// A zip bomb: a small archive whose files would unpack past the limit.
	big := strings.Repeat("0", 1<<20)
	var entries []entry
	for i := 0; i <= spec.MaxCodeUnpackedBytes>>20; i++ {
		entries = append(entries, entry{filepath.Join("d", strings.Repeat("x", i%50+1)+string(rune('a'+i%26))+".txt") + "-" + itoa(i), 0o644, big})
	}
	data := archive(t, entries...)
	if len(data) > spec.MaxCodeBytes {
		t.Fatalf("the test archive is %d bytes: not a bomb", len(data))
	}
	if _, err := Open(data); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "unpacked") {
		t.Fatalf("Open: %v; want the unpacked size refused", err)
	}
}

func itoa(i int) string {
	return string([]byte{byte('0' + i/100%10), byte('0' + i/10%10), byte('0' + i%10)})
}

func TestUnpackWritesReadableFilesInsideDir(t *testing.T) {
	data := archive(t,
		entry{"app.py", 0o600, "def handler(e, c): return 1\n"},
		entry{"bin/tool", 0o700, "#!/bin/sh\n"},
		entry{"pkg/", fs.ModeDir | 0o700, ""},
		entry{"pkg/mod.py", 0o644, "X = 1\n"})
	a, err := Open(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(a.Files, ","); got != "app.py,bin/tool,pkg/mod.py" {
		t.Fatalf("files %s", got)
	}
	dir := filepath.Join(t.TempDir(), "code")
	if err := a.Unpack(dir); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]fs.FileMode{"app.py": 0o644, "bin/tool": 0o755, "pkg/mod.py": 0o644, "pkg": fs.ModeDir | 0o755, "bin": fs.ModeDir | 0o755} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, st.Mode(), want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "pkg/mod.py")); string(b) != "X = 1\n" {
		t.Errorf("pkg/mod.py holds %q", b)
	}
}

func TestCheckHandler(t *testing.T) {
	a, err := Open(archive(t, entry{"app.py", 0o644, ""}, entry{"pkg/__init__.py", 0o644, ""}, entry{"web/index.js", 0o644, ""}, entry{"lib.mjs", 0o644, ""}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		code spec.Code
		ok   bool
	}{
		{spec.Code{Language: spec.LangPython, Handler: "app.handler"}, true},
		{spec.Code{Language: spec.LangPython, Handler: "pkg.handler"}, true},
		{spec.Code{Language: spec.LangPython, Handler: "main.handler"}, false},
		{spec.Code{Language: spec.LangNode, Handler: "web.handler"}, true},
		{spec.Code{Language: spec.LangNode, Handler: "lib.handler"}, true},
		{spec.Code{Language: spec.LangNode, Handler: "app.handler"}, false},
	} {
		err := a.CheckHandler(&tc.code)
		if (err == nil) != tc.ok {
			t.Errorf("%s %s: %v, want ok=%v", tc.code.Language, tc.code.Handler, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "app.py") {
			t.Errorf("%s: %v; want the archive's files named", tc.code.Handler, err)
		}
	}
}

func TestZipIsReproducible(t *testing.T) {
	dir := t.TempDir()
	for p, data := range map[string]string{"app.py": "A", "lib/x.py": "B", "__pycache__/app.cpython-311.pyc": "junk"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	z1, err := Zip(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(dir, "app.py"), fixedTime, fixedTime); err != nil {
		t.Fatal(err)
	}
	z2, err := Zip(dir)
	if err != nil {
		t.Fatal(err)
	}
	if Digest(z1) != Digest(z2) {
		t.Fatal("the same tree zipped twice gave two digests")
	}
	a, err := Open(z1)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(a.Files, ","); got != "app.py,lib/x.py" {
		t.Fatalf("files %s; want __pycache__ left out", got)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := Zip(dir); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Zip with a symlink: %v", err)
	}
}

var fixedTime = time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)

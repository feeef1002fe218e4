package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// hostInterpreter returns the first of paths that exists, or skips.
func hostInterpreter(t *testing.T, paths ...string) string {
	for _, p := range paths {
		if abs, err := exec.LookPath(p); err == nil {
			return abs
		}
	}
	t.Skipf("none of %v on this host", paths)
	return ""
}

// loaderList is what the host's dynamic loader resolves for obj, each
// path with its symlinks resolved.
func loaderList(t *testing.T, loader, obj string) []string {
	out, err := exec.Command(loader, "--list", obj).Output()
	if err != nil {
		t.Fatalf("%s --list %s: %v", loader, obj, err)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		p, _, _ := strings.Cut(line, " (")
		if filepath.IsAbs(p) {
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				t.Fatal(err)
			}
			libs = append(libs, real)
		}
	}
	return libs
}

// The libraries found by reading ELF headers are the ones the host's
// loader maps, for the interpreters and Python's extension modules.
func TestSharedLibrariesMatchTheLoader(t *testing.T) {
	for _, interp := range []string{"/usr/bin/python3", "/usr/bin/node"} {
		if _, err := os.Stat(interp); err != nil {
			continue
		}
		objs := []string{interp}
		ext, _ := filepath.Glob("/usr/lib/python3*/lib-dynload/_ssl*.so")
		objs = append(objs, ext...)
		loader, err := elfInterp(interp)
		if err != nil || loader == "" {
			t.Fatalf("%s: loader %q, %v", interp, loader, err)
		}
		for _, o := range objs {
			got, err := sharedLibraries([]string{o})
			if err != nil {
				t.Fatal(err)
			}
			var real []string
			for _, p := range got {
				r, err := filepath.EvalSymlinks(p)
				if err != nil {
					t.Fatal(err)
				}
				real = append(real, r)
			}
			want := loaderList(t, loader, o)
			for _, w := range want {
				if !slices.Contains(real, w) {
					t.Errorf("%s: the loader maps %s, which sharedLibraries missed (found %v)", o, w, real)
				}
			}
		}
	}
}

// A language image holds the interpreter at its host path with its
// loader, libraries and (for Python) standard library, symlinks kept, and
// runs as nobody.
func TestLangOptions(t *testing.T) {
	py := hostInterpreter(t, "/usr/bin/python3")
	o, err := LangOptions("python", py)
	if err != nil {
		t.Fatal(err)
	}
	if o.User != NobodyUser {
		t.Errorf("user %q, want %q", o.User, NobodyUser)
	}
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	entries := layerEntries(t, img)
	real, _ := filepath.EvalSymlinks(py)
	stdlib := filepath.Join(filepath.Dir(filepath.Dir(real)), "lib", filepath.Base(real))
	loader, _ := elfInterp(real)
	for _, p := range []string{py, real, loader, stdlib + "/os.py", stdlib + "/json/__init__.py", stdlib + "/lib-dynload"} {
		if !inImage(entries, p) {
			t.Errorf("the image lacks %s", p)
		}
	}
	// Python checks a cached module against its source's time: a layer
	// that zeroed times would make every start compile every module.
	osPy := stdlib + "/os.py"
	if st, err := os.Stat(osPy); err == nil {
		if h := entries[strings.TrimPrefix(osPy, "/")]; !h.ModTime.Equal(st.ModTime().Truncate(time.Second)) {
			t.Errorf("%s has time %v in the image, %v on the host", osPy, h.ModTime, st.ModTime())
		}
	}
	if py != real {
		if h := entries[strings.TrimPrefix(py, "/")]; h.Typeflag != tar.TypeSymlink {
			t.Errorf("%s is a symlink on the host and %c in the image", py, h.Typeflag)
		}
	}
	for name := range entries {
		if strings.Contains(name, "/test/") || strings.Contains(name, "/config-3") {
			t.Fatalf("the image holds %s: tests and build files are left out", name)
		}
	}
	if _, err := LangOptions("ruby", py); err == nil {
		t.Error("a language with no base image was accepted")
	}
	if _, err := LangOptions("python", "python3"); err == nil {
		t.Error("a relative interpreter was accepted")
	}
}

// inImage reports whether p resolves to an entry of the layer, following
// the layer's symlinks as the kernel would.
func inImage(entries map[string]tar.Header, p string) bool {
	for range 40 {
		parts := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
		next := ""
		for i := range parts {
			cur := strings.Join(parts[:i+1], "/")
			h, ok := entries[cur]
			if !ok {
				h, ok = entries[cur+"/"]
			}
			if !ok {
				return false
			}
			if h.Typeflag == tar.TypeSymlink {
				target := h.Linkname
				if !filepath.IsAbs(target) {
					target = filepath.Join("/", filepath.Dir(cur), target)
				}
				next = filepath.Join(append([]string{target}, parts[i+1:]...)...)
				break
			}
		}
		if next == "" {
			return true
		}
		p = next
	}
	return false
}

package image

import (
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/brisk-faas/brisk/internal/image/ref"
)

// Language base images: what runs functions deployed from source on
// runtimes that run only images (containerd). brisk builds them from the
// worker's own interpreter, so that a function behaves as on the process
// and native runtimes, which run that interpreter directly.

// LangRef is the reference of the base image of lang ("python", "node").
func LangRef(lang string) string { return ref.Lang(lang) }

// NobodyUser is the user language images run as: the sandbox's code has
// no owner's rights over anything in the image.
const NobodyUser = "65534:65534"

// Directories of a Python installation's standard library left out of its
// image: tests, the IDE, Tk, the bundled pip wheels, and the static
// library and build files under config-*.
var pythonSkip = map[string]bool{"test": true, "idlelib": true, "tkinter": true, "turtledemo": true,
	"ensurepip": true, "site-packages": true, "dist-packages": true}

// LangOptions are the build options of lang's base image around the host
// interpreter interp (absolute): the interpreter at its own path, the
// dynamic loader and every library it and its extension modules load
// (as the host's loader resolves them), for Python its standard library,
// and the host's CA bundle when it has one, so that TLS from a function
// verifies as on the host. Paths are the host's, symlinks included.
func LangOptions(lang, interp string) (Options, error) {
	if !filepath.IsAbs(interp) {
		return Options{}, fmt.Errorf("%s interpreter %q: want an absolute path", lang, interp)
	}
	h := &HostFiles{Skip: func(p string, d fs.DirEntry) bool {
		name := d.Name()
		return d.IsDir() && (pythonSkip[name] || strings.HasPrefix(name, "config-"))
	}}
	if err := h.Add(interp); err != nil {
		return Options{}, fmt.Errorf("%s image: %w", lang, err)
	}
	elfs := []string{interp}
	switch lang {
	case "python":
		dirs, err := pythonPaths(interp)
		if err != nil {
			return Options{}, err
		}
		for _, d := range dirs {
			if err := h.Add(d); err != nil {
				return Options{}, fmt.Errorf("python image: %w", err)
			}
			// Extension modules load libraries of their own (_ssl:
			// libssl, _sqlite3: libsqlite3, ...).
			_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
				if err == nil && e.Type().IsRegular() && strings.HasSuffix(p, ".so") {
					elfs = append(elfs, p)
				}
				return nil
			})
		}
	case "node":
	default:
		return Options{}, fmt.Errorf("no base image for language %q", lang)
	}
	loader, err := elfInterp(interp)
	if err != nil {
		return Options{}, fmt.Errorf("%s image: %w", lang, err)
	}
	if loader != "" {
		if err := h.Add(loader); err != nil {
			return Options{}, fmt.Errorf("%s image: loader: %w", lang, err)
		}
		libs, err := sharedLibraries(elfs)
		if err != nil {
			return Options{}, fmt.Errorf("%s image: %w", lang, err)
		}
		for _, l := range libs {
			if err := h.Add(l); err != nil {
				return Options{}, fmt.Errorf("%s image: %w", lang, err)
			}
		}
	}
	for _, p := range []string{"/etc/ssl/certs/ca-certificates.crt", "/usr/lib/ssl/cert.pem"} {
		if _, err := os.Lstat(p); err == nil {
			_ = h.Add(p) // the bundle is a convenience: an odd one is left out
		}
	}
	return Options{Files: h.Files(), User: NobodyUser, WorkingDir: "/"}, nil
}

// pythonPaths finds the standard library of the Python at interp the way
// Python does from its executable's location: PREFIX/lib/pythonX.Y (with
// lib-dynload inside) for PREFIX/bin/pythonX.Y. No interpreter is run: a
// containerd worker reaps every child (containerd.BecomeSubreaper), so it
// cannot wait for one.
func pythonPaths(interp string) ([]string, error) {
	real, err := filepath.EvalSymlinks(interp)
	if err != nil {
		return nil, fmt.Errorf("python image: %w", err)
	}
	prefix := filepath.Dir(filepath.Dir(real))
	var dirs []string
	for _, lib := range []string{"lib", "lib64"} {
		found, _ := filepath.Glob(filepath.Join(prefix, lib, "python3*", "os.py"))
		for _, f := range found {
			dirs = append(dirs, filepath.Dir(f))
		}
		if len(dirs) > 0 {
			break
		}
	}
	switch {
	case len(dirs) == 0:
		return nil, fmt.Errorf("python image: no standard library (lib/python3*/os.py) under %s, the prefix of %s", prefix, real)
	case len(dirs) > 1:
		// Several versions share the prefix: the one named like the
		// executable (python3.11), else the only one there is.
		want := filepath.Join(prefix, "lib", filepath.Base(real))
		if !slices.Contains(dirs, want) {
			return nil, fmt.Errorf("python image: %s holds %d standard libraries and none is %s", prefix, len(dirs), want)
		}
		dirs = []string{want}
	}
	return dirs, nil
}

// elfInterp is the dynamic loader exe names, "" for a static executable.
func elfInterp(exe string) (string, error) {
	f, err := elf.Open(exe)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", fmt.Errorf("%s: PT_INTERP: %w", exe, err)
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", nil
}

// sharedLibraries resolves the libraries objs need, and theirs, as the
// dynamic loader would: each object's DT_RPATH (without a DT_RUNPATH) or
// DT_RUNPATH, then the directories of /etc/ld.so.conf, then the default
// ones; a candidate must be an ELF object of the object's own class and
// machine. It reads files only (see pythonPaths on why it runs nothing).
func sharedLibraries(objs []string) ([]string, error) {
	system := append(ldSoConf("/etc/ld.so.conf", 0), "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
	seen := map[string]bool{}
	var libs []string
	queue := slices.Clone(objs)
	for len(queue) > 0 {
		o := queue[0]
		queue = queue[1:]
		f, err := elf.Open(o)
		if err != nil {
			return nil, err
		}
		needed, _ := f.ImportedLibraries()
		runpath, _ := f.DynString(elf.DT_RUNPATH)
		if len(runpath) == 0 {
			runpath, _ = f.DynString(elf.DT_RPATH)
		}
		class, machine := f.Class, f.Machine
		f.Close()
		var dirs []string
		for _, rp := range runpath {
			for _, d := range strings.Split(rp, ":") {
				d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", "$ORIGIN"), "$ORIGIN", filepath.Dir(o))
				if filepath.IsAbs(d) {
					dirs = append(dirs, d)
				}
			}
		}
		dirs = append(dirs, system...)
		for _, name := range needed {
			p := findLibrary(name, dirs, class, machine)
			if p == "" {
				return nil, fmt.Errorf("%s needs %s, which is in none of %s", o, name, strings.Join(dirs, ", "))
			}
			if !seen[p] {
				seen[p] = true
				libs = append(libs, p)
				queue = append(queue, p)
			}
		}
	}
	return libs, nil
}

func findLibrary(name string, dirs []string, class elf.Class, machine elf.Machine) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		ok := f.Class == class && f.Machine == machine
		f.Close()
		if ok {
			return p
		}
	}
	return ""
}

// ldSoConf lists the directories of a loader configuration file, its
// includes (globs) followed.
func ldSoConf(path string, depth int) []string {
	b, err := os.ReadFile(path)
	if err != nil || depth > 8 {
		return nil
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		line = strings.TrimSpace(line)
		if inc, ok := strings.CutPrefix(line, "include "); ok {
			matches, _ := filepath.Glob(strings.TrimSpace(inc))
			slices.Sort(matches)
			for _, m := range matches {
				dirs = append(dirs, ldSoConf(m, depth+1)...)
			}
			continue
		}
		if filepath.IsAbs(line) {
			dirs = append(dirs, line)
		}
	}
	return dirs
}

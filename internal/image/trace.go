package image

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/brisk-faas/brisk/internal/image/ref"
	"github.com/brisk-faas/brisk/internal/tracefn"
)

// Trace describes the built-in trace function's image.
const (
	TraceName = ref.TraceName
	// TraceSubcommand is the hidden brisk subcommand serving the function.
	TraceSubcommand = tracefn.Subcommand
	briskModule     = "github.com/brisk-faas/brisk"
)

// TraceRef is the reference of the built-in trace function's image; the
// containerd runtime runs `--builtin trace` functions from it.
var TraceRef = ref.Trace

// TraceOptions are the build options of the trace function image around a
// static brisk binary. Inside a container the function must listen on all
// addresses, not on loopback.
func TraceOptions(staticBrisk string) Options {
	return Options{
		Path:       staticBrisk,
		Entrypoint: []string{"/" + filepath.Base(staticBrisk), TraceSubcommand},
		Env:        []string{tracefn.EnvListenHost + "=0.0.0.0"},
	}
}

// TraceBuildOptions returns the build options of the trace function image
// for the brisk executable exe. It prefers the lean brisk-trace binary
// (cmd/brisk-trace, ~2 ms from exec to serving against ~10 ms for brisk,
// which every cold start pays): beside exe when it is there and static,
// otherwise built into dir from the brisk source tree when one is found.
// Failing both it falls back to a static brisk (see StaticBrisk).
func TraceBuildOptions(ctx context.Context, exe, dir string) (Options, error) {
	lean := filepath.Join(filepath.Dir(exe), tracefn.BinaryName)
	if static, err := IsStatic(lean); err == nil && static {
		return leanTraceOptions(lean), nil
	}
	if src := sourceTree(); src != "" {
		out := filepath.Join(dir, tracefn.BinaryName)
		if err := goBuild(ctx, src, "./cmd/brisk-trace", out); err == nil {
			return leanTraceOptions(out), nil
		}
	}
	static, err := StaticBrisk(ctx, exe, dir)
	if err != nil {
		return Options{}, err
	}
	return TraceOptions(static), nil
}

func leanTraceOptions(bin string) Options {
	return Options{
		Path:       bin,
		Entrypoint: []string{"/" + filepath.Base(bin)},
		Env:        []string{tracefn.EnvListenHost + "=0.0.0.0"},
	}
}

// goBuild builds pkg of the brisk module at src into out, static.
func goBuild(ctx context.Context, src, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %w\n%s", pkg, src, err, b)
	}
	return nil
}

// IsStatic reports whether the ELF executable at path needs no dynamic
// loader, so it runs in an image that holds nothing else.
func IsStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// StaticBrisk returns a static brisk binary: exe itself when it is static,
// otherwise one built with CGO_ENABLED=0 into dir/brisk from the
// brisk source tree (found above the working directory or where this
// binary was compiled), which needs the go command.
func StaticBrisk(ctx context.Context, exe, dir string) (string, error) {
	static, err := IsStatic(exe)
	if err != nil {
		return "", fmt.Errorf("brisk binary %s: %w", exe, err)
	}
	if static {
		return exe, nil
	}
	src := sourceTree()
	if src == "" {
		return "", fmt.Errorf("brisk binary %s is dynamically linked and no brisk source tree was found to build a static one: "+
			"build brisk with CGO_ENABLED=0", exe)
	}
	out := filepath.Join(dir, "brisk")
	if err := goBuild(ctx, src, "./cmd/brisk", out); err != nil {
		return "", fmt.Errorf("building a static brisk (brisk binary %s is dynamically linked): %w", exe, err)
	}
	return out, nil
}

// sourceTree finds the brisk module's root: above the working directory,
// or where this file was compiled.
func sourceTree() string {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := goruntime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, d := range starts {
		for ; ; d = filepath.Dir(d) {
			if isBriskModule(filepath.Join(d, "go.mod")) {
				return d
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return ""
}

func isBriskModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "module ")) == briskModule
		}
	}
	return false
}

// Package lang runs functions deployed from source (spec.Code) in managed
// language runtimes: it keeps each code archive unpacked on the worker by
// digest, fetched from the control plane the first time a sandbox needs
// it, and turns a code function into the command any runtime that runs
// commands (process, native) starts: the language's runner (python/,
// node/: load the handler, then serve it over HTTP on $PORT) under the
// host's interpreter. docs/languages.md has the contracts.
package lang

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

//go:embed python/runner.py node/runner.js
var runners embed.FS

// Where a sandbox that can be given mounts (runtime.Mounter) finds its
// function's code (Lambda's LAMBDA_TASK_ROOT) and the runners. Both are
// read-only bind mounts; on the host they are empty mount points.
const (
	TaskDir    = "/var/task"
	RuntimeDir = "/var/runtime"
)

// Default interpreters.
const (
	DefaultPython = "/usr/bin/python3"
	DefaultNode   = "node"
)

// Config configures a Manager.
type Config struct {
	// Dir holds the runners (Dir/runtime) and the unpacked archives
	// (Dir/code/<hex digest>).
	Dir string
	// Python and Node are the interpreters (DefaultPython, DefaultNode
	// looked up in PATH when empty).
	Python, Node string
	// Fetch gets an archive the worker does not hold from the control
	// plane.
	Fetch  func(ctx context.Context, digest string) ([]byte, error)
	Logger *slog.Logger
}

// Manager prepares code functions' sandboxes. It is safe for concurrent
// use.
type Manager struct {
	cfg          Config
	python, node string // resolved interpreters, "" when absent
	log          *slog.Logger

	mu       sync.Mutex
	inflight map[string]*unpack // by digest

	images singleflight.Group
	built  sync.Map // language → its base image's reference, once imported
}

type unpack struct {
	done chan struct{}
	err  error
}

// New writes the runners into cfg.Dir and finds the interpreters. A
// missing interpreter is not an error: its language's sandboxes fail to
// start, saying so.
func New(cfg Config) (*Manager, error) {
	if cfg.Dir == "" {
		return nil, errors.New("lang: Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("lang: %w", err)
	}
	cfg.Dir = dir
	m := &Manager{cfg: cfg, log: cfg.Logger, inflight: map[string]*unpack{}}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	// 0711: a sandbox running on the host's file system (the process
	// runtime without root) can reach its own archive, whose digest it
	// is told, and cannot list the others.
	for _, d := range []string{dir, m.codeRoot()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("lang: %w", err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, fmt.Errorf("lang: %w", err)
		}
	}
	if err := m.writeRunners(); err != nil {
		return nil, fmt.Errorf("lang: runners: %w", err)
	}
	m.python = interpreter(cfg.Python, DefaultPython)
	m.node = interpreter(cfg.Node, DefaultNode)
	return m, nil
}

func interpreter(given, def string) string {
	p := given
	if p == "" {
		p = def
	}
	if abs, err := exec.LookPath(p); err == nil {
		if abs, err = filepath.Abs(abs); err == nil {
			return abs
		}
	}
	return ""
}

func (m *Manager) codeRoot() string   { return filepath.Join(m.cfg.Dir, "code") }
func (m *Manager) runtimeDir() string { return filepath.Join(m.cfg.Dir, "runtime") }

// writeRunners replaces the runners with this binary's, so that a worker
// upgrade upgrades them (running sandboxes keep the files they opened).
func (m *Manager) writeRunners() error {
	dir := m.runtimeDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	return fs.WalkDir(runners, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := runners.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.Base(p))
		tmp := dst + ".tmp"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return err
		}
		if err := os.Chmod(tmp, 0o644); err != nil {
			return err
		}
		return os.Rename(tmp, dst)
	})
}

// Interpreter is the interpreter that runs lang, "" when the host has none.
func (m *Manager) Interpreter(lang string) string {
	switch lang {
	case spec.LangPython:
		return m.python
	case spec.LangNode:
		return m.node
	}
	return ""
}

// Target is what the runtime that will start a sandbox can do.
type Target struct {
	// Mount: the runtime gives sandboxes Spec.Mounts (runtime.Mounter),
	// so the code is at TaskDir and the runners at RuntimeDir.
	Mount bool
	// Import, when set, means the runtime runs only images (containerd):
	// the sandbox runs in the language's base image, which the Manager
	// builds from this worker's interpreter and imports through Import
	// once (image.LangOptions).
	Import func(ctx context.Context, r io.Reader) ([]string, error)
}

// Prepare resolves a code function's sandbox for a runtime that runs
// commands: its archive unpacked (fetched first if this worker lacks it),
// and a spec whose command runs the language's runner on it. Other specs
// are returned as they are.
func (m *Manager) Prepare(ctx context.Context, s runtime.Spec, t Target) (runtime.Spec, error) {
	c := s.Function.Code
	if c == nil {
		return s, nil
	}
	interp := m.Interpreter(c.Language)
	if interp == "" {
		flag, def := "--python", DefaultPython
		if c.Language == spec.LangNode {
			flag, def = "--node", DefaultNode
		}
		return s, fmt.Errorf("this worker has no %s interpreter (%s): install it, or name it with brisk worker %s", c.Language, def, flag)
	}
	codeDir, err := m.ensure(ctx, c.Digest)
	if err != nil {
		return s, err
	}
	task, rt := codeDir, m.runtimeDir()
	if t.Mount {
		task, rt = TaskDir, RuntimeDir
		s.Mounts = append(s.Mounts, runtime.Mount{Source: codeDir, Target: TaskDir}, runtime.Mount{Source: m.runtimeDir(), Target: RuntimeDir})
	}
	f := *s.Function
	if t.Import != nil {
		if f.Image, err = m.baseImage(ctx, c.Language, interp, t.Import); err != nil {
			return s, err
		}
	}
	switch c.Language {
	case spec.LangPython:
		f.Command = []string{interp, "-B", "-s", filepath.Join(rt, "runner.py")}
	case spec.LangNode:
		f.Command = []string{interp, filepath.Join(rt, "runner.js")}
	default:
		return s, fmt.Errorf("code: language %q is not one of %s", c.Language, strings.Join(spec.Languages, ", "))
	}
	f.Env = maps.Clone(f.Env)
	if f.Env == nil {
		f.Env = map[string]string{}
	}
	// The runner's own settings win over the function's variables.
	maps.Copy(f.Env, runnerEnv(&f, task))
	s.Function = &f
	return s, nil
}

// runnerEnv is what the runner reads (python/runner.py, node/runner.js),
// and the variables Lambda sets that functions read.
func runnerEnv(f *spec.Function, task string) map[string]string {
	mem := strconv.FormatInt(f.Resources.MemoryMB, 10)
	return map[string]string{
		"BRISK_FUNCTION":                  f.Name,
		"BRISK_CODE_DIR":                  task,
		"BRISK_HANDLER":                   f.Code.Handler,
		"BRISK_CONTRACT":                  f.Code.Contract,
		"BRISK_TIMEOUT_MS":                strconv.FormatInt(time.Duration(f.Timeout).Milliseconds(), 10),
		"BRISK_MEMORY_MB":                 mem,
		"BRISK_CONCURRENCY":               strconv.Itoa(f.Concurrency),
		"LAMBDA_TASK_ROOT":                task,
		"_HANDLER":                        f.Code.Handler,
		"AWS_LAMBDA_FUNCTION_NAME":        f.Name,
		"AWS_LAMBDA_FUNCTION_VERSION":     "$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": mem,
	}
}

// ensure returns the directory digest is unpacked in, fetching and
// unpacking it once however many sandboxes ask at the same time.
func (m *Manager) ensure(ctx context.Context, digest string) (string, error) {
	if !spec.ValidDigest(digest) {
		return "", fmt.Errorf("code digest %q", digest)
	}
	dir := filepath.Join(m.codeRoot(), strings.TrimPrefix(digest, "sha256:"))
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	m.mu.Lock()
	u, ok := m.inflight[digest]
	if !ok {
		u = &unpack{done: make(chan struct{})}
		m.inflight[digest] = u
		go func() {
			// Detached from the first asker: the others may still want it.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			u.err = m.fetch(fctx, digest, dir)
			cancel()
			m.mu.Lock()
			delete(m.inflight, digest)
			m.mu.Unlock()
			close(u.done)
		}()
	}
	m.mu.Unlock()
	select {
	case <-u.done:
		return dir, u.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// fetch gets the archive, checks it is the one named and unpacks it next
// to dir before renaming it into place: dir exists only whole.
func (m *Manager) fetch(ctx context.Context, digest, dir string) error {
	if m.cfg.Fetch == nil {
		return fmt.Errorf("code %s is not on this worker, and it has no control plane to fetch it from", digest)
	}
	start := time.Now()
	data, err := m.cfg.Fetch(ctx, digest)
	if err != nil {
		return fmt.Errorf("fetching code %s: %w", digest, err)
	}
	if got := codezip.Digest(data); got != digest {
		return fmt.Errorf("fetching code %s: got an archive whose digest is %s", digest, got)
	}
	a, err := codezip.Open(data)
	if err != nil {
		return fmt.Errorf("code %s: %w", digest, err)
	}
	tmp, err := os.MkdirTemp(m.codeRoot(), ".unpack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	into := filepath.Join(tmp, "code")
	if err := a.Unpack(into); err != nil {
		return fmt.Errorf("unpacking code %s: %w", digest, err)
	}
	if err := os.Rename(into, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return err
		}
	}
	m.log.Info("code unpacked", "digest", digest, "files", len(a.Files), "bytes", a.Size, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// baseImage builds lang's base image from interp and imports it, once per
// Manager (a worker rebuilds it when it starts, so an upgraded
// interpreter reaches new sandboxes; the same files give the same digests,
// and containerd keeps what it has). Concurrent callers share one build.
func (m *Manager) baseImage(ctx context.Context, lang, interp string, imp func(context.Context, io.Reader) ([]string, error)) (string, error) {
	if ref, ok := m.built.Load(lang); ok {
		return ref.(string), nil
	}
	v, err, _ := m.images.Do(lang, func() (any, error) {
		// Detached from the first asker: the others may still want it.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		start := time.Now()
		ref := image.LangRef(lang)
		o, err := image.LangOptions(lang, interp)
		if err != nil {
			return "", err
		}
		// Inside its own network namespace the runner serves on the
		// sandbox's address, not on loopback.
		o.Env = append(o.Env, "BRISK_LISTEN_HOST=0.0.0.0")
		img, err := image.Build(o)
		if err != nil {
			return "", err
		}
		archive := filepath.Join(m.cfg.Dir, "lang-"+lang+".tar")
		defer os.Remove(archive)
		if err := image.WriteArchive(archive, img, ref); err != nil {
			return "", err
		}
		f, err := os.Open(archive)
		if err != nil {
			return "", err
		}
		defer f.Close()
		if _, err := imp(bctx, f); err != nil {
			return "", fmt.Errorf("%s base image: %w", lang, err)
		}
		m.built.Store(lang, ref)
		m.log.Info("language base image built", "lang", lang, "ref", ref, "interpreter", interp, "files", len(o.Files), "took", time.Since(start).Round(time.Millisecond))
		return ref, nil
	})
	if err != nil {
		return "", fmt.Errorf("the %s base image (from %s): %w", lang, interp, err)
	}
	return v.(string), nil
}

// Package runtime defines the sandbox runtime interface every worker backend
// (process, emulated, containerd) implements, and the readiness probe they share.
package runtime

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/brisk-faas/brisk/internal/image/ref"
	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// ErrNotFound is returned by Kill for an id the runtime does not know; callers
// treat it as "already gone".
var ErrNotFound = errors.New("sandbox not found")

// Errors wrapped by Instance.ExitErr, the same for every runtime.
var (
	// ErrOOMKilled means the kernel OOM killer killed a process of the
	// sandbox because it reached its memory limit.
	ErrOOMKilled = errors.New("OOM-killed")
	// ErrKilled means the sandbox ended because Kill stopped it.
	ErrKilled = errors.New("stopped by Kill")
)

// Spec is everything a runtime needs to start one sandbox.
type Spec struct {
	ID       string         // sandbox id, unique for the life of the cluster
	Function *spec.Function // resolved function spec at one revision
	// Mounts are host directories the sandbox sees read-only at another
	// path (a code function's source at /var/task): only runtimes that
	// implement Mounter with CanMount true are given any.
	Mounts []Mount
}

// Mount is a read-only bind mount of a host directory into a sandbox.
type Mount struct {
	Source string // absolute host path
	Target string // absolute path in the sandbox
}

// Prewarmer is implemented by runtimes that start some sandboxes from
// templates (the process and native runtimes, for Python and Node
// source: package forkserver): Prewarm makes s's
// template before its first sandbox is asked for, in the background.
type Prewarmer interface {
	Prewarm(s Spec)
}

// TemplateHolder is implemented by runtimes that keep templates: they
// hold memory no sandbox's request covers, which the node reports (its
// heartbeat's templates) so that placement leaves it out.
type TemplateHolder interface {
	// TemplateMemoryMB is what the runtime's templates hold now, in MiB
	// rounded up, measured (their cgroups, or their processes' RSS).
	TemplateMemoryMB() int64
	// HeldTemplates lists the functions whose template is loaded: a
	// sandbox of one starts from it (placement prefers the node).
	HeldTemplates() []HeldTemplate
}

// HeldTemplate names a function revision whose template a node holds.
type HeldTemplate struct {
	Function string
	Revision uint64
}

// Mounter is implemented by runtimes that can give a sandbox Spec.Mounts.
type Mounter interface {
	// CanMount says whether they can now (the process runtime only as
	// root).
	CanMount() bool
}

// Instance is a started sandbox.
type Instance struct {
	ID   string
	Addr string // host:port serving the function's HTTP
	// Exited is closed when the sandbox ends on its own (crash, OOM, exit);
	// ExitErr then says why. Nil when the runtime cannot observe exits.
	Exited  <-chan struct{}
	ExitErr func() error
	// Ready says Create returned only once the sandbox serves, so the
	// caller need not probe it (the emulated runtime: its sandboxes share
	// one listener that is always up, and a probe would measure nothing).
	Ready bool
}

// Listed is one sandbox a runtime found, possibly started by an earlier
// worker process.
type Listed struct {
	ID       string
	Function string
	Revision uint64
	Addr     string
	Running  bool
}

// Watcher is implemented by runtimes that can watch a sandbox they listed
// for its end, including one an earlier worker process started, so that a
// worker watches the sandboxes it adopts like those it started.
type Watcher interface {
	// Watch returns a channel closed when the sandbox ends and what says
	// why then, as Instance's Exited and ExitErr. ok is false when the
	// runtime does not know the id or cannot watch it.
	Watch(id string) (exited <-chan struct{}, exitErr func() error, ok bool)
}

// Runtime starts and stops sandboxes. Implementations are safe for
// concurrent use; every method honours ctx.
type Runtime interface {
	// Name is the runtime's flag value ("process", "emulated", ...).
	Name() string
	// Create starts a sandbox and returns once it is started; readiness is
	// probed by the caller. A failed Create leaves nothing behind.
	Create(ctx context.Context, s Spec) (*Instance, error)
	// Kill stops a sandbox and releases everything it held. It is idempotent:
	// an unknown id returns ErrNotFound.
	Kill(ctx context.Context, id string) error
	// List returns the sandboxes this runtime manages, including those left
	// running by an earlier worker process when the runtime can find them.
	List(ctx context.Context) ([]Listed, error)
}

// EgressEnforcer is implemented by runtimes whose sandboxes have a network
// of their own (native, containerd): they hold each sandbox to its
// namespace's egress policy (spec.EgressPolicy).
type EgressEnforcer interface {
	// SetEgress makes policies (by namespace, the complete set) the
	// runtime's, for running sandboxes and those to come.
	SetEgress(policies map[string]spec.EgressPolicy) error
}

// FunctionImage is the image that a runtime running only images (containerd,
// kube; named runtime in the errors) starts for s, whose id and function
// the caller has checked: the spec's, or the trace function's image for the
// builtin.
func FunctionImage(s Spec, runtime string) (string, error) {
	f := s.Function
	switch {
	case f.Image != "":
		return f.Image, nil
	case f.Builtin == ref.TraceName:
		return ref.Trace, nil
	case f.Builtin != "":
		return "", fmt.Errorf("sandbox %s: builtin %q: %w", s.ID, f.Builtin, errors.ErrUnsupported)
	case len(f.Command) > 0:
		return "", fmt.Errorf("sandbox %s: the %s runtime runs images, not commands (function %s): %w", s.ID, runtime, f.Name, errors.ErrUnsupported)
	}
	return "", fmt.Errorf("sandbox %s: function %s has no image", s.ID, f.Name)
}

// ValidName accepts sandbox ids and function names that are safe as one
// path element and one cgroup directory name: 1-128 letters, digits, '.',
// '_' or '-', not starting with '.'.
func ValidName(s string) bool {
	if s == "" || len(s) > 128 || s[0] == '.' {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// FunctionEnv appends to base the function's variables (sorted by name),
// then the sandbox's own: PORT, and the sandbox id and function name the
// builtin trace function reports, and for a function with secrets
// EnvSecretsDir, secretsDir (spec.SecretsDir when empty). Later entries
// win, so a function may set PATH and HOME but not PORT.
func FunctionEnv(base []string, s Spec, port int, secretsDir string) []string {
	env := base
	for _, k := range slices.Sorted(maps.Keys(s.Function.Env)) {
		env = append(env, k+"="+s.Function.Env[k])
	}
	if s.Function.Builtin != "" {
		env = append(env, tracefn.EnvBuiltin+"="+s.Function.Builtin)
	}
	if len(s.Function.Secrets) > 0 {
		env = append(env, EnvSecretsDir+"="+cmp.Or(secretsDir, spec.SecretsDir))
	}
	return append(env,
		tracefn.EnvPort+"="+strconv.Itoa(port),
		tracefn.EnvSandboxID+"="+s.ID,
		tracefn.EnvFunction+"="+s.Function.Name,
	)
}

// ExpandArgs expands, in a function's command, the sandbox's environment
// variables written $NAME, ${NAME} or $(NAME) (Kubernetes' form), so that
// `--command 'server --port $PORT'` works without a shell. A name the
// environment lacks is left as written, and so is $$ (a shell's pid, in
// an `sh -c` script).
func ExpandArgs(argv, env []string) []string {
	lookup := func(name string) (string, bool) {
		for i := len(env) - 1; i >= 0; i-- { // the last one wins, as in exec
			if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
				return v, true
			}
		}
		return "", false
	}
	out := make([]string, len(argv))
	for i, a := range argv {
		if !strings.Contains(a, "$") {
			out[i] = a
			continue
		}
		var b strings.Builder
		for j := 0; j < len(a); {
			if a[j] != '$' || j+1 == len(a) {
				b.WriteByte(a[j])
				j++
				continue
			}
			if a[j+1] == '$' {
				b.WriteString("$$")
				j += 2
				continue
			}
			open, close := byte(0), byte(0)
			k := j + 1
			switch a[k] {
			case '{':
				open, close = '{', '}'
			case '(':
				open, close = '(', ')'
			}
			if open != 0 {
				k++
			}
			start := k
			for k < len(a) && (a[k] == '_' || a[k] >= 'A' && a[k] <= 'Z' || a[k] >= 'a' && a[k] <= 'z' || k > start && a[k] >= '0' && a[k] <= '9') {
				k++
			}
			name := a[start:k]
			end := k
			if open != 0 {
				if k >= len(a) || a[k] != close {
					name = "" // unterminated: not a reference
				} else {
					end = k + 1
				}
			}
			if v, ok := lookup(name); ok && name != "" {
				b.WriteString(v)
				j = end
				continue
			}
			b.WriteByte('$')
			j++
		}
		out[i] = b.String()
	}
	return out
}

// CeilMB is bytes in MiB, rounded up.
func CeilMB(bytes int64) int64 { return (bytes + 1<<20 - 1) >> 20 }

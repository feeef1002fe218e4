package process

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// What a sandbox's processes are (see docs/security.md, "What the process
// runtime isolates"):
//
//   - Who: Config.User; as root by default a user of the function's own
//     (users.go). Supplementary
//     groups are cleared and no_new_privs is set, so neither setuid binaries
//     nor file capabilities can give a sandbox back what it was denied.
//   - What they see: a clean environment (sandboxEnv), the working
//     directory /, the log file as stdout and stderr (opened by the worker,
//     so the sandbox needs no access to the state directory).
//   - Where: cloned into their cgroup on v2 (CLONE_INTO_CGROUP); on v1
//     forked from a worker thread that has joined the sandbox's cgroup in
//     every hierarchy first (procs.SpawnThread), so on both the process is inside
//     its cgroup before it runs a single instruction of the function.
//   - Secrets: as root, on a read-only tmpfs at spec.SecretsDir in a mount
//     namespace of the sandbox's own (secrets.go).

// DefaultUser is who sandboxes run as when the worker runs as root and
// Config.User is empty, for what runs before a function is known; each
// function's sandboxes run as a user of its own (users.go). Neither owns
// files, so a function can read only what is world-readable and write
// only what is world-writable.
const DefaultUser = "nobody"

// nobodyID is nobody's uid and gid on every mainstream distribution, used
// when /etc/passwd has no nobody.
const nobodyID = 65534

// DefaultPath is the PATH of a sandbox whose spec sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// sandboxHome is HOME (and the working directory) of a sandbox whose spec
// sets no HOME: a sandbox has no private directory, and / is readable by
// every user.
const sandboxHome = "/"

// identity is who sandboxes run as.
type identity struct {
	uid, gid uint32
	// cred switches to uid:gid in the child; nil when the worker is not
	// root and so runs sandboxes as itself.
	cred *syscall.Credential
}

func (id identity) String() string { return fmt.Sprintf("uid %d gid %d", id.uid, id.gid) }

// resolveUser turns Config.User into an identity. A name is looked up in
// the user database (its primary group is the gid); a number is a uid, its
// gid the user's primary group when there is one and the same number
// otherwise; "u:g" gives both (each a name or a number).
func resolveUser(spec string, euid int) (identity, error) {
	self := identity{uid: uint32(os.Getuid()), gid: uint32(os.Getgid())}
	if spec == "" {
		if euid != 0 {
			return self, nil
		}
		id := identity{uid: nobodyID, gid: nobodyID}
		if u, err := user.Lookup(DefaultUser); err == nil {
			if id, err = fromUser(u); err != nil {
				return identity{}, err
			}
		}
		id.cred = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: []uint32{}}
		return id, nil
	}
	uname, gname, hasGroup := strings.Cut(spec, ":")
	var id identity
	switch n, err := strconv.ParseUint(uname, 10, 32); {
	case uname == "":
		return identity{}, fmt.Errorf("user %q: no user", spec)
	case err == nil:
		id.uid, id.gid = uint32(n), uint32(n)
		if u, err := user.LookupId(uname); err == nil && !hasGroup {
			if id, err = fromUser(u); err != nil {
				return identity{}, err
			}
		}
	default:
		u, err := user.Lookup(uname)
		if err != nil {
			return identity{}, fmt.Errorf("user %q: %w", spec, err)
		}
		if id, err = fromUser(u); err != nil {
			return identity{}, err
		}
	}
	if hasGroup {
		if n, err := strconv.ParseUint(gname, 10, 32); err == nil {
			id.gid = uint32(n)
		} else if g, err := user.LookupGroup(gname); err != nil {
			return identity{}, fmt.Errorf("user %q: %w", spec, err)
		} else if n, err := strconv.ParseUint(g.Gid, 10, 32); err != nil {
			return identity{}, fmt.Errorf("user %q: gid %q: %w", spec, g.Gid, err)
		} else {
			id.gid = uint32(n)
		}
	}
	if euid != 0 {
		if id.uid != self.uid || id.gid != self.gid {
			return identity{}, fmt.Errorf("user %q: only root can run sandboxes as another user than its own (%s)", spec, self)
		}
		return self, nil
	}
	id.cred = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: []uint32{}}
	return id, nil
}

func fromUser(u *user.User) (identity, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return identity{}, fmt.Errorf("user %s: uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return identity{}, fmt.Errorf("user %s: gid %q: %w", u.Username, u.Gid, err)
	}
	return identity{uid: uint32(uid), gid: uint32(gid)}, nil
}

// sandboxEnv is all a sandbox's processes get: a fixed PATH and HOME, then
// the function's variables, then the sandbox's own (PORT, and the sandbox
// id and function name the builtin trace function reports, and with
// secrets BRISK_SECRETS_DIR: secretsDir, or spec.SecretsDir when empty),
// later entries winning: a function may set PATH and HOME but not PORT.
// BRISK_LISTEN_HOST is the runtime's listen host, which the builtins and
// the language runners bind. Nothing of the worker's environment gets in.
func (r *Runtime) sandboxEnv(s runtime.Spec, port int, secretsDir string) []string {
	env := runtime.FunctionEnv([]string{"PATH=" + DefaultPath, "HOME=" + sandboxHome}, s, port, secretsDir)
	return append(env, tracefn.EnvListenHost+"="+r.cfg.ListenHost)
}

// resolveCommand makes argv[0] a path the child can exec from /, its
// working directory: a bare name is looked up in the sandbox's PATH (not
// the worker's), a relative path is taken relative to the worker's
// working directory, as before sandboxes ran in /.
func resolveCommand(argv []string, env []string) ([]string, error) {
	name := argv[0]
	switch {
	case filepath.IsAbs(name):
		return argv, nil
	case strings.Contains(name, "/"):
		abs, err := filepath.Abs(name)
		if err != nil {
			return nil, err
		}
		return append([]string{abs}, argv[1:]...), nil
	}
	path := DefaultPath
	for _, kv := range env { // the last PATH wins, as in exec
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue // "" or "." would mean the worker's working directory
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return append([]string{p}, argv[1:]...), nil
		}
	}
	return nil, fmt.Errorf("%q: %w in the sandbox's PATH %q", name, exec.ErrNotFound, path)
}

// explainStart adds to a failed exec who it ran as, when that may be why.
func explainStart(id identity, argv0 string, err error) error {
	if id.cred != nil && (errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EACCES)) {
		return fmt.Errorf("%w (the sandbox runs as %s: %s and every directory above it must be readable and searchable by that user)", err, id, argv0)
	}
	return err
}

// identityOf is who f's sandboxes run as: the function's own user as root
// without Config.User (users.go), else the runtime's.
func (r *Runtime) identityOf(f *spec.Function) (identity, error) {
	if r.users == nil {
		return r.id, nil
	}
	return r.users.identityOf(f)
}

package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Secrets: every runtime that runs real processes (process, native,
// containerd) shows a sandbox of a function with secrets the directory
// spec.SecretsDir, mounted read-only, holding one regular file per name of
// Function.Secrets (mode 0444) with exactly the bytes of
// Function.SecretData[name]; only that sandbox sees it. Where each runtime
// keeps the values, and how it cleans up, is in its own package. A function
// without secrets costs nothing: every step below is behind a
// len(Secrets) check. The emulated runtime runs no process and so has no
// file system to put them in.

// EnvSecretsDir names the directory a sandbox finds its secrets in. It is
// set only for functions with secrets: spec.SecretsDir, except for the
// process runtime without root, which cannot mount and points it elsewhere.
const EnvSecretsDir = "BRISK_SECRETS_DIR"

// CheckSecrets checks what a runtime is about to write: at most
// spec.MaxSecretsPerFunction names, each a valid file name given once, each
// with a value (a name the control plane sent without one is an error, not
// an empty file) of at most spec.MaxSecretSize bytes. The spec was validated
// by the control plane; this keeps a path out of the file names whatever
// sent the spec. Errors name the secret, never its value.
func CheckSecrets(f *spec.Function) error {
	if len(f.Secrets) == 0 {
		return nil
	}
	if len(f.Secrets) > spec.MaxSecretsPerFunction {
		return fmt.Errorf("function %s: %d secrets, at most %d", f.Name, len(f.Secrets), spec.MaxSecretsPerFunction)
	}
	seen := make(map[string]bool, len(f.Secrets))
	for _, name := range f.Secrets {
		switch v, ok := f.SecretData[name]; {
		case !spec.ValidSecretName(name):
			return fmt.Errorf("function %s: secret %q: %s", f.Name, name, spec.SecretNameRule)
		case seen[name]:
			return fmt.Errorf("function %s: secret %q is listed twice", f.Name, name)
		case !ok:
			return fmt.Errorf("function %s: secret %q: no value reached this worker", f.Name, name)
		case len(v) > spec.MaxSecretSize:
			return fmt.Errorf("function %s: secret %q: %d bytes, at most %d", f.Name, name, len(v), spec.MaxSecretSize)
		}
		seen[name] = true
	}
	return nil
}

// WriteSecrets writes f's secrets (checked by CheckSecrets) into dir, an
// empty directory: one file per name, mode 0444 whatever the umask, none
// replacing or following anything already there.
func WriteSecrets(dir string, f *spec.Function) error {
	for _, name := range f.Secrets {
		if err := writeSecret(filepath.Join(dir, name), f.SecretData[name]); err != nil {
			return fmt.Errorf("secret %q: %w", name, err)
		}
	}
	return nil
}

func writeSecret(path string, value []byte) error {
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o444)
	if err != nil {
		return err
	}
	_, err = file.Write(value)
	if err == nil {
		err = file.Chmod(0o444) // the umask may have cut the mode
	}
	return errors.Join(err, file.Close())
}

// SecretsTmpfsData is the mount data of a tmpfs that holds f's secrets and
// nothing more: root directory 0755, room for the values (each file takes
// whole pages) and an inode per file, with some slack.
func SecretsTmpfsData(f *spec.Function) string {
	page := int64(os.Getpagesize())
	size := 16 * page
	for _, name := range f.Secrets {
		size += (int64(len(f.SecretData[name])) + page - 1) / page * page
	}
	return fmt.Sprintf("mode=0755,size=%d,nr_inodes=%d", size, len(f.Secrets)+16)
}

// SecretsDirIn is sandbox id's secrets directory under a runtime's state
// directory, for runtimes that cannot mount the values where the sandbox
// sees them (containerd binds this directory; the process runtime without
// root points BRISK_SECRETS_DIR at it).
func SecretsDirIn(stateDir, id string) string { return filepath.Join(stateDir, SecretsSubdir, id) }

// SecretsSubdir is the state directory's subdirectory of SecretsDirIn.
const SecretsSubdir = "secrets"

// WriteSecretsDir writes f's secrets (checked by CheckSecrets) into sandbox
// id's directory under stateDir and returns it: files 0444, the directory
// 0555 (readable by the sandbox's user, whoever it is), its parent 0700 (no
// other user of the host reaches them). A directory left by a Create the
// worker's death cut short is replaced; on failure nothing is left.
func WriteSecretsDir(stateDir, id string, f *spec.Function) (string, error) {
	dir := SecretsDirIn(stateDir, id)
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(parent, 0o700); err != nil {
		return "", err
	}
	if err := RemoveSecretsDir(dir); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	err := WriteSecrets(dir, f)
	if err == nil {
		err = os.Chmod(dir, 0o555)
	}
	if err != nil {
		return "", errors.Join(err, RemoveSecretsDir(dir))
	}
	return dir, nil
}

// RemoveSecretsDir removes a directory WriteSecretsDir made; a missing one
// is fine.
func RemoveSecretsDir(dir string) error {
	if err := os.Chmod(dir, 0o700); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove secrets: %w", err)
	}
	return nil
}

// ReapSecretsDirs removes the secrets directories under stateDir of the
// sandboxes held does not claim: those whose Create or removal a worker's
// exit cut short.
func ReapSecretsDirs(stateDir string, held func(id string) bool) error {
	root := filepath.Join(stateDir, SecretsSubdir)
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !held(e.Name()) {
			errs = append(errs, RemoveSecretsDir(filepath.Join(root, e.Name())))
		}
	}
	return errors.Join(errs...)
}

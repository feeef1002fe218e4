package runtime

import (
	"errors"
	"fmt"
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

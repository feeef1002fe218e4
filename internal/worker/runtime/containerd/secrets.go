package containerd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/brisk-faas/brisk/internal/worker/runtime"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Secrets. runc can only bind-mount into a container what exists on the
// host, so a sandbox's secrets are files in a directory of its own,
// <StateDir>/secrets/<sandbox-id>/ (files 0444, the directory 0555, its
// parent 0700 and root's: no other user of the host reaches them, and no
// other sandbox has them mounted), bound read-only, nosuid, nodev and
// noexec on spec.SecretsDir. The directory goes when the sandbox does:
// teardown (Kill, a failed Create, a sandbox an earlier worker left and
// this one does not adopt) removes it once the container is deleted, and
// New removes every directory no adopted sandbox claims (a worker that
// died in between). The values sit on the state directory's file system
// for the sandbox's life; a state directory on tmpfs keeps them off disk.

const secretsDirName = "secrets"

func (r *Runtime) secretsDir(id string) string {
	return filepath.Join(r.cfg.StateDir, secretsDirName, id)
}

// writeSecrets writes f's secrets (runtime.CheckSecrets has passed) into
// sandbox id's directory.
func (r *Runtime) writeSecrets(id string, f *spec.Function) error {
	dir := r.secretsDir(id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := removeSecrets(dir); err != nil { // a leftover of a crashed Create
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := runtime.WriteSecrets(dir, f); err != nil {
		return err
	}
	// Readable and searchable by the container's user, whoever it is.
	return os.Chmod(dir, 0o555)
}

func secretsMount(dir string) specs.Mount {
	return specs.Mount{Destination: spec.SecretsDir, Type: "bind", Source: dir,
		Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
}

// removeSecrets removes a directory writeSecrets made; a missing one is
// fine.
func removeSecrets(dir string) error {
	if err := os.Chmod(dir, 0o700); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove secrets: %w", err)
	}
	return nil
}

// reapSecrets removes the secrets directories of sandboxes this Runtime
// does not hold.
func (r *Runtime) reapSecrets() error {
	root := filepath.Join(r.cfg.StateDir, secretsDirName)
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		r.mu.Lock()
		_, held := r.sandboxes[e.Name()]
		r.mu.Unlock()
		if !held {
			errs = append(errs, removeSecrets(filepath.Join(root, e.Name())))
		}
	}
	return errors.Join(errs...)
}

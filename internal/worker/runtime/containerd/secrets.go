package containerd

import (
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

const secretsDirName = runtime.SecretsSubdir

func (r *Runtime) secretsDir(id string) string { return runtime.SecretsDirIn(r.cfg.StateDir, id) }

func secretsMount(dir string) specs.Mount {
	return specs.Mount{Destination: spec.SecretsDir, Type: "bind", Source: dir,
		Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}
}

// reapSecrets removes the secrets directories of sandboxes this Runtime
// does not hold.
func (r *Runtime) reapSecrets() error {
	return runtime.ReapSecretsDirs(r.cfg.StateDir, func(id string) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		_, held := r.sandboxes[id]
		return held
	})
}

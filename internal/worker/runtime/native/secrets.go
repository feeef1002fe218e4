package native

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// secretsFile writes f's secrets (runtime.CheckSecrets has passed) one
// after another into a sealed memfd, which the bind message carries as a
// descriptor (see nsinit.Bind.Secrets): the values never touch a disk,
// and the message stays small whatever their size. The caller closes the
// file once the shell is bound; the memory goes with the last descriptor.
func secretsFile(f *spec.Function) ([]nsinit.Secret, *os.File, error) {
	fd, err := unix.MemfdCreate("brisk-secrets", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, os.NewSyscallError("memfd_create", err)
	}
	file := os.NewFile(uintptr(fd), "secrets")
	list := make([]nsinit.Secret, len(f.Secrets))
	for i, name := range f.Secrets {
		v := f.SecretData[name]
		list[i] = nsinit.Secret{Name: name, Size: int64(len(v))}
		if _, err := file.Write(v); err != nil {
			file.Close()
			return nil, nil, err
		}
	}
	// Nothing can change the values from here on.
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(file.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		file.Close()
		return nil, nil, os.NewSyscallError("fcntl(F_ADD_SEALS)", err)
	}
	return list, file, nil
}

package install

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/brisk-faas/brisk/internal/image"
	"github.com/brisk-faas/brisk/internal/worker/runtime/native/nsinit"
)

// Where the image keeps brisk. The sandbox init sits beside it, where the
// native runtime looks for it (nsinit.BinaryName next to the executable).
const (
	ImageBinDir = "/usr/local/bin"
	ImageBrisk  = ImageBinDir + "/brisk"
	ImageInit   = ImageBinDir + "/" + nsinit.BinaryName
	// ImageUser is the image's default user; the manifests run every
	// component but the containerd worker as it.
	ImageUser = "65532:65532"
)

// BuildImage builds brisk's own image from a static brisk binary and the
// static sandbox init (scripts/build-sandbox-init.sh): both in
// /usr/local/bin, an empty /tmp, entrypoint brisk, user 65532. Like every
// image brisk builds, it is one uncompressed layer with fixed owners and
// times (image.Build), so the same binaries give the same digest. The
// manifests give each component its subcommand as args.
func BuildImage(brisk, init string) (v1.Image, error) {
	for _, p := range []struct{ what, path string }{{"brisk", brisk}, {"sandbox init", init}} {
		static, err := image.IsStatic(p.path)
		if err != nil {
			return nil, fmt.Errorf("%s binary %s: %w", p.what, p.path, err)
		}
		if !static {
			return nil, fmt.Errorf("%s binary %s is dynamically linked: the image holds nothing else (build brisk with CGO_ENABLED=0)", p.what, p.path)
		}
	}
	dir, err := os.MkdirTemp("", "brisk-k8s-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "root")
	bin := filepath.Join(root, filepath.FromSlash(ImageBinDir))
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, err
	}
	tmp := filepath.Join(root, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o1777|os.ModeSticky); err != nil {
		return nil, err
	}
	if err := copyFile(brisk, filepath.Join(root, filepath.FromSlash(ImageBrisk))); err != nil {
		return nil, err
	}
	if err := copyFile(init, filepath.Join(root, filepath.FromSlash(ImageInit))); err != nil {
		return nil, err
	}
	img, err := image.Build(image.Options{Path: root, Entrypoint: []string{ImageBrisk}, Env: []string{"HOME=/tmp"}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Config.User = ImageUser
	return mutate.ConfigFile(img, cf)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

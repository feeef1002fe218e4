package image

import (
	"context"
	"fmt"
	"io"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"
)

// Containerd defaults shared by the CLI and the containerd runtime.
const (
	DefaultContainerdAddress = "/run/containerd/containerd.sock"
	DefaultNamespace         = "brisk"
	DefaultSnapshotter       = "overlayfs"
)

// Import reads an OCI archive from r into containerd's namespace ns and
// unpacks every image it names into snapshotter, so the first sandbox
// created from it does not pay for the unpack. It returns the imported
// references. Importing the same archive again is cheap: content and
// snapshots that exist are kept.
func Import(ctx context.Context, c *containerd.Client, ns, snapshotter string, r io.Reader) ([]string, error) {
	ctx = namespaces.WithNamespace(ctx, ns)
	imgs, err := c.Import(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("import into containerd namespace %s: %w", ns, err)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import into containerd namespace %s: the archive names no image (no %s annotation in index.json)", ns, AnnotationRefName)
	}
	refs := make([]string, 0, len(imgs))
	for _, i := range imgs {
		img := containerd.NewImage(c, i)
		if err := img.Unpack(ctx, snapshotter); err != nil {
			return refs, fmt.Errorf("image %s: unpack into %s: %w", i.Name, snapshotter, err)
		}
		refs = append(refs, i.Name)
	}
	return refs, nil
}

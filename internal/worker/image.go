package worker

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// ImageImporter is implemented by runtimes that run images (containerd):
// ImportImage reads an OCI archive from r into the runtime's image store
// and returns the references it named.
type ImageImporter interface {
	ImportImage(ctx context.Context, r io.Reader) ([]string, error)
}

// maxImageBytes bounds one pushed archive.
const maxImageBytes = 8 << 30

// ImportImage serves `brisk image push --to-workers`: it streams the archive
// into the first hosted node whose runtime imports images (all nodes of a
// daemon share one runtime kind).
func (d *Daemon) ImportImage(stream briskv1.Worker_ImportImageServer) error {
	var (
		imp  ImageImporter
		node string
	)
	for id, n := range d.nodes {
		if i, ok := n.rt.(ImageImporter); ok {
			imp, node = i, id
			break
		}
	}
	if imp == nil {
		return status.Errorf(codes.FailedPrecondition, "worker runtime %q does not run images", d.first.rt.Name())
	}
	pr, pw := io.Pipe()
	go func() {
		var total int64
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				pw.Close()
				return
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			if total += int64(len(m.GetData())); total > maxImageBytes {
				pw.CloseWithError(fmt.Errorf("image archive larger than %d bytes", int64(maxImageBytes)))
				return
			}
			if _, err := pw.Write(m.GetData()); err != nil {
				return // the importer stopped reading
			}
		}
	}()
	refs, err := imp.ImportImage(stream.Context(), pr)
	pr.CloseWithError(errors.New("import ended")) // unblocks the receiver if the import stopped early
	if err != nil {
		d.log.Warn("image import failed", "node", node, "err", err)
		return status.Errorf(codes.Internal, "node %s: %v", node, err)
	}
	d.log.Info("imported images", "node", node, "refs", refs)
	return stream.SendAndClose(&briskv1.ImportImageReply{Refs: refs, NodeId: node})
}

package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

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
// into the first hosted node's runtimes that import images (all nodes of a
// daemon share their runtimes' kinds): the regular runtime and, when it is
// another, the emergency track's, both at once from the one stream.
func (d *Daemon) ImportImage(stream briskv1.Worker_ImportImageServer) error {
	var (
		imps []ImageImporter
		node string
	)
	for id, n := range d.nodes {
		for _, rt := range n.runtimes() {
			if i, ok := rt.(ImageImporter); ok {
				imps, node = append(imps, i), id
			}
		}
		if len(imps) > 0 {
			break
		}
	}
	if len(imps) == 0 {
		return status.Errorf(codes.FailedPrecondition, "worker runtime %q does not run images", d.first.rt.Name())
	}
	prs := make([]*io.PipeReader, len(imps))
	pws := make([]*io.PipeWriter, len(imps))
	for i := range imps {
		prs[i], pws[i] = io.Pipe()
	}
	closeAll := func(err error) {
		for _, pw := range pws {
			if pw != nil {
				pw.CloseWithError(err)
			}
		}
	}
	go func() {
		var total int64
		reading := len(pws) // importers still reading
		for reading > 0 {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				closeAll(nil)
				return
			}
			if err != nil {
				closeAll(err)
				return
			}
			if total += int64(len(m.GetData())); total > maxImageBytes {
				closeAll(fmt.Errorf("image archive larger than %d bytes", int64(maxImageBytes)))
				return
			}
			// An importer that has stopped reading (done, or failed) is
			// skipped; the others get the rest.
			reading = 0
			for i, pw := range pws {
				if pw == nil {
					continue
				}
				if _, err := pw.Write(m.GetData()); err != nil {
					pws[i] = nil
					continue
				}
				reading++
			}
		}
	}()
	refs := make([][]string, len(imps))
	errs := make([]error, len(imps))
	var wg sync.WaitGroup
	for i, imp := range imps {
		wg.Go(func() {
			refs[i], errs[i] = imp.ImportImage(stream.Context(), prs[i])
			// Unblocks the receiver if this import stopped early.
			prs[i].CloseWithError(errors.New("import ended"))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		d.log.Warn("image import failed", "node", node, "err", err)
		return status.Errorf(codes.Internal, "node %s: %v", node, err)
	}
	d.log.Info("imported images", "node", node, "refs", refs[0])
	return stream.SendAndClose(&briskv1.ImportImageReply{Refs: refs[0], NodeId: node})
}

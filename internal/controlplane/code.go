package controlplane

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// codeChunk is FetchCode's message size: well under gRPC's limits.
const codeChunk = 1 << 20

// FetchCode streams a code archive to a worker that is to start a sandbox
// of a function deployed from it: the link serves it, over the registry the
// admin surface stores code in.
func (cp *ControlPlane) FetchCode(r *briskv1.FetchCodeRequest, stream briskv1.ControlPlane_FetchCodeServer) error {
	if cp.cfg.CA != nil {
		c := callerCert(stream.Context())
		if c == nil {
			return status.Error(codes.Unauthenticated, "a certificate of the cluster CA is required")
		}
		if kind, _ := pki.IDs(c); kind != pki.KindWorker {
			return status.Errorf(codes.PermissionDenied, "only workers fetch code (this certificate is a %s's)", kind)
		}
	}
	if !spec.ValidDigest(r.GetDigest()) {
		return status.Errorf(codes.InvalidArgument, "digest %q: want sha256:<64 hex digits>", r.GetDigest())
	}
	data, err := cp.store.Code(r.GetDigest())
	if errors.Is(err, store.ErrNotFound) {
		return status.Errorf(codes.NotFound, "code %s is not in the registry", r.GetDigest())
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "reading code: %v", err)
	}
	for len(data) > 0 {
		n := min(len(data), codeChunk)
		if err := stream.Send(&briskv1.CodeChunk{Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

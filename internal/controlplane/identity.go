package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/pki"
)

// Component identity (docs/security.md): with Config.CA set, the gRPC
// listener serves TLS with a certificate of the cluster CA; every call but
// Join needs a client certificate of the CA, and a caller may act only as
// the ids its certificate names. A node id is bound, at its first
// registration, to the key of the certificate that registered it: a
// certificate with another key cannot register it again (nor get a
// certificate for it through Join).

// JoinTokenFile is where the first start writes a join token (mode 0600).
const JoinTokenFile = pki.JoinTokenFile

// ServerIdentity issues the certificate of a control plane's gRPC server:
// identity brisk://controlplane/ID, SANs 127.0.0.1, ::1, localhost, the
// host of grpcAddr and extra (host names or IP addresses).
func ServerIdentity(ca *pki.CA, id, grpcAddr string, extra []string) (*pki.Identity, error) {
	dns, ips := pki.HostSANs(grpcAddr, extra)
	return ca.Issue(pki.KindControlPlane, []string{id}, dns, ips)
}

// grpcTLS is the control plane's gRPC server TLS (nil without a CA).
func (cp *ControlPlane) grpcTLS() (*tls.Config, error) {
	if cp.cfg.CA == nil {
		return nil, nil
	}
	id, err := ServerIdentity(cp.cfg.CA, cp.id, cp.cfg.GRPCAddr, cp.cfg.TLSSANs)
	if err != nil {
		return nil, fmt.Errorf("controlplane: server certificate: %w", err)
	}
	cp.ident = id
	return id.ServerTLS(false), nil
}

// IdentityInterceptors refuse every call but Join from a caller without a
// certificate of the cluster CA (the TLS handshake has verified any
// certificate presented). Nil without a CA.
func IdentityInterceptors(ca *pki.CA) []grpc.ServerOption {
	if ca == nil {
		return nil
	}
	check := func(ctx context.Context, method string) error {
		if method == briskv1.ControlPlane_Join_FullMethodName {
			return nil
		}
		if callerCert(ctx) == nil {
			return status.Error(codes.Unauthenticated, "a certificate of the cluster CA is required: join the cluster first (--join-token)")
		}
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

// callerCert is the verified client certificate of a call, or nil.
func callerCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	return pki.PeerCert(ti.State)
}

// caller checks that the call's certificate names id of kind; it returns
// the certificate's key id ("" without a CA: no checks).
func (cp *ControlPlane) caller(ctx context.Context, kind, id string) (string, error) {
	if cp.cfg.CA == nil {
		return "", nil
	}
	c := callerCert(ctx)
	if c == nil {
		return "", status.Error(codes.Unauthenticated, "a certificate of the cluster CA is required")
	}
	if !pki.Names(c, kind, id) {
		k, ids := pki.IDs(c)
		return "", status.Errorf(codes.PermissionDenied, "this certificate is for %s %v: it cannot act as %s %q", k, ids, kind, id)
	}
	return pki.KeyID(c.PublicKey), nil
}

// errClaimed is the refusal of an id bound to another key.
func errClaimed(kind, id string) error {
	return status.Errorf(codes.PermissionDenied, "%s %q is bound to the key of the certificate that first registered it: a node keeps its key in its state dir, and one that lost it must join under a new id", kind, id)
}

// Join trades a join token (or a current certificate for the same ids and
// key) and a certificate request for a certificate naming the ids.
func (cp *ControlPlane) Join(ctx context.Context, r *briskv1.JoinRequest) (*briskv1.JoinResponse, error) {
	if cp.cfg.CA == nil {
		return nil, status.Error(codes.FailedPrecondition, "this control plane runs without TLS (--insecure-no-tls): there is nothing to join")
	}
	kind := r.GetKind()
	if kind != pki.KindWorker && kind != pki.KindDataPlane {
		return nil, status.Errorf(codes.InvalidArgument, "kind %q: want worker or dataplane", kind)
	}
	ids := r.GetNodeIds()
	if len(ids) == 0 || len(ids) > pki.MaxIDsPerCert {
		return nil, status.Errorf(codes.InvalidArgument, "1 to %d node ids per certificate", pki.MaxIDsPerCert)
	}
	for _, id := range ids {
		if err := pki.ValidID(id); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	csr, err := x509.ParseCertificateRequest(r.GetCsr())
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "certificate request: %v", err)
	}
	key := pki.KeyID(csr.PublicKey)
	// A renewal: a current certificate for every id and the same key.
	renew := false
	if c := callerCert(ctx); c != nil && r.GetToken() == "" {
		k, have := pki.IDs(c)
		renew = k == kind && pki.KeyID(c.PublicKey) == key && !slices.ContainsFunc(ids, func(id string) bool { return !slices.Contains(have, id) })
	}
	if !renew {
		if err := auth.Check(cp.tokens, r.GetToken(), auth.ScopeJoin, "", ""); err != nil {
			cp.log.Warn("join refused", "kind", kind, "first_id", ids[0], "err", err)
			if errors.Is(err, auth.ErrForbidden) {
				return nil, status.Error(codes.PermissionDenied, "this token may not join nodes (it needs the join or admin scope)")
			}
			return nil, status.Errorf(codes.Unauthenticated, "join token: %v", err)
		}
	}
	for _, id := range ids {
		if bound := cp.boundKey(kind, id); bound != "" && bound != key {
			cp.log.Warn("join refused: id bound to another key", "kind", kind, "id", id)
			return nil, errClaimed(kind, id)
		}
	}
	der, err := cp.cfg.CA.Sign(csr.PublicKey, kind, ids, nil, nil)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	cp.log.Info("node joined", "kind", kind, "ids", len(ids), "first_id", ids[0], "renewal", renew)
	return &briskv1.JoinResponse{Certificate: der, CaCertificate: cp.cfg.CA.Cert.Raw}, nil
}

// boundKey is the key id a node id is bound to ("" if none).
func (cp *ControlPlane) boundKey(kind, id string) string {
	switch kind {
	case pki.KindWorker:
		c := cp.cluster
		c.mu.Lock()
		defer c.mu.Unlock()
		if w, _, ok := c.r.Node(id); ok {
			return w.KeyID
		}
	case pki.KindDataPlane:
		if v, ok := cp.dpKeys.Load(id); ok {
			return v.(string)
		}
	}
	return ""
}

// bootstrapJoinToken creates a join token when the registry has none and
// writes it, with the CA's pin, to the data dir.
func (cp *ControlPlane) bootstrapJoinToken() error {
	if cp.cfg.CA == nil {
		return nil
	}
	toks, err := cp.store.Tokens()
	if err != nil {
		return err
	}
	for _, t := range toks {
		if slices.Contains(t.Scopes, auth.ScopeJoin) {
			return nil
		}
	}
	g, path, _, err := cp.admin.FirstToken(auth.ScopeJoin, cp.cfg.BootstrapJoinToken, filepath.Join(cp.cfg.DataDir, JoinTokenFile))
	if err != nil {
		return err
	}
	rec := &store.Token{ID: g.ID, Name: "bootstrap-join", Scopes: g.Scopes, Hash: g.Hash, CreatedAt: time.Now().UTC()}
	if err := cp.store.CreateToken(rec); err != nil {
		return err
	}
	cp.log.Info("created a join token for workers and data planes", "file", path, "ca_pin", cp.cfg.CA.Pin())
	return cp.admin.LoadTokens()
}

// loadDataPlaneKeys reads the data planes' bound keys from the registry.
func (cp *ControlPlane) loadDataPlaneKeys() error {
	dps, err := cp.store.DataPlanes()
	if err != nil {
		return err
	}
	for _, d := range dps {
		if d.KeyID != "" {
			cp.dpKeys.Store(d.ID, d.KeyID)
		}
	}
	return nil
}

// workerCreds are the credentials the control plane dials node id's worker
// with: its own certificate, and the worker's checked to name id.
func (cp *ControlPlane) workerCreds(id string) credentials.TransportCredentials {
	if cp.ident == nil {
		return nil
	}
	return credentials.NewTLS(cp.ident.ClientTLS(pki.KindWorker, id))
}

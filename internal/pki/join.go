package pki

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/rpc"
)

// Joiner gets a node its identity: from its state dir when a valid
// certificate for its ids is there, else by joining the cluster.
type Joiner struct {
	ControlPlane string   // gRPC address(es), comma-separated for HA
	Kind         string   // KindWorker or KindDataPlane
	IDs          []string // node ids the certificate must name
	Token        string   // join token (needed unless Dir holds a certificate)
	// The CA to trust on first contact: its PEM certificate, or its pin
	// (CA.Pin). With neither, Dir must hold ca.crt from an earlier join.
	CACert []byte
	CAPin  string
	Dir    string // where node.key, node.crt and ca.crt are kept; "" keeps them in memory
	Logger *slog.Logger
}

// Identity returns the node's identity, joining when needed. It retries
// while the control plane cannot be reached or refuses as a follower, and
// returns at once when the control plane refuses the join.
func (j *Joiner) Identity(ctx context.Context) (*Identity, error) {
	if j.Logger == nil {
		j.Logger = slog.Default()
	}
	if len(j.IDs) == 0 {
		return nil, errors.New("join: no node id")
	}
	var ca *x509.Certificate
	if len(j.CACert) > 0 {
		c, err := ParseCertPEM(j.CACert)
		if err != nil {
			return nil, fmt.Errorf("join: CA certificate: %w", err)
		}
		ca = c
	}
	if j.CAPin != "" && ca != nil && PinOf(ca) != normPin(j.CAPin) {
		return nil, errors.New("join: the CA certificate does not match the CA pin")
	}
	key, stored, err := j.load(ca)
	if err != nil {
		return nil, err
	}
	if stored != nil {
		return stored, nil
	}
	if ca == nil && j.CAPin == "" {
		return nil, errors.New("join: no CA to trust: give the CA certificate (--ca-cert) or its pin (--ca-pin), which the control plane prints and writes beside join.token")
	}
	if j.Token == "" {
		return nil, errors.New("join: no join token (--join-token or BRISK_JOIN_TOKEN; the control plane writes one to <data-dir>/join.token)")
	}
	return j.join(ctx, key, ca, nil)
}

// load reads Dir: the node's key (made when missing: a node keeps its key,
// to which the control plane binds its ids), and the stored identity when
// it is for these ids, from the trusted CA, and not about to expire.
func (j *Joiner) load(ca *x509.Certificate) (*ecdsa.PrivateKey, *Identity, error) {
	if j.Dir == "" {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		return key, nil, err
	}
	kp := filepath.Join(j.Dir, NodeKeyFile)
	var key *ecdsa.PrivateKey
	if b, err := os.ReadFile(kp); err == nil {
		if key, err = parseKeyPEM(b); err != nil {
			return nil, nil, fmt.Errorf("join: %s: %w", kp, err)
		}
	} else if errors.Is(err, os.ErrNotExist) {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, nil, err
		}
		der, _ := x509.MarshalPKCS8PrivateKey(key)
		if err := writeFile(kp, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, nil, fmt.Errorf("join: %w", err)
		}
	} else {
		return nil, nil, fmt.Errorf("join: %w", err)
	}
	cb, err1 := os.ReadFile(filepath.Join(j.Dir, NodeCertFile))
	ab, err2 := os.ReadFile(filepath.Join(j.Dir, CACertFile))
	if err1 != nil || err2 != nil {
		return key, nil, nil
	}
	leaf, err1 := ParseCertPEM(cb)
	storedCA, err2 := ParseCertPEM(ab)
	if err1 != nil || err2 != nil {
		j.Logger.Warn("join: unreadable stored certificate; joining again", "dir", j.Dir)
		return key, nil, nil
	}
	if ca != nil && !ca.Equal(storedCA) || j.CAPin != "" && PinOf(storedCA) != normPin(j.CAPin) {
		j.Logger.Warn("join: the stored certificate is from another CA; joining again", "dir", j.Dir)
		return key, nil, nil
	}
	id, err := newIdentity(leaf.Raw, key, storedCA)
	if err != nil || !leaf.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		return key, nil, nil
	}
	p := x509.NewCertPool()
	p.AddCert(storedCA)
	if err := Verify(p, []*x509.Certificate{leaf}, x509.ExtKeyUsageClientAuth, j.Kind, ""); err != nil {
		return key, nil, nil
	}
	k, ids := IDs(leaf)
	if k != j.Kind || !sameIDs(ids, j.IDs) {
		return key, nil, nil
	}
	if time.Until(leaf.NotAfter) < RenewBefore {
		// Renew with the current certificate; the token is the fallback.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if nid, err := j.join(ctx, key, storedCA, id); err == nil {
			return key, nid, nil
		}
		if time.Now().After(leaf.NotAfter) {
			return key, nil, nil
		}
	}
	return key, id, nil
}

func sameIDs(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func normPin(p string) string {
	p = strings.ToLower(strings.TrimSpace(p))
	if !strings.HasPrefix(p, "sha256:") {
		p = "sha256:" + p
	}
	return p
}

// join sends the request, over TLS checked against ca or the pin, with
// current as the client certificate when renewing.
func (j *Joiner) join(ctx context.Context, key *ecdsa.PrivateKey, ca *x509.Certificate, current *Identity) (*Identity, error) {
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: j.Kind + " " + j.IDs[0]}}, key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by VerifyConnection: the CA (given or pinned), then the identity
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs.PeerCertificates, ca, j.CAPin)
		},
	}
	if current != nil {
		cfg.Certificates = []tls.Certificate{current.Cert}
	}
	conn, err := rpc.DialLeader(credentials.NewTLS(cfg), j.ControlPlane)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cl := briskv1.NewControlPlaneClient(conn)
	req := &briskv1.JoinRequest{Token: j.Token, Kind: j.Kind, NodeIds: j.IDs, Csr: csr}
	if current != nil {
		req.Token = ""
	}
	delay := 50 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cl.Join(rctx, req)
		cancel()
		if err == nil {
			return j.accept(resp, key, ca)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("join %s: %w", j.ControlPlane, err)
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded:
			j.Logger.Debug("join: control plane not reachable yet", "err", err)
		default:
			return nil, fmt.Errorf("join %s refused: %s", j.ControlPlane, status.Convert(err).Message())
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("join %s: %w", j.ControlPlane, err)
		case <-t.C:
		}
		delay = min(delay*2, time.Second)
	}
}

// verifyPinned checks a control plane's chain against ca, or else against
// the certificate in the chain whose public key has the pin.
func verifyPinned(chain []*x509.Certificate, ca *x509.Certificate, pin string) error {
	if ca == nil {
		pin = normPin(pin)
		for _, c := range chain {
			if c.IsCA && PinOf(c) == pin {
				ca = c
				break
			}
		}
		if ca == nil {
			return errors.New("the control plane's certificate chain holds no CA with the pinned key (wrong --ca-pin, or not this cluster)")
		}
	}
	p := x509.NewCertPool()
	p.AddCert(ca)
	return Verify(p, chain, x509.ExtKeyUsageServerAuth, KindControlPlane, "")
}

// accept checks the issued certificate and stores it.
func (j *Joiner) accept(resp *briskv1.JoinResponse, key *ecdsa.PrivateKey, ca *x509.Certificate) (*Identity, error) {
	gotCA, err := x509.ParseCertificate(resp.GetCaCertificate())
	if err != nil {
		return nil, fmt.Errorf("join: CA certificate: %w", err)
	}
	if ca != nil && !ca.Equal(gotCA) || ca == nil && PinOf(gotCA) != normPin(j.CAPin) {
		return nil, errors.New("join: the control plane answered with another CA")
	}
	id, err := newIdentity(resp.GetCertificate(), key, gotCA)
	if err != nil {
		return nil, fmt.Errorf("join: certificate: %w", err)
	}
	if err := Verify(id.Pool(), []*x509.Certificate{id.Cert.Leaf}, x509.ExtKeyUsageClientAuth, j.Kind, ""); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if !id.Cert.Leaf.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) || !sameIDs(id.IDs(), j.IDs) {
		return nil, errors.New("join: the certificate is not for this key and these ids")
	}
	if j.Dir != "" {
		if err := writeFile(filepath.Join(j.Dir, NodeCertFile), CertPEM(resp.GetCertificate()), 0o644); err != nil {
			return nil, err
		}
		if err := writeFile(filepath.Join(j.Dir, CACertFile), CertPEM(gotCA.Raw), 0o644); err != nil {
			return nil, err
		}
	}
	j.Logger.Info("joined the cluster", "kind", j.Kind, "ids", len(j.IDs), "first", j.IDs[0], "expires", id.Cert.Leaf.NotAfter.Format(time.DateOnly))
	return id, nil
}

// ReadSecretFile reads a token file's first line.
func ReadSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	b, _, _ = bytes.Cut(b, []byte("\n"))
	return strings.TrimSpace(string(b)), nil
}

// IssueStored issues a certificate for the key kept in dir (made when
// missing): the identity of a component run beside the CA that must keep
// its key across restarts, since the control plane binds node ids to keys
// (brisk up's worker and data plane).
func (ca *CA) IssueStored(dir, kind string, ids []string) (*Identity, error) {
	j := &Joiner{Dir: dir, Kind: kind, IDs: ids, Logger: slog.Default()}
	key, _, err := j.load(nil)
	if err != nil {
		return nil, err
	}
	der, err := ca.Sign(&key.PublicKey, kind, ids, nil, nil)
	if err != nil {
		return nil, err
	}
	return newIdentity(der, key, ca.Cert)
}

// Package pki is brisk's component identity: the cluster CA, the
// certificates it issues to the control plane, workers and data planes, the
// TLS configurations of every gRPC listener and dialler, and the join of a
// node (a join token and a certificate request traded for a certificate).
// Standard library only. See docs/security.md "Component identity".
//
// A certificate's identity is in its URI SANs: brisk://KIND/ID, where KIND
// is controlplane, worker or dataplane. A worker daemon that hosts several
// nodes carries one URI per node. brisk checks identities, not host names:
// every component verifies its peer's chain against the cluster CA and then
// the URI it expects.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Kinds of component, the host part of an identity URI.
const (
	KindControlPlane = "controlplane"
	KindWorker       = "worker"
	KindDataPlane    = "dataplane"
)

// Files in a control plane's data dir (CA) and a node's state dir.
const (
	CACertFile    = "ca.crt"
	CAKeyFile     = "ca.key"
	JoinTokenFile = "join.token"
	NodeCertFile  = "node.crt"
	NodeKeyFile   = "node.key"
)

// Validity of what the CA issues. A node renews its certificate at start
// when less than RenewBefore is left (with its current certificate, no token
// needed).
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	CertValidity = 365 * 24 * time.Hour
	RenewBefore  = 30 * 24 * time.Hour
	// MaxIDsPerCert bounds the node ids one certificate names (a TLS
	// handshake message is at most 64 KiB).
	MaxIDsPerCert = 1000
)

// CA is the cluster certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// LoadCA reads dir/ca.crt and dir/ca.key; an error wrapping os.ErrNotExist
// when there is none.
func LoadCA(dir string) (*CA, error) {
	cb, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, err
	}
	cert, err := ParseCertPEM(cb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CACertFile), err)
	}
	key, err := parseKeyPEM(kb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CAKeyFile), err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", CAKeyFile, CACertFile)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", CACertFile)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CreateCA makes a new CA and writes it to dir (the key 0600). It refuses
// to replace an existing one.
func CreateCA(dir string) (*CA, error) {
	if _, err := os.Stat(filepath.Join(dir, CACertFile)); err == nil {
		return nil, fmt.Errorf("%s already exists", filepath.Join(dir, CACertFile))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "brisk cluster CA", Organization: []string{"brisk"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, CACertFile), CertPEM(der), 0o644); err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadOrCreateCA loads dir's CA, creating it when there is none; created
// says which.
func LoadOrCreateCA(dir string) (ca *CA, created bool, err error) {
	ca, err = LoadCA(dir)
	if errors.Is(err, os.ErrNotExist) {
		ca, err = CreateCA(dir)
		return ca, err == nil, err
	}
	return ca, false, err
}

// Pin is the CA's pin: "sha256:" and the hex SHA-256 of its public key
// (SubjectPublicKeyInfo), as kubeadm's discovery-token-ca-cert-hash.
func (ca *CA) Pin() string { return PinOf(ca.Cert) }

// PinOf is cert's pin (see CA.Pin).
func PinOf(cert *x509.Certificate) string {
	h := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(h[:])
}

// KeyID is the SHA-256 of a public key (SubjectPublicKeyInfo), hex: what a
// node id is bound to in the registry.
func KeyID(pub crypto.PublicKey) string {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return ""
	}
	h := sha256.Sum256(der)
	return hex.EncodeToString(h[:])
}

// Pool is a pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// URI is the identity URI of id of kind.
func URI(kind, id string) *url.URL {
	return &url.URL{Scheme: "brisk", Host: kind, Path: "/" + id}
}

// IDs reads the identity URIs of cert: the kind (the first URI's; every
// URI of one certificate has the same kind) and the ids.
func IDs(cert *x509.Certificate) (kind string, ids []string) {
	for _, u := range cert.URIs {
		if u.Scheme != "brisk" || u.Path == "" {
			continue
		}
		if kind == "" {
			kind = u.Host
		} else if u.Host != kind {
			continue
		}
		ids = append(ids, strings.TrimPrefix(u.Path, "/"))
	}
	return kind, ids
}

// Names reports whether cert is of kind and names id.
func Names(cert *x509.Certificate, kind, id string) bool {
	k, ids := IDs(cert)
	return k == kind && slices.Contains(ids, id)
}

// Sign issues a certificate for pub naming ids of kind, valid as a TLS
// client and server, with dns and ips as extra SANs.
func (ca *CA) Sign(pub crypto.PublicKey, kind string, ids, dns []string, ips []net.IP) ([]byte, error) {
	if len(ids) == 0 || len(ids) > MaxIDsPerCert {
		return nil, fmt.Errorf("a certificate names 1 to %d ids, not %d", MaxIDsPerCert, len(ids))
	}
	switch kind {
	case KindControlPlane, KindWorker, KindDataPlane:
	default:
		return nil, fmt.Errorf("unknown kind %q", kind)
	}
	uris := make([]*url.URL, len(ids))
	for i, id := range ids {
		if err := ValidID(id); err != nil {
			return nil, err
		}
		uris[i] = URI(kind, id)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: kind + " " + ids[0], Organization: []string{"brisk"}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(CertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         uris,
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

// ValidID checks that id can be an identity: 1 to 253 bytes of letters,
// digits and . _ - (node ids are host names by default).
func ValidID(id string) error {
	if id == "" || len(id) > 253 {
		return fmt.Errorf("id %q: 1 to 253 characters", id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("id %q: only letters, digits, '.', '_' and '-' can name a node", id)
		}
	}
	return nil
}

// Identity is a component's certificate and key, and the CA it trusts.
type Identity struct {
	Cert tls.Certificate // leaf (and key); Leaf set
	CA   *x509.Certificate
}

// Kind and IDs of the identity.
func (id *Identity) Kind() string { k, _ := IDs(id.Cert.Leaf); return k }

// IDs of the identity.
func (id *Identity) IDs() []string { _, ids := IDs(id.Cert.Leaf); return ids }

// Pool holds the CA.
func (id *Identity) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(id.CA)
	return p
}

// Issue makes a fresh key and a certificate for it: the identity of a
// component run beside the CA (the control plane itself, and `brisk up`'s
// worker and data plane).
func (ca *CA) Issue(kind string, ids, dns []string, ips []net.IP) (*Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := ca.Sign(&key.PublicKey, kind, ids, dns, ips)
	if err != nil {
		return nil, err
	}
	return newIdentity(der, key, ca.Cert)
}

func newIdentity(der []byte, key *ecdsa.PrivateKey, ca *x509.Certificate) (*Identity, error) {
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	// The CA goes with the leaf, so that a node holding only a pin can find
	// and check it.
	return &Identity{Cert: tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key, Leaf: leaf}, CA: ca}, nil
}

// Verify checks that chain[0] was issued by the CA in pool for usage and
// names id of kind (id "": any id of kind).
func Verify(pool *x509.CertPool, chain []*x509.Certificate, usage x509.ExtKeyUsage, kind, id string) error {
	if len(chain) == 0 {
		return errors.New("no certificate presented")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("certificate not issued by the cluster CA: %w", err)
	}
	k, ids := IDs(chain[0])
	if k != kind || (id != "" && !slices.Contains(ids, id)) {
		want := URI(kind, id).String()
		if id == "" {
			want = "brisk://" + kind + "/…"
		}
		got := "no brisk identity"
		if len(chain[0].URIs) > 0 {
			got = chain[0].URIs[0].String()
		}
		return fmt.Errorf("certificate is for %s, not %s", got, want)
	}
	return nil
}

// ServerTLS is the TLS configuration of a gRPC listener. A client
// certificate is verified against the CA when presented; with
// requireClient it must be, and be of one of clientKinds.
func (id *Identity) ServerTLS(requireClient bool, clientKinds ...string) *tls.Config {
	pool := id.Pool()
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Cert},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
	}
	if requireClient {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("a cluster certificate is required")
			}
			k, _ := IDs(cs.PeerCertificates[0])
			if !slices.Contains(clientKinds, k) {
				return fmt.Errorf("a %s certificate may not call this server", k)
			}
			return nil
		}
	}
	return cfg
}

// ClientTLS is the TLS configuration of a dialler presenting this identity
// and expecting a server of kind naming id ("" any id of kind). Host names
// are not checked: the identity is.
func (id *Identity) ClientTLS(kind, peerID string) *tls.Config {
	pool := id.Pool()
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{id.Cert},
		InsecureSkipVerify: true, // replaced by VerifyConnection: chain to the cluster CA, then the identity
		VerifyConnection: func(cs tls.ConnectionState) error {
			return Verify(pool, cs.PeerCertificates, x509.ExtKeyUsageServerAuth, kind, peerID)
		},
	}
}

// PeerCert is the verified client certificate of a server-side TLS
// connection state (nil without one).
func PeerCert(cs tls.ConnectionState) *x509.Certificate {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	return cs.VerifiedChains[0][0]
}

// CertPEM encodes a DER certificate.
func CertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// ParseCertPEM reads the first certificate of PEM data.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM certificate")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

func parseKeyPEM(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	var k any
	var err error
	switch blk.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	}
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("not an ECDSA key")
	}
	return ek, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// writeFile writes atomically with mode perm.
func writeFile(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// HostSANs are the SANs of a listener's certificate: localhost, 127.0.0.1
// and ::1, the host of addr (unless unspecified: 0.0.0.0, ::, empty) and
// extra host names or IP addresses.
func HostSANs(addr string, extra []string) (dns []string, ips []net.IP) {
	dns = []string{"localhost"}
	ips = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	hosts := slices.Clone(extra)
	if h, _, err := net.SplitHostPort(addr); err == nil {
		hosts = append(hosts, h)
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		} else if !slices.Contains(dns, h) {
			dns = append(dns, h)
		}
	}
	return dns, ips
}

// IssueListener makes a fresh key and a certificate for an HTTPS listener
// (the admin API, a data plane's or a gateway's invoke listener): a server
// certificate only, naming dns and ips and no brisk identity, so that it can
// never stand for a component. It is valid for CertValidity and carries
// the CA after the leaf.
func (ca *CA) IssueListener(name string, dns []string, ips []net.IP) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"brisk"}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(CertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// ListenerTLS is the TLS configuration of an HTTPS listener serving cert:
// TLS 1.2 or later, HTTP/1.1 only (brisk's HTTP listeners do not offer h2
// over TLS).
func ListenerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
}

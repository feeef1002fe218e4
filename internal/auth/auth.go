// Package auth is brisk's API tokens: their format, how they are made and
// checked, and what each scope allows. A token is shown once, when it is
// created; the registry keeps only its id and the SHA-256 of its secret.
//
// A token reads "brisk_<id>_<secret>": id is 8 random bytes in hex (public:
// it names the token in `brisk token list` and finds its record), secret
// 32 random bytes in unpadded base64url. Clients send it as
// "Authorization: Bearer <token>" or, for clients that only speak basic
// auth (faas-cli), as the password of "Authorization: Basic".
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Scopes. Admin allows everything; deploy manages functions and reads the
// cluster's status; invoke calls functions; join lets a worker or data
// plane join the cluster (trade the token for a certificate: gRPC Join).
const (
	ScopeAdmin  = "admin"
	ScopeDeploy = "deploy"
	ScopeInvoke = "invoke"
	ScopeJoin   = "join"
)

// Scopes lists the valid scope names.
var Scopes = []string{ScopeAdmin, ScopeDeploy, ScopeInvoke, ScopeJoin}

const prefix = "brisk_"

// Errors of Check; callers answer ErrNoToken and ErrBadToken with 401,
// ErrForbidden with 403.
var (
	ErrNoToken   = errors.New("authentication required: send Authorization: Bearer <token> (brisk token create)")
	ErrBadToken  = errors.New("invalid or revoked token")
	ErrForbidden = errors.New("the token's scopes do not allow this")
)

// Grant is what a component needs to know of a token to check it.
type Grant struct {
	ID        string
	Hash      string   // hex SHA-256 of the secret
	Scopes    []string // of Scopes
	Functions []string // the functions it may touch; empty: any
	Namespace string   // the namespace it is bound to; empty: all
	// SigningKey is the AWS secret access key of the token for SigV4
	// (SigningKeyOf): what a data plane checks Lambda API signatures with.
	// Empty for tokens made before brisk spoke the Lambda API.
	SigningKey string
}

// sigV4Label separates the SigV4 key from any other use of the secret.
const sigV4Label = "brisk-aws-sigv4-v1"

// SigningKeyOf derives a token's AWS secret access key from its secret:
// clients compute it from their token (AWSCredentials), the control plane
// when it makes the token. Unlike the secret's hash, which proves nothing
// by itself, this key is a credential for SigV4-signed calls; the data
// planes hold it, as AWS's front ends hold secret keys.
func SigningKeyOf(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(sigV4Label))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// AWSCredentials returns the access key id and secret access key an AWS
// client (boto3, the aws CLI, the AWS SDKs) signs Lambda API calls with
// for token tok.
func AWSCredentials(tok string) (keyID, secretKey string, ok bool) {
	id, secret, ok := split(tok)
	if !ok {
		return "", "", false
	}
	return prefix + id, SigningKeyOf(secret), true
}

// New makes a token: the string to hand to its user, and its grant. A
// token bound to a namespace (ns not empty) cannot have the admin scope.
func New(scopes, functions []string, ns string) (token string, g Grant, err error) {
	if ns != "" && slices.Contains(scopes, ScopeAdmin) {
		return "", Grant{}, errors.New("a token bound to a namespace cannot have the admin scope")
	}
	for _, s := range scopes {
		if !slices.Contains(Scopes, s) {
			return "", Grant{}, fmt.Errorf("unknown scope %q (one of %s)", s, strings.Join(Scopes, ", "))
		}
	}
	if len(scopes) == 0 {
		return "", Grant{}, errors.New("a token needs at least one scope")
	}
	var id [8]byte
	var secret [32]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", Grant{}, err
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", Grant{}, err
	}
	s := base64.RawURLEncoding.EncodeToString(secret[:])
	g = Grant{ID: hex.EncodeToString(id[:]), Hash: HashSecret(s), Scopes: slices.Clone(scopes), Functions: slices.Clone(functions), Namespace: ns, SigningKey: SigningKeyOf(s)}
	return prefix + g.ID + "_" + s, g, nil
}

// GrantOf is the grant of token tok, made elsewhere (`brisk k8s install`
// makes a cluster's first admin and join tokens before its control plane
// starts): tok must read as New writes tokens.
func GrantOf(tok string, scopes []string) (Grant, error) {
	id, secret, ok := split(tok)
	if !ok {
		return Grant{}, errors.New("token: want brisk_<16 hex digits>_<secret>")
	}
	if _, err := hex.DecodeString(id); err != nil {
		return Grant{}, errors.New("token: its id is not 16 hex digits")
	}
	b, err := base64.RawURLEncoding.DecodeString(secret)
	if err != nil || len(b) < 32 {
		return Grant{}, errors.New("token: its secret is not 32 or more bytes in unpadded base64url")
	}
	if distinct := len(slices.Compact(slices.Sorted(slices.Values(b)))); distinct < 8 {
		// 32 random bytes have ~30 distinct values; a hand-made secret
		// of one repeated byte (or a few) is guessable.
		return Grant{}, errors.New("token: its secret does not look random (make tokens with brisk token create or brisk k8s install)")
	}
	if len(scopes) == 0 {
		return Grant{}, errors.New("a token needs at least one scope")
	}
	return Grant{ID: id, Hash: HashSecret(secret), Scopes: slices.Clone(scopes), SigningKey: SigningKeyOf(secret)}, nil
}

// HashSecret is the stored form of a token's secret.
func HashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// split parses a token into its id and secret.
func split[S string | []byte](tok S) (id, secret S, ok bool) {
	if len(tok) < len(prefix) || string(tok[:len(prefix)]) != prefix {
		return id, secret, false
	}
	rest := tok[len(prefix):]
	if len(rest) < 17 || rest[16] != '_' {
		return id, secret, false
	}
	return rest[:16], rest[17:], true
}

// FromHeader takes the token out of an Authorization header value: a
// bearer token, or the password of basic auth (any user name). ok is false
// when the value carries none.
func FromHeader(v string) (string, bool) {
	scheme, rest, found := strings.Cut(v, " ")
	if !found {
		return "", false
	}
	rest = strings.TrimSpace(rest)
	switch {
	case strings.EqualFold(scheme, "Bearer"):
		return rest, rest != ""
	case strings.EqualFold(scheme, "Basic"):
		raw, err := base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return "", false
		}
		_, pass, found := strings.Cut(string(raw), ":")
		return pass, found && pass != ""
	}
	return "", false
}

// entry is a grant ready for checks.
type entry struct {
	hash    [sha256.Size]byte
	scopes  uint8 // bits: 1<<index in Scopes
	fns     map[string]bool
	ns      string
	signKey string
}

func scopeBit(s string) uint8 {
	if i := slices.Index(Scopes, s); i >= 0 {
		return 1 << i
	}
	return 0
}

// Checker checks tokens against the grants it was last given. Checks take
// no lock: the grants are replaced whole.
type Checker struct {
	grants atomic.Pointer[map[string]*entry]
}

// NewChecker returns a checker that knows no token yet.
func NewChecker() *Checker {
	c := &Checker{}
	c.Replace(nil)
	return c
}

// Replace makes grants the tokens c accepts; grants with a malformed hash
// are skipped.
func (c *Checker) Replace(grants []Grant) {
	m := make(map[string]*entry, len(grants))
	for _, g := range grants {
		e := &entry{ns: g.Namespace, signKey: g.SigningKey}
		if b, err := hex.DecodeString(g.Hash); err != nil || len(b) != sha256.Size {
			continue
		} else {
			copy(e.hash[:], b)
		}
		for _, s := range g.Scopes {
			e.scopes |= scopeBit(s)
		}
		if len(g.Functions) > 0 {
			e.fns = make(map[string]bool, len(g.Functions))
			for _, f := range g.Functions {
				e.fns[f] = true
				// Within its namespace a token names its functions as
				// their tenant deployed them: "api" is api.NAMESPACE
				// (spec.Qualify).
				e.fns[spec.Qualify(f, g.Namespace)] = true
			}
		}
		m[g.ID] = e
	}
	c.grants.Store(&m)
}

// Len is the number of tokens c accepts.
func (c *Checker) Len() int { return len(*c.grants.Load()) }

// lookup finds a token's entry and checks its secret.
func lookup[S string | []byte](c *Checker, tok S) (*entry, error) {
	if len(tok) == 0 {
		return nil, ErrNoToken
	}
	tid, secret, ok := split(tok)
	if !ok {
		return nil, ErrBadToken
	}
	e := (*c.grants.Load())[string(tid)]
	if e == nil {
		return nil, ErrBadToken
	}
	var h [sha256.Size]byte
	switch s := any(secret).(type) {
	case string:
		// Through a stack buffer: []byte(s) of a secret this long
		// allocates, once per admin request.
		var buf [64]byte
		h = sha256.Sum256(append(buf[:0], s...))
	case []byte:
		h = sha256.Sum256(s)
	}
	if subtle.ConstantTimeCompare(h[:], e.hash[:]) != 1 {
		return nil, ErrBadToken
	}
	return e, nil
}

// allows reports whether e grants scope on function fn of namespace ns.
func (e *entry) allows(scope, ns, fn string) error {
	if e.scopes&scopeBit(ScopeAdmin) != 0 {
		return nil
	}
	if e.scopes&scopeBit(scope) == 0 {
		return ErrForbidden
	}
	if e.ns != "" && e.ns != ns {
		return ErrForbidden
	}
	if e.fns != nil && !e.fns[fn] {
		return ErrForbidden
	}
	return nil
}

// SigningKey returns the SigV4 secret key of the token whose access key id
// is keyID ("brisk_" + its id), and a func checking that token's grant as
// Check does; ok is false for an unknown token or one without a key.
func (c *Checker) SigningKey(keyID string) (key string, allows func(scope, ns, fn string) error, ok bool) {
	id, found := strings.CutPrefix(keyID, prefix)
	if !found {
		return "", nil, false
	}
	e := (*c.grants.Load())[id]
	if e == nil || e.signKey == "" {
		return "", nil, false
	}
	return e.signKey, e.allows, true
}

// Check checks a token (as sent) for scope on function fn of namespace ns;
// ns and fn empty ask about the cluster as a whole (a token limited to a
// namespace or to functions is refused it), fn empty about the namespace.
// Admin tokens pass every check. It does not allocate.
func Check[S string | []byte](c *Checker, tok S, scope, ns, fn string) error {
	e, err := lookup(c, tok)
	if err != nil {
		return err
	}
	return e.allows(scope, ns, fn)
}

// HasScope checks a token for scope alone, whatever namespace or
// functions it is limited to (a list is then filtered with Check).
func HasScope(c *Checker, tok, scope string) error {
	e, err := lookup(c, tok)
	if err != nil {
		return err
	}
	if e.scopes&(scopeBit(ScopeAdmin)|scopeBit(scope)) == 0 {
		return ErrForbidden
	}
	return nil
}

// FunctionsAnywhere reports whether a valid token is limited to functions
// but bound to no namespace (not an admin's): it may act on its functions
// wherever they are, but creates them only in the default namespace, or
// it could plant one of its names in any tenant's namespace.
func FunctionsAnywhere(c *Checker, tok string) bool {
	e, err := lookup(c, tok)
	return err == nil && e.scopes&scopeBit(ScopeAdmin) == 0 && e.fns != nil && e.ns == ""
}

// NamespaceOf is the namespace a valid token is bound to ("": none, or
// not a valid token).
func NamespaceOf(c *Checker, tok string) string {
	if e, err := lookup(c, tok); err == nil {
		return e.ns
	}
	return ""
}

// ID is the public id of a well-formed token ("" otherwise), for logs.
func ID(tok string) string {
	id, _, _ := split(tok)
	return id
}

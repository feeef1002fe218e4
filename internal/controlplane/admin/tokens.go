package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
)

// The admin API's authentication: every route but /healthz and the
// dashboard's static files (/ui/, which carry no data) needs a token
// (Config.AuthDisabled turns that off), and each handler says which scope
// and function it needs (authorize). Tokens live in the registry, hashed;
// the checker holds the grants of the current ones.

// AdminTokenFile is api.AdminTokenFile: the file in the data dir where a
// control plane that finds no token at all writes the first admin token.
const AdminTokenFile = api.AdminTokenFile

// authenticate wraps the admin mux: a request without a valid token is
// refused before any route (so unknown routes answer 401 too).
func (srv *API) authenticate(next http.Handler) http.Handler {
	if srv.cfg.AuthDisabled {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || uiPath(r) { // the dashboard's page: its data needs a token
			next.ServeHTTP(w, r)
			return
		}
		addr, now := srv.clientAddr(r), time.Now()
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		if ok, wait := srv.authThrottle.Allowed(addr, tok, now); !ok {
			// 401 still: the token is not accepted, and clients treat it so.
			secs := int(wait/time.Second) + 1
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			w.Header().Set("WWW-Authenticate", `Bearer realm="brisk"`)
			WriteError(w, http.StatusUnauthorized, fmt.Sprintf("too many failed authentications with this token from %s: not checked; try again in %d s", addr, secs))
			return
		}
		if err := auth.Check(srv.tokens, tok, "", "", ""); err != nil && !errors.Is(err, auth.ErrForbidden) {
			if !errors.Is(err, auth.ErrNoToken) {
				srv.authThrottle.Failed(addr, tok, now) // a wrong token, not a missing one
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="brisk"`)
			WriteError(w, http.StatusUnauthorized, err.Error())
			return
		}
		next.ServeHTTP(w, r)
	})
}

// clientAddr is the address of the request's client: its peer's, or for
// a request a follower replica forwarded (Config.TrustedProxies), the
// client the follower saw (the last X-Forwarded-For entry). The zero Addr
// when there is none (a test's handler call).
func (srv *API) clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	a := ap.Addr().Unmap()
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 && srv.trustedProxy(r.Context(), a) {
		last := xff[len(xff)-1]
		if i := strings.LastIndexByte(last, ','); i >= 0 {
			last = last[i+1:]
		}
		if c, err := netip.ParseAddr(strings.TrimSpace(last)); err == nil {
			return c.Unmap()
		}
	}
	return a
}

// trustedProxy reports whether a is a replica's address
// (Config.TrustedProxies). Names are resolved on the first question and
// again when an address is not found, at most every 30 s.
func (srv *API) trustedProxy(ctx context.Context, a netip.Addr) bool {
	if len(srv.cfg.TrustedProxies) == 0 {
		return false
	}
	if known := srv.proxyAddrs.Load(); known != nil && slices.Contains(*known, a) {
		return true
	}
	now := time.Now().UnixNano()
	if last := srv.proxyAddrsAt.Load(); last != 0 && now-last < int64(30*time.Second) || !srv.proxyAddrsAt.CompareAndSwap(last, now) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var addrs []netip.Addr
	for _, h := range srv.cfg.TrustedProxies {
		if ip, err := netip.ParseAddr(h); err == nil {
			addrs = append(addrs, ip.Unmap())
			continue
		}
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
		if err != nil {
			srv.log.Debug("resolving a replica's address for the auth throttle", "host", h, "err", err)
			continue
		}
		for _, ip := range ips {
			addrs = append(addrs, ip.Unmap())
		}
	}
	srv.proxyAddrs.Store(&addrs)
	return slices.Contains(addrs, a)
}

// authorize checks the request's token for scope on function fn of
// namespace ns (both "": the API as a whole; fn "": the namespace); on
// failure it has answered 403.
func (srv *API) authorize(w http.ResponseWriter, r *http.Request, scope, ns, fn string) bool {
	if srv.cfg.AuthDisabled {
		return true
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	err := auth.Check(srv.tokens, tok, scope, ns, fn)
	switch {
	case err == nil:
		return true
	case errors.Is(err, auth.ErrForbidden):
		what := "the cluster"
		switch {
		case fn != "":
			what = fmt.Sprintf("function %q", fn)
		case ns != "":
			what = fmt.Sprintf("namespace %q", ns)
		}
		WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s: its scopes do not allow %s on %s", auth.ID(tok), scope, what))
	default:
		WriteError(w, http.StatusUnauthorized, err.Error())
	}
	return false
}

// LoadTokens gives the checker the registry's tokens.
func (srv *API) LoadTokens() error {
	srv.tokensMu.Lock()
	defer srv.tokensMu.Unlock()
	toks, err := srv.store.Tokens()
	if err != nil {
		return err
	}
	grants := make([]auth.Grant, len(toks))
	for i, t := range toks {
		grants[i] = auth.Grant{ID: t.ID, Hash: t.Hash, Scopes: t.Scopes, Functions: t.Functions, Namespace: t.Namespace, SigningKey: t.SigningKey}
	}
	srv.tokens.Replace(grants)
	srv.cluster.SetAuth(!srv.cfg.AuthDisabled, grants)
	return nil
}

// BootstrapToken creates the first admin token when the registry has none
// and writes it to the data dir, so that whoever starts a cluster can use
// it at once and nobody else can.
func (srv *API) BootstrapToken() error {
	if srv.cfg.AuthDisabled || srv.tokens.Len() > 0 {
		return nil
	}
	g, path, _, err := srv.FirstToken(auth.ScopeAdmin, srv.cfg.BootstrapAdminToken, filepath.Join(srv.cfg.DataDir, AdminTokenFile))
	if err != nil {
		return err
	}
	rec := &store.Token{ID: g.ID, Name: "bootstrap-admin", Scopes: g.Scopes, Hash: g.Hash, SigningKey: g.SigningKey, CreatedAt: time.Now().UTC()}
	if err := srv.store.CreateToken(rec); err != nil {
		return err
	}
	srv.log.Info("created the first admin token", "file", path, "id", g.ID)
	return srv.LoadTokens()
}

// FirstToken is a bootstrap token of scope: the given one while the
// registry is unused (givenTokenUsable), else, with a path, a new one
// written there (written is "" for a given token: whoever gave it has
// it). ok is false when there is none to register.
func (srv *API) FirstToken(scope, given, path string) (g auth.Grant, written string, ok bool, err error) {
	if given != "" && srv.givenTokenUsable(scope) {
		if g, err = auth.GrantOf(given, []string{scope}); err != nil {
			return g, "", false, fmt.Errorf("controlplane: the bootstrap %s token: %w", scope, err)
		}
		return g, "", true, nil
	}
	if path == "" {
		return g, "", false, nil
	}
	tok, g, err := auth.New([]string{scope}, nil, "")
	if err != nil {
		return g, "", false, err
	}
	if err := writeSecret(path, tok+"\n"); err != nil {
		return g, "", false, fmt.Errorf("controlplane: writing the first %s token: %w", scope, err)
	}
	return g, path, true, nil
}

// bootstrapDeployName names the given deploy token's record.
const bootstrapDeployName = "bootstrap-deploy"

// BootstrapDeployToken registers the given deploy token when no token of
// its name exists and the registry is unused (givenTokenUsable): a revoked
// one does not come back.
func (srv *API) BootstrapDeployToken() error {
	if srv.cfg.AuthDisabled || srv.cfg.BootstrapDeployToken == "" {
		return nil
	}
	toks, err := srv.store.Tokens()
	if err != nil {
		return err
	}
	for _, t := range toks {
		if t.Name == bootstrapDeployName {
			return nil
		}
	}
	g, _, ok, err := srv.FirstToken(auth.ScopeDeploy, srv.cfg.BootstrapDeployToken, "")
	if err != nil || !ok {
		return err
	}
	rec := &store.Token{ID: g.ID, Name: bootstrapDeployName, Scopes: g.Scopes, Hash: g.Hash, SigningKey: g.SigningKey, CreatedAt: time.Now().UTC()}
	if err := srv.store.CreateToken(rec); err != nil {
		return err
	}
	srv.log.Info("registered the given deploy token", "id", g.ID)
	return srv.LoadTokens()
}

// givenTokenUsable says whether a bootstrap token given in the
// configuration may be registered: only in a registry nothing has used yet
// (no worker, data plane or function). Every new leader term bootstraps
// again when the registry has no token of a kind; a given token, still in
// the Secret every replica mounts, would otherwise come back after an
// operator revoked it. Past that, a new token is made into the data dir as
// without a given one.
func (srv *API) givenTokenUsable(kind string) bool {
	ws, err1 := srv.store.Workers()
	dps, err2 := srv.store.DataPlanes()
	fns, err3 := srv.store.Functions()
	if err := errors.Join(err1, err2, err3); err != nil || len(ws)+len(dps)+len(fns) > 0 {
		then := "making a new one into the data dir"
		if kind == auth.ScopeDeploy {
			then = "give its user a token made with brisk token create"
		}
		srv.log.Warn("not registering the given bootstrap token: the registry is in use (was the token revoked?); "+then,
			"kind", kind, "err", err)
		return false
	}
	return true
}

// ReadAdminToken reads the first admin token a control plane wrote to its
// data dir.
func ReadAdminToken(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, AdminTokenFile))
	if err != nil {
		return "", fmt.Errorf("reading the admin token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// writeSecret writes data to path readable by its owner only, atomically.
func writeSecret(path, data string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func viewOf(t *store.Token) TokenView {
	return TokenView{ID: t.ID, Name: t.Name, Scopes: t.Scopes, Functions: t.Functions, Namespace: t.Namespace, CreatedAt: t.CreatedAt}
}

func (srv *API) createToken(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	var req TokenRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.Name == "" || len(req.Name) > 128 || controlBytes(req.Name) {
		WriteError(w, http.StatusBadRequest, "name: required, at most 128 characters, no control bytes")
		return
	}
	if len(req.Functions) > 1000 {
		WriteError(w, http.StatusBadRequest, "functions: at most 1000")
		return
	}
	if req.Namespace != "" && !srv.namespaceExists(req.Namespace) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("namespace: %q does not exist (brisk ns create)", req.Namespace))
		return
	}
	tok, g, err := auth.New(req.Scopes, req.Functions, req.Namespace)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "scopes: "+err.Error())
		return
	}
	rec := &store.Token{ID: g.ID, Name: req.Name, Scopes: g.Scopes, Functions: g.Functions, Namespace: g.Namespace, Hash: g.Hash, SigningKey: g.SigningKey, CreatedAt: time.Now().UTC()}
	if err := srv.store.CreateToken(rec); err != nil {
		writeStoreError(w, "storing the token: ", err)
		return
	}
	if err := srv.LoadTokens(); err != nil {
		writeStoreError(w, "loading tokens: ", err)
		return
	}
	v := viewOf(rec)
	v.Token = tok
	WriteJSON(w, http.StatusCreated, v)
}

func (srv *API) listTokens(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	toks, err := srv.store.Tokens()
	if err != nil {
		writeStoreError(w, "reading tokens: ", err)
		return
	}
	out := make([]TokenView, len(toks))
	for i, t := range toks {
		out[i] = viewOf(t)
	}
	WriteJSON(w, http.StatusOK, out)
}

func (srv *API) revokeToken(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	id := r.PathValue("id")
	if err := srv.store.DeleteToken(id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			WriteError(w, http.StatusNotFound, fmt.Sprintf("token %q not found", id))
			return
		}
		writeStoreError(w, "revoking the token: ", err)
		return
	}
	if err := srv.LoadTokens(); err != nil {
		writeStoreError(w, "loading tokens: ", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readJSON decodes a small JSON body strictly; on failure it has answered.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	return readJSONLimit(w, r, v, 64<<10)
}

// readJSONLimit is readJSON for bodies of up to limit bytes.
func readJSONLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d KiB", limit>>10))
		} else {
			WriteError(w, http.StatusBadRequest, "malformed JSON: "+err.Error())
		}
		return false
	}
	return true
}

func controlBytes(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

package admin

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Secrets are values a function's sandboxes read as files under
// spec.SecretsDir (OpenFaaS's secrets). The registry keeps them; the
// cluster keeps a copy in memory and attaches the values a function names
// to the spec it sends a worker with a Create or an Offer (link.go), never
// to what data planes or the admin API see. A function may name only
// secrets of its own namespace that exist, and a secret in use cannot be
// deleted: both are checked under secretMu so that a deploy and a delete
// racing cannot leave a function naming a missing secret. A token limited
// to functions cannot manage secrets (they are the namespace's), nor give
// its functions secrets they did not name (their code would read them).
// A namespace holds at most spec.MaxSecretsPerNamespace secrets and
// spec.MaxSecretBytesPerNamespace bytes of values: the cluster keeps them
// all in memory and answers reads from there.
//
// An update reaches sandboxes started after it; running sandboxes keep the
// value they started with (redeploy the function to roll them), as
// Kubernetes' environment-variable secrets and Lambda's do.

// maxSecretBody bounds a secret request: the largest value, base64, plus
// the rest of the JSON.
const maxSecretBody = spec.MaxSecretSize*4/3 + 64<<10

// LoadSecrets gives the cluster the registry's secrets.
func (srv *API) LoadSecrets() error {
	secs, err := srv.store.Secrets()
	if err != nil {
		return err
	}
	srv.cluster.SetSecrets(secs)
	return nil
}

// secretWritten brings the cluster's copy up to date after a registry
// write: key now holds s (nil: deleted), or, when the write failed (it may
// still have been applied: a replica losing leadership), whatever the
// registry holds.
func (srv *API) secretWritten(key string, s *store.Secret, err error) {
	if err == nil {
		srv.cluster.PutSecret(key, s)
		return
	}
	if lerr := srv.LoadSecrets(); lerr != nil {
		srv.log.Warn("reloading secrets after a failed write", "err", lerr)
	}
}

// missingSecrets returns the secrets f names that do not exist in its
// namespace; the caller holds secretMu.
func (srv *API) missingSecrets(f *spec.Function) []string {
	if len(f.Secrets) == 0 {
		return nil
	}
	return srv.cluster.MissingSecrets(reconciler.NamespaceOf(f), f.Secrets)
}

// admitSecrets checks that every secret f names exists. On failure it has
// answered.
func (srv *API) admitSecrets(w http.ResponseWriter, f *spec.Function) bool {
	if miss := srv.missingSecrets(f); len(miss) > 0 {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid function spec: secrets: %s not found in namespace %q (brisk secret create NAME -n %s)",
			strings.Join(miss, ", "), reconciler.NamespaceOf(f), reconciler.NamespaceOf(f)))
		return false
	}
	return true
}

// mayAddSecrets reports whether the request's token may give a function of
// namespace ns secrets it did not name: only a token allowed on the whole
// namespace may, the one that may manage its secrets. A token limited to
// functions may keep (or drop) the secrets its function has. On refusal it
// has answered.
func (srv *API) mayAddSecrets(w http.ResponseWriter, r *http.Request, ns string, f *spec.Function, had []string) bool {
	if srv.cfg.AuthDisabled {
		return true
	}
	var added []string
	for _, n := range f.Secrets {
		if !slices.Contains(had, n) {
			added = append(added, n)
		}
	}
	if len(added) == 0 {
		return true
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	if auth.Check(srv.tokens, tok, auth.ScopeDeploy, ns, "") == nil {
		return true
	}
	WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s is limited to functions: it may not give function %q secrets it did not name (%s); a token with deploy on namespace %q may",
		auth.ID(tok), f.Name, strings.Join(added, ", "), ns))
	return false
}

// requestNamespace is the namespace a secret or trigger request
// addresses: the query's or the body's, else the token's own, else the
// default one.
func (srv *API) requestNamespace(r *http.Request, body string) string {
	ns := r.URL.Query().Get("namespace")
	if ns == "" {
		ns = body
	}
	if ns == "" && !srv.cfg.AuthDisabled {
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		ns = auth.NamespaceOf(srv.tokens, tok)
	}
	if ns == "" {
		ns = spec.DefaultNamespace
	}
	return ns
}

// readSecret decodes a secret request; on failure it has answered.
func readSecret(w http.ResponseWriter, r *http.Request) (*api.SecretRequest, bool) {
	var req api.SecretRequest
	if !readJSONLimit(w, r, &req, maxSecretBody) {
		return nil, false
	}
	if req.Value != "" && req.RawValue != nil {
		WriteError(w, http.StatusBadRequest, "invalid secret: set value or raw_value, not both")
		return nil, false
	}
	if n := len(req.Value) + len(req.RawValue); n > spec.MaxSecretSize {
		WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("secret value of %d bytes is larger than %d", n, spec.MaxSecretSize))
		return nil, false
	}
	return &req, true
}

func secretValue(req *api.SecretRequest) []byte {
	if req.RawValue != nil {
		return req.RawValue
	}
	return []byte(req.Value)
}

// checkSecretTarget checks a secret to write: its name, and that its
// namespace exists; the caller holds secretMu, which a namespace's
// deletion holds too, so that no secret outlives its namespace. On failure
// it has answered.
func (srv *API) checkSecretTarget(w http.ResponseWriter, ns, name string) bool {
	if !spec.ValidSecretName(name) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid secret name %q: %s", name, spec.SecretNameRule))
		return false
	}
	if !spec.ValidNamespace(ns) || !srv.namespaceExists(ns) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid secret: namespace %q does not exist", ns))
		return false
	}
	return true
}

// checkSecretRoom checks that namespace ns stays within the limits with
// a value of size bytes for its secret name (in place of its current one,
// if any); the caller holds secretMu. On failure it has answered.
func (srv *API) checkSecretRoom(w http.ResponseWriter, ns, name string, size int) bool {
	n, bytes, exists := srv.cluster.SecretUsage(ns, name)
	if !exists && n+1 > spec.MaxSecretsPerNamespace {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("namespace %q: secrets %d is above the limit %d", ns, n+1, spec.MaxSecretsPerNamespace))
		return false
	}
	if bytes+int64(size) > spec.MaxSecretBytesPerNamespace {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("namespace %q: its secrets' values would take %d bytes, above the limit %d", ns, bytes+int64(size), spec.MaxSecretBytesPerNamespace))
		return false
	}
	return true
}

func secretView(s *store.Secret, users []string) api.SecretView {
	return api.SecretView{Name: s.Name, Namespace: s.Namespace, Size: len(s.Value), UsedBy: users, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

func (srv *API) createSecret(w http.ResponseWriter, r *http.Request) {
	req, ok := readSecret(w, r)
	if !ok {
		return
	}
	ns := srv.requestNamespace(r, req.Namespace)
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, "") {
		return
	}
	now := time.Now().UTC()
	rec := &store.Secret{Namespace: ns, Name: req.Name, Value: secretValue(req), CreatedAt: now, UpdatedAt: now}
	srv.secretMu.Lock()
	defer srv.secretMu.Unlock()
	if !srv.checkSecretTarget(w, ns, req.Name) {
		return
	}
	if srv.cluster.Secret(ns, req.Name) != nil {
		WriteError(w, http.StatusConflict, fmt.Sprintf("secret %q already exists in namespace %q (use PUT to update it)", req.Name, ns))
		return
	}
	if !srv.checkSecretRoom(w, ns, req.Name, len(rec.Value)) {
		return
	}
	err := srv.store.CreateSecret(rec)
	srv.secretWritten(rec.Key(), rec, err)
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			WriteError(w, http.StatusConflict, fmt.Sprintf("secret %q already exists in namespace %q (use PUT to update it)", req.Name, ns))
			return
		}
		writeStoreError(w, "storing the secret: ", err)
		return
	}
	w.Header().Set("Location", "/v1/secrets/"+req.Name+"?namespace="+ns)
	WriteJSON(w, http.StatusCreated, secretView(rec, nil))
}

func (srv *API) updateSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	req, ok := readSecret(w, r)
	if !ok {
		return
	}
	if req.Name != "" && req.Name != name {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid secret: name %q does not match the URL's %q", req.Name, name))
		return
	}
	ns := srv.requestNamespace(r, req.Namespace)
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, "") {
		return
	}
	srv.secretMu.Lock()
	defer srv.secretMu.Unlock()
	if !srv.checkSecretTarget(w, ns, name) {
		return
	}
	old := srv.cluster.Secret(ns, name)
	if old == nil {
		writeSecretError(w, ns, name, store.ErrNotFound)
		return
	}
	rec := &store.Secret{Namespace: ns, Name: name, Value: secretValue(req), CreatedAt: old.CreatedAt, UpdatedAt: time.Now().UTC()}
	if !srv.checkSecretRoom(w, ns, name, len(rec.Value)) {
		return
	}
	err := srv.store.UpdateSecret(rec)
	srv.secretWritten(rec.Key(), rec, err)
	if err != nil {
		writeSecretError(w, ns, name, err)
		return
	}
	WriteJSON(w, http.StatusOK, secretView(rec, srv.cluster.SecretUsers(ns, name)))
}

func (srv *API) getSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ns := srv.requestNamespace(r, "")
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, "") {
		return
	}
	s := srv.cluster.Secret(ns, name)
	if s == nil {
		writeSecretError(w, ns, name, store.ErrNotFound)
		return
	}
	WriteJSON(w, http.StatusOK, secretView(s, srv.cluster.SecretUsers(ns, name)))
}

// listSecrets answers the secrets of ?namespace= (default: the token's
// namespace, or every namespace for a token bound to none).
func (srv *API) listSecrets(w http.ResponseWriter, r *http.Request) {
	ns := r.URL.Query().Get("namespace")
	if ns == "" && !srv.cfg.AuthDisabled {
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		ns = auth.NamespaceOf(srv.tokens, tok)
	}
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, "") {
		return
	}
	out := []api.SecretView{}
	for _, s := range srv.cluster.SecretsIn(ns) {
		out = append(out, secretView(s, nil))
	}
	slices.SortFunc(out, func(a, b api.SecretView) int {
		return strings.Compare(store.SecretKey(a.Namespace, a.Name), store.SecretKey(b.Namespace, b.Name))
	})
	WriteJSON(w, http.StatusOK, out)
}

func (srv *API) deleteSecret(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ns := srv.requestNamespace(r, "")
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, "") {
		return
	}
	srv.secretMu.Lock()
	defer srv.secretMu.Unlock()
	if users := srv.cluster.SecretUsers(ns, name); len(users) > 0 {
		WriteError(w, http.StatusConflict, fmt.Sprintf("secret %q is used by %s in namespace %q: remove it from their specs first", name, strings.Join(users, ", "), ns))
		return
	}
	err := srv.store.DeleteSecret(ns, name)
	srv.secretWritten(store.SecretKey(ns, name), nil, err)
	if err != nil {
		writeSecretError(w, ns, name, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func writeSecretError(w http.ResponseWriter, ns, name string, err error) {
	if errors.Is(err, store.ErrNotFound) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("secret %q not found in namespace %q", name, ns))
		return
	}
	writeStoreError(w, "secret: ", err)
}

// namespaceSecrets counts namespace ns's secrets (a namespace with secrets
// cannot be deleted); the caller holds secretMu.
func (srv *API) namespaceSecrets(ns string) int {
	n, _, _ := srv.cluster.SecretUsage(ns, "")
	return n
}

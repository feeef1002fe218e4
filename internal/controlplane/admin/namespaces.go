package admin

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/specpb"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Namespaces are tenants: each function belongs to one, tokens may be bound
// to one (they then see and touch only its functions), and a namespace's
// quota bounds its functions, its sandboxes and the resources they request
// (quota.go enforces the scheduling part). "default" always exists.

// namespaceExists reports whether functions may be deployed in ns.
func (srv *API) namespaceExists(ns string) bool {
	if ns == spec.DefaultNamespace {
		return true
	}
	_, ok := srv.cluster.Quota(ns)
	return ok
}

// namespaceOfFn is the namespace of the function called name, or "" when
// there is none (a token bound to a namespace is then refused, the same
// answer as for another namespace's function: names do not leak).
func (srv *API) namespaceOfFn(name string) string {
	if f := srv.cluster.Spec(name); f != nil {
		return reconciler.NamespaceOf(f)
	}
	return ""
}

// qualify is spec.Qualify(name, ns), except that a bare name a function
// of namespace ns holds already (made before names were per namespace)
// stays as it is — for a request whose token may see that namespace: to
// another, whether such a function exists is not to be told (the name a
// refusal echoes would say it).
func (srv *API) qualify(r *http.Request, name, ns string) string {
	q := spec.Qualify(name, ns)
	if q != name && srv.namespaceOfFn(name) == ns && srv.maySee(r, ns) {
		return name
	}
	return q
}

// maySee reports whether the request's token may deploy into namespace ns
// (or auth is off).
func (srv *API) maySee(r *http.Request, ns string) bool {
	if srv.cfg.AuthDisabled {
		return true
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	return auth.Check(srv.tokens, tok, auth.ScopeDeploy, ns, "") == nil
}

// pathFunction is the function a /v1/functions/{name}/… path names: a
// bare name is qualified with the request's namespace (?namespace=, else
// the one its token is bound to), so that a tenant reaches its function by
// the name it deployed it under.
func (srv *API) pathFunction(r *http.Request) string {
	name := r.PathValue("name")
	if strings.IndexByte(name, '.') >= 0 {
		return name
	}
	return srv.qualify(r, name, srv.requestNamespace(r, ""))
}

// admitToNamespace checks f against its namespace: that it exists, and its
// quota's max_functions (for a new function) and max_scale. On failure it
// has answered.
func (srv *API) admitToNamespace(w http.ResponseWriter, f *spec.Function, create bool) bool {
	ns := reconciler.NamespaceOf(f)
	if !srv.namespaceExists(ns) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid function spec: namespace: %q does not exist (brisk ns create %s)", ns, ns))
		return false
	}
	q, _ := srv.cluster.Quota(ns)
	over := func(what string, v, limit int) bool {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("namespace %q: %s %d is above its quota %d", ns, what, v, limit))
		return false
	}
	if q.MaxScale > 0 {
		if f.Scaling.Min > q.MaxScale {
			return over("scaling.min", f.Scaling.Min, q.MaxScale)
		}
		if f.Scaling.Max > q.MaxScale {
			return over("scaling.max", f.Scaling.Max, q.MaxScale)
		}
	}
	if create && q.MaxFunctions > 0 {
		if n := srv.cluster.Usage(ns).Functions; n+1 > q.MaxFunctions {
			return over("functions", n+1, q.MaxFunctions)
		}
	}
	return true
}

// LoadQuotas gives the cluster the registry's namespaces.
func (srv *API) LoadQuotas() error {
	nss, err := srv.store.Namespaces()
	if err != nil {
		return err
	}
	q := make(map[string]spec.Quota, len(nss))
	egress := make(map[string]spec.EgressPolicy, len(nss))
	for _, n := range nss {
		q[n.Name], egress[n.Name] = n.Quota, n.Egress
	}
	srv.cluster.SetQuotas(q)
	srv.cluster.SetEgress(specpb.EgressToProto(egress))
	return nil
}

func (srv *API) putNamespace(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	name := r.PathValue("name")
	if !spec.ValidNamespace(name) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("namespace %q must be a DNS label: lowercase letters, digits and '-', at most 63 characters", name))
		return
	}
	var req NamespaceRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.Quota != nil {
		if err := req.Quota.Validate(); err != nil {
			WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	if req.Egress != nil {
		if err := req.Egress.Validate(); err != nil {
			WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	// One update at a time: what the request leaves out keeps its stored
	// value, which a concurrent update must not overwrite.
	srv.namespaceMu.Lock()
	defer srv.namespaceMu.Unlock()
	rec := &store.Namespace{Name: name, CreatedAt: time.Now().UTC()}
	old, err := srv.namespaceRecord(name)
	if err != nil {
		writeStoreError(w, "reading the namespace: ", err)
		return
	}
	if old != nil {
		rec.Quota, rec.Egress, rec.CreatedAt = old.Quota, old.Egress, old.CreatedAt
	}
	if req.Quota != nil {
		rec.Quota = *req.Quota
	}
	if req.Egress != nil {
		rec.Egress = *req.Egress
	}
	if err := srv.store.PutNamespace(rec); err != nil {
		writeStoreError(w, "storing the namespace: ", err)
		return
	}
	if err := srv.LoadQuotas(); err != nil {
		writeStoreError(w, "loading namespaces: ", err)
		return
	}
	WriteJSON(w, http.StatusOK, NamespaceView{Name: name, Quota: rec.Quota, Egress: rec.Egress, Usage: srv.cluster.Usage(name), CreatedAt: rec.CreatedAt})
}

// namespaceRecord is name's stored record, or nil when it has none.
func (srv *API) namespaceRecord(name string) (*store.Namespace, error) {
	nss, err := srv.store.Namespaces()
	if err != nil {
		return nil, err
	}
	for _, n := range nss {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, nil
}

func (srv *API) listNamespaces(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	nss, err := srv.store.Namespaces()
	if err != nil {
		writeStoreError(w, "reading namespaces: ", err)
		return
	}
	views := map[string]NamespaceView{spec.DefaultNamespace: {Name: spec.DefaultNamespace}}
	for _, n := range nss {
		views[n.Name] = NamespaceView{Name: n.Name, Quota: n.Quota, Egress: n.Egress, CreatedAt: n.CreatedAt}
	}
	out := make([]NamespaceView, 0, len(views))
	for _, name := range slices.Sorted(maps.Keys(views)) {
		v := views[name]
		v.Usage = srv.cluster.Usage(name)
		out = append(out, v)
	}
	WriteJSON(w, http.StatusOK, out)
}

func (srv *API) getNamespace(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !srv.authorize(w, r, auth.ScopeDeploy, name, "") {
		return
	}
	if !srv.namespaceExists(name) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("namespace %q not found", name))
		return
	}
	q, _ := srv.cluster.Quota(name)
	view := NamespaceView{Name: name, Quota: q, Usage: srv.cluster.Usage(name)}
	if rec, err := srv.namespaceRecord(name); err != nil {
		writeStoreError(w, "reading the namespace: ", err)
		return
	} else if rec != nil {
		view.Egress, view.CreatedAt = rec.Egress, rec.CreatedAt
	}
	WriteJSON(w, http.StatusOK, view)
}

func (srv *API) deleteNamespace(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	name := r.PathValue("name")
	// Held until the namespace is gone: a function or a secret admitted
	// meanwhile would outlive it (and belong to a namespace made again
	// under its name).
	srv.secretMu.Lock()
	defer srv.secretMu.Unlock()
	srv.namespaceMu.Lock() // the reload below publishes what the registry has now
	defer srv.namespaceMu.Unlock()
	if n := srv.cluster.Usage(name).Functions; n > 0 && name != spec.DefaultNamespace {
		WriteError(w, http.StatusConflict, fmt.Sprintf("namespace %q still has %d functions: delete them first", name, n))
		return
	}
	if n := srv.namespaceSecrets(name); n > 0 && name != spec.DefaultNamespace {
		WriteError(w, http.StatusConflict, fmt.Sprintf("namespace %q still has %d secrets: delete them first (brisk secret list -n %s)", name, n, name))
		return
	}
	if err := srv.store.DeleteNamespace(name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			WriteError(w, http.StatusNotFound, fmt.Sprintf("namespace %q not found", name))
			return
		}
		writeStoreError(w, "deleting the namespace: ", err)
		return
	}
	if err := srv.LoadQuotas(); err != nil {
		writeStoreError(w, "loading namespaces: ", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

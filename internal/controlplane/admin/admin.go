package admin

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/replica"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The admin API's types are pkg/api's.
type (
	FunctionView     = api.FunctionView
	FunctionStatus   = api.FunctionStatus
	SandboxStatus    = api.SandboxStatus
	StatusView       = api.StatusView
	NodeStatus       = api.NodeStatus
	EmergencyStatus  = api.EmergencyStatus
	DataPlaneStatus  = api.DataPlaneStatus
	FunctionSummary  = api.FunctionSummary
	NamespaceRequest = api.NamespaceRequest
	NamespaceView    = api.NamespaceView
	NamespaceUsage   = api.NamespaceUsage
	TokenRequest     = api.TokenRequest
	TokenView        = api.TokenView
)

// maxSpecBytes bounds an admin request body.
const maxSpecBytes = 1 << 20

// Handler is the admin API as the control plane serves it: requests
// authenticated (tokens, or a trusted proxy's forwarded identity), forged
// identity headers refused.
func (srv *API) Handler() http.Handler {
	return auth.RefuseForged(srv.authenticate(srv.adminHandler()), srv.cfg.AuthDisabled, WriteError)
}

func (srv *API) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/functions", srv.createFunction)
	mux.HandleFunc("POST /v1/code", srv.uploadCode)
	mux.HandleFunc("GET /v1/functions", srv.listFunctions)
	mux.HandleFunc("GET /v1/functions/{name}", srv.getFunction)
	mux.HandleFunc("PUT /v1/functions/{name}", srv.updateFunction)
	mux.HandleFunc("DELETE /v1/functions/{name}", srv.deleteFunction)
	mux.HandleFunc("GET /v1/functions/{name}/logs", srv.functionLogs)
	mux.HandleFunc("GET /v1/functions/{name}/revisions", srv.functionRevisions)
	mux.HandleFunc("POST /v1/functions/{name}/rollback", srv.rollbackFunction)
	mux.HandleFunc("PUT /v1/functions/{name}/traffic", srv.putTraffic)
	mux.HandleFunc("GET /v1/status", srv.status)
	srv.registerDashboard(mux) // GET /v1/dashboard, and the page at /ui/ (dashboard.go)
	mux.HandleFunc("GET /v1/backup", srv.backup)
	mux.HandleFunc("PUT /v1/namespaces/{name}", srv.putNamespace)
	mux.HandleFunc("GET /v1/namespaces", srv.listNamespaces)
	mux.HandleFunc("GET /v1/namespaces/{name}", srv.getNamespace)
	mux.HandleFunc("DELETE /v1/namespaces/{name}", srv.deleteNamespace)
	mux.HandleFunc("POST /v1/secrets", srv.createSecret)
	mux.HandleFunc("GET /v1/secrets", srv.listSecrets)
	mux.HandleFunc("GET /v1/secrets/{name}", srv.getSecret)
	mux.HandleFunc("PUT /v1/secrets/{name}", srv.updateSecret)
	mux.HandleFunc("DELETE /v1/secrets/{name}", srv.deleteSecret)
	mux.HandleFunc("POST /v1/triggers", srv.createTrigger)
	mux.HandleFunc("GET /v1/triggers", srv.listTriggers)
	mux.HandleFunc("GET /v1/triggers/{name}", srv.getTrigger)
	mux.HandleFunc("PUT /v1/triggers/{name}", srv.updateTrigger)
	mux.HandleFunc("DELETE /v1/triggers/{name}", srv.deleteTrigger)
	mux.HandleFunc("POST /v1/triggers/{name}/pause", srv.pauseTrigger)
	mux.HandleFunc("POST /v1/triggers/{name}/resume", srv.resumeTrigger)
	mux.HandleFunc("POST /v1/tokens", srv.createToken)
	mux.HandleFunc("GET /v1/tokens", srv.listTokens)
	mux.HandleFunc("DELETE /v1/tokens/{id}", srv.revokeToken)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	metrics := promhttp.HandlerFor(srv.cfg.Registry, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if srv.authorize(w, r, auth.ScopeAdmin, "", "") {
			metrics.ServeHTTP(w, r)
		}
	})
	if srv.cfg.Replica != nil {
		mux.HandleFunc("GET /v1/replica", func(w http.ResponseWriter, r *http.Request) {
			if srv.authorize(w, r, auth.ScopeDeploy, "", "") {
				WriteJSON(w, http.StatusOK, srv.cfg.Replica())
			}
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	if srv.cfg.VerifyLeader == nil {
		return mux
	}
	return srv.readBarrier(mux)
}

// readBarrier makes a replica confirm it still leads before it answers a
// read of the registry: a leader that was cut off or paused while the
// others elected a new one would otherwise answer from its stale state
// (the partition lab's paused-leader schedule found that). Writes need no
// barrier: they commit through raft or fail. /healthz, /metrics and
// /v1/replica describe this replica, not the registry.
func (srv *API) readBarrier(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case "/healthz", "/metrics", "/v1/replica":
			default:
				if err := srv.cfg.VerifyLeader(); err != nil {
					w.Header().Set("Retry-After", "1")
					w.Header().Set(api.HeaderNotForwarded, "1")
					WriteError(w, http.StatusServiceUnavailable, "this replica no longer leads ("+err.Error()+"); retry")
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// writeStoreError answers a failed registry write: 503 when this replica
// lost leadership meanwhile (the client retries and reaches the new leader),
// 500 otherwise.
func writeStoreError(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, replica.ErrNotLeader) {
		w.Header().Set("Retry-After", "1")
		WriteError(w, http.StatusServiceUnavailable, what+err.Error()+"; retry")
		return
	}
	WriteError(w, http.StatusInternalServerError, what+err.Error())
}

// WriteJSON answers with v, indented for people reading it.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeCompactJSON answers writes (create, update): clients read them by
// program, and indenting was 2 % of a registration's CPU.
func writeCompactJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers with {"error": msg}, as every admin endpoint (and
// the follower's, ha.go) does.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, map[string]string{"error": msg})
}

// readBody reads a request body of at most limit bytes into a buffer of
// its Content-Length when it states one: io.ReadAll grows its buffer from
// 512 bytes, copying as it goes (a registration's spec, a code archive).
// A body over limit fails with *http.MaxBytesError.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= limit {
		buf := make([]byte, n)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	return io.ReadAll(body)
}

// readSpec decodes and validates a spec body; on failure it has answered.
// For an update, pathName is the name in the URL: the body may omit the
// name but must not contradict it.
func (srv *API) readSpec(w http.ResponseWriter, r *http.Request, pathName string) (*spec.Function, bool) {
	body, err := readBody(w, r, maxSpecBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			WriteError(w, http.StatusRequestEntityTooLarge, "function spec larger than 1 MiB")
		} else {
			WriteError(w, http.StatusBadRequest, "reading body: "+err.Error())
		}
		return nil, false
	}
	f, err := spec.Decode(body)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	if pathName != "" && f.Name == "" {
		f.Name = pathName
	}
	if f.Namespace == "" {
		f.Namespace = spec.NameNamespace(f.Name) // NAME.NAMESPACE names its namespace
	}
	if f.Namespace == "" && !srv.cfg.AuthDisabled {
		// A token bound to a namespace deploys there by default.
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		f.Namespace = auth.NamespaceOf(srv.tokens, tok)
	}
	// Names are per namespace: "api" deployed into team-a is api.team-a.
	f.Name = srv.qualify(r, f.Name, f.Namespace)
	if pathName != "" && f.Name != pathName && f.Name != srv.qualify(r, pathName, f.Namespace) {
		WriteError(w, http.StatusBadRequest, "invalid function spec: name: "+quote(f.Name)+" does not match the URL's "+quote(pathName))
		return nil, false
	}
	f.ApplyDefaults()
	if err := f.Validate(); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	if err := srv.cfg.Caps.Check(f); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	if f.Code != nil && !srv.checkCode(w, f.Code) {
		return nil, false
	}
	return f, true
}

// ReservedLabelPrefix starts the function labels that are brisk's own
// marks, e.g. brisk.dev/kubernetes-function, the Function controller's
// mark of ownership (internal/kubernetes/fncontroller).
const ReservedLabelPrefix = "brisk.dev/"

// maySetReservedLabels reports whether the request's token may give f the
// labels under ReservedLabelPrefix it has, old (nil: none) had them
// otherwise: only a token with deploy on every namespace may add, change
// or remove them, as a token limited to a namespace or to functions could
// otherwise forge another component's mark on its own functions. Keeping
// them as they are is allowed to all. On refusal it has answered.
func (srv *API) maySetReservedLabels(w http.ResponseWriter, r *http.Request, f, old *spec.Function) bool {
	if srv.cfg.AuthDisabled {
		return true
	}
	var had map[string]string
	if old != nil {
		had = old.Labels
	}
	var changed []string
	for k, v := range f.Labels {
		if strings.HasPrefix(k, ReservedLabelPrefix) {
			if hv, ok := had[k]; !ok || hv != v {
				changed = append(changed, k)
			}
		}
	}
	for k := range had {
		if _, ok := f.Labels[k]; !ok && strings.HasPrefix(k, ReservedLabelPrefix) {
			changed = append(changed, k)
		}
	}
	if len(changed) == 0 {
		return true
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	if auth.Check(srv.tokens, tok, auth.ScopeDeploy, "", "") == nil {
		return true
	}
	slices.Sort(changed)
	WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s is limited to a namespace or to functions: labels under %s are brisk's (%s); only a token with deploy on every namespace may set or remove them",
		auth.ID(tok), ReservedLabelPrefix, strings.Join(changed, ", ")))
	return false
}

// nameLock serialises admin writes to one function name, so the registry
// and the in-memory state apply them in the same order; different names
// proceed in parallel (and group-commit together).
func (srv *API) nameLock(name string) *sync.Mutex {
	h := fnv.New32a()
	h.Write([]byte(name))
	return &srv.nameLocks[h.Sum32()%uint32(len(srv.nameLocks))]
}

// NextRevision returns a revision above every earlier one, even across
// delete and re-create, so workers never confuse two specs.
func (srv *API) NextRevision() uint64 {
	srv.revMu.Lock()
	defer srv.revMu.Unlock()
	srv.lastRev = max(srv.lastRev+1, uint64(time.Now().UnixNano()))
	return srv.lastRev
}

func (srv *API) NoteRevision(rev uint64) {
	srv.revMu.Lock()
	srv.lastRev = max(srv.lastRev, rev)
	srv.revMu.Unlock()
}

// newUID makes a function's identity (spec.Function.UID): 128 random bits.
func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// mayCreateIn refuses (403) a token limited to functions but to no
// namespace a creation outside the default namespace
// (auth.FunctionsAnywhere).
func (srv *API) mayCreateIn(w http.ResponseWriter, r *http.Request, ns string) bool {
	if srv.cfg.AuthDisabled || ns == spec.DefaultNamespace {
		return true
	}
	tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
	if auth.FunctionsAnywhere(srv.tokens, tok) {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("token %s is limited to functions but not to a namespace: it creates them in %q only (bind a token to namespace %q: brisk token create --namespace %s)",
			auth.ID(tok), spec.DefaultNamespace, ns, ns))
		return false
	}
	return true
}

func (srv *API) createFunction(w http.ResponseWriter, r *http.Request) {
	f, ok := srv.readSpec(w, r, "")
	if !ok || !srv.authorize(w, r, auth.ScopeDeploy, f.Namespace, f.Name) || !srv.mayCreateIn(w, r, reconciler.NamespaceOf(f)) ||
		!srv.mayAddSecrets(w, r, reconciler.NamespaceOf(f), f, nil) || !srv.maySetReservedLabels(w, r, f, nil) {
		return
	}
	srv.secretMu.RLock() // against a namespace's deletion and a secret's
	defer srv.secretMu.RUnlock()
	if !srv.admitToNamespace(w, f, true) || !srv.admitSecrets(w, f) || !srv.checkTraffic(w, r, f, nil) {
		return
	}
	l := srv.nameLock(f.Name)
	l.Lock()
	defer l.Unlock()
	if !srv.admitAnnotationTriggers(w, f) {
		return
	}
	now := time.Now().UTC()
	f.Revision, f.Generation, f.CreatedAt, f.UpdatedAt, f.UID = srv.NextRevision(), 1, now, now, newUID()
	record, err := srv.store.CreateFunction(f)
	if err != nil {
		if errors.Is(err, store.ErrExists) {
			WriteError(w, http.StatusConflict, "function "+quote(f.Name)+" already exists (use PUT to update it)")
			return
		}
		writeStoreError(w, "storing function: ", err)
		return
	}
	srv.ApplyFunction(f)
	srv.syncAnnotationTriggers(f, nil)
	srv.cfg.Functions.Inc()
	w.Header().Set("Location", "/v1/functions/"+f.Name)
	// The stored record is f as writeCompactJSON would encode it: encoding
	// it twice was a tenth of a registration's admin-side cost.
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(append(record, '\n'))
}

func (srv *API) updateFunction(w http.ResponseWriter, r *http.Request) {
	// The body's namespace qualifies a bare name in the path (PUT
	// /v1/functions/api with "namespace": "team-a" is api.team-a's).
	f, ok := srv.readSpec(w, r, srv.pathFunction(r))
	if !ok {
		return
	}
	name := f.Name
	if !srv.authorize(w, r, auth.ScopeDeploy, srv.namespaceOfFn(name), name) || !srv.authorize(w, r, auth.ScopeDeploy, f.Namespace, name) {
		return
	}
	srv.secretMu.RLock() // against a namespace's deletion and a secret's
	defer srv.secretMu.RUnlock()
	if !srv.admitToNamespace(w, f, false) || !srv.admitSecrets(w, f) {
		return
	}
	l := srv.nameLock(name)
	l.Lock()
	defer l.Unlock()
	old := srv.cluster.Spec(name)
	if old == nil {
		WriteError(w, http.StatusNotFound, "function "+quote(name)+" not found")
		return
	}
	if reconciler.NamespaceOf(old) != f.Namespace {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid function spec: namespace: a function cannot move from %q to %q (delete it and create it there)", reconciler.NamespaceOf(old), f.Namespace))
		return
	}
	if !srv.mayAddSecrets(w, r, reconciler.NamespaceOf(f), f, old.Secrets) || !srv.maySetReservedLabels(w, r, f, old) {
		return
	}
	if f.Traffic == nil {
		f.Traffic = old.Traffic // the split is not part of a revision: an update keeps it
	} else if !srv.checkTraffic(w, r, f, old) {
		return
	}
	if !srv.checkPinnedKept(w, old) {
		return
	}
	srv.replaceFunction(w, old, f)
}

// replaceFunction makes f the function's new revision in place of old,
// which goes to its history; the caller holds the name's lock.
func (srv *API) replaceFunction(w http.ResponseWriter, old, f *spec.Function) {
	f.CreatedAt, f.UpdatedAt, f.Revision, f.Generation, f.UID = old.CreatedAt, time.Now().UTC(), srv.NextRevision(), old.Generation+1, old.UID
	if !srv.admitAnnotationTriggers(w, f) {
		return
	}
	if err := srv.store.UpdateFunction(f); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			WriteError(w, http.StatusNotFound, "function "+quote(f.Name)+" not found")
			return
		}
		writeStoreError(w, "storing function: ", err)
		return
	}
	kept := *old
	kept.Traffic = nil // the split is not part of the revision
	if err := srv.store.PutRevision(&kept); err != nil {
		srv.log.Warn("revision history: the replaced revision was not kept", "function", f.Name, "revision", old.Revision, "err", err)
	}
	srv.ApplyFunction(f)
	srv.syncAnnotationTriggers(f, old)
	writeCompactJSON(w, http.StatusOK, f)
}

// functionRevisions answers the function's revisions, newest (the current
// one) first.
func (srv *API) functionRevisions(w http.ResponseWriter, r *http.Request) {
	name := srv.pathFunction(r)
	if !srv.authorize(w, r, auth.ScopeDeploy, srv.namespaceOfFn(name), name) {
		return
	}
	cur, revs, ok := srv.revisionsOf(w, name)
	if !ok {
		return
	}
	out := []*spec.Function{cur}
	for i := len(revs) - 1; i >= 0; i-- {
		out = append(out, revs[i])
	}
	WriteJSON(w, http.StatusOK, out)
}

// revisionsOf returns function name's current spec and its kept earlier
// revisions, oldest first; on failure it has answered.
func (srv *API) revisionsOf(w http.ResponseWriter, name string) (*spec.Function, []*spec.Function, bool) {
	cur := srv.cluster.Spec(name)
	if cur == nil {
		WriteError(w, http.StatusNotFound, "function "+quote(name)+" not found")
		return nil, nil, false
	}
	revs, err := srv.store.Revisions(name)
	if err != nil {
		writeStoreError(w, "reading revisions: ", err)
		return nil, nil, false
	}
	return cur, revs, true
}

// lockForChange takes what changing an existing function's spec holds:
// the secrets' read lock (against a namespace's deletion and a secret's),
// then the name's lock. The returned func releases both.
func (srv *API) lockForChange(name string) (unlock func()) {
	srv.secretMu.RLock()
	l := srv.nameLock(name)
	l.Lock()
	return func() { l.Unlock(); srv.secretMu.RUnlock() }
}

// rollbackFunction makes a kept revision's spec the function's newest
// revision: {"revision": N}, or none for the one before the current.
func (srv *API) rollbackFunction(w http.ResponseWriter, r *http.Request) {
	name := srv.pathFunction(r)
	if !srv.authorize(w, r, auth.ScopeDeploy, srv.namespaceOfFn(name), name) {
		return
	}
	var req api.RollbackRequest
	if r.ContentLength != 0 && !readJSON(w, r, &req) {
		return
	}
	defer srv.lockForChange(name)()
	old, revs, ok := srv.revisionsOf(w, name)
	if !ok {
		return
	}
	var to *spec.Function
	switch {
	case req.Revision == old.Revision || (req.Revision == old.Generation && old.Generation > 0):
		WriteError(w, http.StatusConflict, fmt.Sprintf("revision %d is the current one", req.Revision))
		return
	case req.Revision == 0 && len(revs) > 0:
		to = revs[len(revs)-1]
	default:
		to = revisionIn(revs, req.Revision)
	}
	if to == nil {
		if req.Revision == 0 {
			WriteError(w, http.StatusConflict, "function "+quote(name)+" has no earlier revision")
		} else {
			WriteError(w, http.StatusNotFound, fmt.Sprintf("revision %d of function %q is not kept (brisk fn revisions %s)", req.Revision, name, name))
		}
		return
	}
	f := *to
	f.Traffic = old.Traffic // the split is not part of a revision: a rollback keeps the current one
	if !srv.authorize(w, r, auth.ScopeDeploy, f.Namespace, name) || !srv.admitToNamespace(w, &f, false) || !srv.admitSecrets(w, &f) ||
		!srv.mayAddSecrets(w, r, reconciler.NamespaceOf(&f), &f, old.Secrets) || !srv.maySetReservedLabels(w, r, &f, old) ||
		!srv.checkTraffic(w, r, &f, old) || !srv.checkPinnedKept(w, old) {
		return
	}
	srv.replaceFunction(w, old, &f)
}

func (srv *API) deleteFunction(w http.ResponseWriter, r *http.Request) {
	name := srv.pathFunction(r)
	ns := srv.namespaceOfFn(name)
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, name) {
		return
	}
	l := srv.nameLock(name)
	l.Lock()
	defer l.Unlock()
	code := srv.codeOf(name)
	if err := srv.store.DeleteFunction(name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			WriteError(w, http.StatusNotFound, "function "+quote(name)+" not found")
			return
		}
		writeStoreError(w, "deleting function: ", err)
		return
	}
	srv.cluster.RemoveFunction(name)
	srv.removeSplit(name)
	srv.cfg.Functions.Dec()
	if err := srv.store.DeleteRevisions(name); err != nil {
		srv.log.Warn("revision history of a deleted function not removed", "function", name, "err", err)
	}
	srv.dropUnusedCode(code)
	srv.deleteFunctionTriggers(ns, name)
	w.WriteHeader(http.StatusNoContent)
}

func (srv *API) getFunction(w http.ResponseWriter, r *http.Request) {
	name := srv.pathFunction(r)
	if !srv.authorize(w, r, auth.ScopeDeploy, srv.namespaceOfFn(name), name) {
		return
	}
	v, ok := srv.cluster.FunctionView(name)
	if !ok {
		WriteError(w, http.StatusNotFound, "function "+quote(name)+" not found")
		return
	}
	v.Status.Triggers = srv.functionTriggers(reconciler.NamespaceOf(v.Function), name)
	views := []FunctionView{v}
	srv.cluster.Dash().callsOf(views)
	WriteJSON(w, http.StatusOK, views[0])
}

func (srv *API) listFunctions(w http.ResponseWriter, r *http.Request) {
	// A token limited to a namespace or to functions lists what it may see.
	visible := func(*spec.Function) bool { return true }
	if !srv.cfg.AuthDisabled {
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		if err := auth.HasScope(srv.tokens, tok, auth.ScopeDeploy); err != nil {
			WriteError(w, http.StatusForbidden, "token "+auth.ID(tok)+": its scopes do not allow deploy")
			return
		}
		if auth.Check(srv.tokens, tok, auth.ScopeDeploy, "", "") != nil { // limited: check each function
			visible = func(f *spec.Function) bool {
				return auth.Check(srv.tokens, tok, auth.ScopeDeploy, reconciler.NamespaceOf(f), f.Name) == nil
			}
		}
	}
	q := r.URL.Query()
	sel, err := parseListQuery(q)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	c := srv.cluster
	var out []FunctionView
	c.EachFunction(func(f *spec.Function, st api.FunctionStatus) {
		if f.Name <= sel.after || spec.IsRevisionFunction(f.Name) || !sel.matches(f, st) || !visible(f) {
			return
		}
		out = append(out, FunctionView{Function: f, Status: st})
	})
	if out == nil {
		out = []FunctionView{}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	if sel.limit > 0 && len(out) > sel.limit {
		out = out[:sel.limit]
		w.Header().Set(api.HeaderContinue, base64.RawURLEncoding.EncodeToString([]byte(out[len(out)-1].Name)))
	}
	c.Dash().callsOf(out)
	WriteJSON(w, http.StatusOK, out)
}

// listQuery is a function list's filters and page: GET /v1/functions
// ?namespace=NS&label=k=v,k2&status=S&limit=N&continue=TOKEN.
type listQuery struct {
	namespace string
	labels    map[string]string // "" value: the key must exist
	status    string
	limit     int
	after     string // names up to this one were on earlier pages
}

// ListStatuses are the values of a function list's status filter.
var ListStatuses = []string{"ready", "scaled-to-zero", "ok", reconciler.CondFunctionFailing, reconciler.CondNoCapacity, reconciler.CondQuotaExceeded}

func parseListQuery(q url.Values) (listQuery, error) {
	sel := listQuery{namespace: q.Get("namespace"), status: q.Get("status")}
	if v := q.Get("label"); v != "" {
		sel.labels = map[string]string{}
		for _, term := range strings.Split(v, ",") {
			k, val, _ := strings.Cut(term, "=")
			if k = strings.TrimSpace(k); k == "" {
				return sel, fmt.Errorf("label %q: want key=value or key, comma-separated", v)
			}
			sel.labels[k] = strings.TrimSpace(val)
		}
	}
	if sel.status != "" && !slices.Contains(ListStatuses, sel.status) {
		return sel, fmt.Errorf("status %q is not one of %s", sel.status, strings.Join(ListStatuses, ", "))
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100_000 {
			return sel, fmt.Errorf("limit %q: want 1-100000", v)
		}
		sel.limit = n
	}
	if v := q.Get("continue"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil {
			return sel, fmt.Errorf("continue %q: not a token this API gave", v)
		}
		sel.after = string(b)
	}
	return sel, nil
}

func (sel *listQuery) matches(f *spec.Function, st api.FunctionStatus) bool {
	if sel.namespace != "" && reconciler.NamespaceOf(f) != sel.namespace {
		return false
	}
	for k, v := range sel.labels {
		got, ok := f.Labels[k]
		if !ok || (v != "" && got != v) {
			return false
		}
	}
	switch sel.status {
	case "":
		return true
	case "ready":
		return st.Ready > 0
	case "scaled-to-zero":
		return st.Desired == 0 && st.Ready == 0 && st.Pending == 0
	case "ok":
		return st.Condition == ""
	default:
		return st.Condition == sel.status
	}
}

func (srv *API) status(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeDeploy, "", "") {
		return
	}
	v := StatusView{ControlPlane: srv.cfg.ID, Nodes: srv.cluster.NodeStatus()}
	dps, err := srv.store.DataPlanes()
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	c := srv.cluster
	watching := c.WatchedDataPlanes()
	for _, d := range dps {
		ds := DataPlaneStatus{DataPlane: d, Connected: watching[d.ID], LastReportMs: -1}
		if t, ok := srv.cfg.DataPlaneSeen(d.ID); ok {
			ds.LastReportMs = time.Since(t).Milliseconds()
		}
		v.DataPlanes = append(v.DataPlanes, ds)
	}
	c.EachFunction(func(f *spec.Function, st api.FunctionStatus) {
		v.Functions = append(v.Functions, FunctionSummary{Name: f.Name, Revision: f.Revision,
			Desired: st.Desired, Ready: st.Ready, Pending: st.Pending, Condition: st.Condition, Message: st.Message})
	})
	sort.Slice(v.Functions, func(i, j int) bool { return v.Functions[i].Name < v.Functions[j].Name })
	WriteJSON(w, http.StatusOK, v)
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// backup streams a consistent copy of the registry (registry.db) while the
// control plane keeps serving.
func (srv *API) backup(w http.ResponseWriter, r *http.Request) {
	if !srv.authorize(w, r, auth.ScopeAdmin, "", "") {
		return
	}
	b, ok := srv.store.(store.Backuper)
	if !ok {
		WriteError(w, http.StatusNotImplemented, "this control plane's registry is replicated: back up a stopped replica's --data-dir (raft log and snapshots) instead")
		return
	}
	started := false
	_, err := b.Backup(w, func(n int64) {
		started = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", `attachment; filename="registry.db"`)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	})
	if err != nil && !started {
		writeStoreError(w, "backup: ", err)
	}
	// Failing later leaves the reply short of its Content-Length, which a
	// client sees as an error, not as a whole file.
}

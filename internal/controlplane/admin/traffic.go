package admin

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// A traffic split (spec.Function.Traffic) sends shares of a function's calls
// to earlier revisions. Each pinned revision runs as a function of its own,
// spec.RevisionFunction(NAME, REV), with that revision's spec: its own
// sandboxes, autoscaler and keep-alive, as each Knative revision has its
// own deployment. These revision functions are not in the registry: they
// are derived from the function's record and its revision history whenever
// the function is applied (deploy, update, traffic change, restart), so the
// registry holds one record per function and a restart rebuilds the same
// set. Data planes pick a target per call (internal/dataplane/split.go).

// ApplyFunction hands f to the cluster with the revision functions its
// split needs, and removes the ones it no longer needs. The caller holds
// f's name lock (or is the single-threaded load).
func (srv *API) ApplyFunction(f *spec.Function) {
	want := map[string]bool{}
	var revs []*spec.Function
	for _, t := range f.Traffic {
		if !f.Pins(t) {
			continue
		}
		if revs == nil {
			var err error
			if revs, err = srv.store.Revisions(f.Name); err != nil {
				srv.log.Warn("traffic split: reading revisions failed; its share goes to the current revision", "function", f.Name, "err", err)
				break
			}
		}
		kept := revisionIn(revs, t.Revision)
		if kept == nil {
			srv.log.Warn("traffic split: revision no longer kept; its share goes to the current revision", "function", f.Name, "revision", t.Revision)
			continue
		}
		g := *kept
		// Who may call it is the function's rule now, not the revision's:
		// calls reach it only through the function's split.
		g.Name, g.Namespace, g.Traffic, g.Auth = f.TrafficFunction(t), f.Namespace, nil, f.Auth
		want[g.Name] = true
		// The revision function first: a data plane learns the target
		// before the split that names it.
		if cur := srv.cluster.Spec(g.Name); cur == nil || cur.Revision != g.Revision {
			srv.cluster.UpsertFunction(&g)
		}
	}
	srv.cluster.UpsertFunction(f)
	srv.splitMu.Lock()
	old := srv.splits[f.Name]
	if len(want) == 0 {
		delete(srv.splits, f.Name)
	} else {
		srv.splits[f.Name] = want
	}
	srv.splitMu.Unlock()
	for name := range old {
		if !want[name] {
			srv.cluster.RemoveFunction(name)
		}
	}
}

// removeSplit removes the revision functions of a deleted function.
func (srv *API) removeSplit(name string) {
	srv.splitMu.Lock()
	old := srv.splits[name]
	delete(srv.splits, name)
	srv.splitMu.Unlock()
	for n := range old {
		srv.cluster.RemoveFunction(n)
	}
}

// checkTraffic admits f's split: every revision it pins is f's current one
// (cur; nil for a new function) or kept in its history in f's namespace,
// passes the checks a rollback to it would (its secrets exist, and the
// caller may give them), and the revision functions it adds fit the
// namespace's function quota. It answers the refusal itself.
func (srv *API) checkTraffic(w http.ResponseWriter, r *http.Request, f, cur *spec.Function) bool {
	if !srv.resolveTraffic(w, f, cur) {
		return false
	}
	if err := spec.ValidateTraffic(f.Traffic); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return false
	}
	var curRev uint64
	var had []string // secrets the function's sandboxes already get
	if cur != nil {
		curRev = cur.Revision
		had = append(had, cur.Secrets...)
		srv.splitMu.Lock()
		for name := range srv.splits[cur.Name] {
			if g := srv.cluster.Spec(name); g != nil {
				had = append(had, g.Secrets...)
			}
		}
		srv.splitMu.Unlock()
	}
	ns := reconciler.NamespaceOf(f)
	var revs []*spec.Function
	added := 0
	for _, t := range f.Traffic {
		if t.Revision == 0 || t.Revision == curRev {
			continue
		}
		if cur == nil {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid function spec: traffic: %s: a new function has no earlier revision (use %s)", t.Name(), spec.Latest))
			return false
		}
		if revs == nil {
			var err error
			if revs, err = srv.store.Revisions(f.Name); err != nil {
				writeStoreError(w, "reading revisions: ", err)
				return false
			}
		}
		kept := revisionIn(revs, t.Revision)
		if kept == nil || reconciler.NamespaceOf(kept) != ns {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid function spec: traffic: revision %d of function %q is not kept (brisk fn revisions %s)", t.Revision, f.Name, f.Name))
			return false
		}
		g := *kept
		if !srv.admitSecrets(w, &g) || !srv.mayAddSecrets(w, r, ns, &g, had) {
			return false
		}
		if srv.cluster.Spec(spec.RevisionFunction(f.Name, t.Revision)) == nil {
			added++
		}
	}
	if added > 0 {
		q, _ := srv.cluster.Quota(ns)
		if n := srv.cluster.Usage(ns).Functions; q.MaxFunctions > 0 && n+added > q.MaxFunctions {
			WriteError(w, http.StatusForbidden, fmt.Sprintf("namespace %q: functions %d is above its quota %d (each revision a split pins runs as a function)", ns, n+added, q.MaxFunctions))
			return false
		}
	}
	f.Traffic = spec.NormalizeTraffic(f.Traffic)
	return true
}

// resolveTraffic turns the targets of f's split that name a revision by
// its generation (rev-3) into that revision's id, and notes each pinned
// target's generation. A number that is neither a kept revision's id nor
// its generation is left for checkTraffic to refuse.
func (srv *API) resolveTraffic(w http.ResponseWriter, f, cur *spec.Function) bool {
	var revs []*spec.Function
	loaded := cur == nil
	for i := range f.Traffic {
		t := &f.Traffic[i]
		if t.Revision == 0 {
			continue
		}
		if cur != nil && (t.Revision == cur.Revision || (t.Revision == cur.Generation && cur.Generation > 0)) {
			t.Revision, t.Generation = cur.Revision, cur.Generation
			continue
		}
		if !loaded {
			var err error
			if revs, err = srv.store.Revisions(f.Name); err != nil {
				writeStoreError(w, "reading revisions: ", err)
				return false
			}
			loaded = true
		}
		if kept := revisionIn(revs, t.Revision); kept != nil {
			t.Revision, t.Generation = kept.Revision, kept.Generation
		}
	}
	return true
}

// checkPinnedKept refuses an update that would push a revision old's split
// pins out of the kept history (the oldest goes once MaxRevisions are
// kept): its share would silently move to the current revision.
func (srv *API) checkPinnedKept(w http.ResponseWriter, old *spec.Function) bool {
	if !slices.ContainsFunc(old.Traffic, old.Pins) {
		return true
	}
	revs, err := srv.store.Revisions(old.Name)
	if err != nil {
		writeStoreError(w, "reading revisions: ", err)
		return false
	}
	if len(revs) < store.MaxRevisions {
		return true
	}
	for _, t := range old.Traffic {
		if t.Revision == revs[0].Revision {
			WriteError(w, http.StatusConflict, fmt.Sprintf("%s, the oldest kept revision, takes %d%% of function %q's calls: another revision would drop it from the history; move its traffic first (brisk fn traffic %s)", t.Name(), t.Percent, old.Name, old.Name))
			return false
		}
	}
	return true
}

// putTraffic sets a function's split: {"traffic": [{"revision": 3,
// "percent": 90}, {"revision": 0, "percent": 10}]}. It makes no revision:
// the split is how calls reach revisions, not part of one. An empty list
// sends everything to the current revision again.
func (srv *API) putTraffic(w http.ResponseWriter, r *http.Request) {
	name := srv.pathFunction(r)
	if !srv.authorize(w, r, auth.ScopeDeploy, srv.namespaceOfFn(name), name) {
		return
	}
	var req api.TrafficRequest
	if !readJSON(w, r, &req) {
		return
	}
	defer srv.lockForChange(name)()
	old := srv.cluster.Spec(name)
	if old == nil || spec.IsRevisionFunction(name) {
		WriteError(w, http.StatusNotFound, "function "+quote(name)+" not found")
		return
	}
	if !srv.authorize(w, r, auth.ScopeDeploy, reconciler.NamespaceOf(old), name) { // it may have moved before the lock
		return
	}
	f := *old
	f.Traffic = req.Traffic
	if !srv.checkTraffic(w, r, &f, old) {
		return
	}
	f.UpdatedAt = time.Now().UTC()
	if err := srv.store.UpdateFunction(&f); err != nil {
		writeStoreError(w, "storing function: ", err)
		return
	}
	srv.ApplyFunction(&f)
	writeCompactJSON(w, http.StatusOK, &f)
}

// revisionIn returns the kept revision whose id is rev, or else whose
// generation is rev, or nil.
func revisionIn(revs []*spec.Function, rev uint64) *spec.Function {
	if i := slices.IndexFunc(revs, func(g *spec.Function) bool { return g.Revision == rev }); i >= 0 {
		return revs[i]
	}
	if i := slices.IndexFunc(revs, func(g *spec.Function) bool { return g.Generation == rev && rev > 0 }); i >= 0 {
		return revs[i]
	}
	return nil
}

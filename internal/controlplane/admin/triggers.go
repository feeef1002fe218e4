package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/reconciler"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/internal/policy/prewarm"
	"github.com/brisk-faas/brisk/internal/trigger"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Triggers (docs/triggers.md) are registry records like secrets, keyed by
// namespace and name. The control plane keeps a copy of them (triggerRecs)
// and, when it has the async queue (Config.Async), runs them with a
// trigger.Runner for as long as it runs: on an HA control plane, only the
// leader does. A trigger is written under its function's name lock, so a
// trigger cannot be created for a function being deleted, and it is
// deleted with its function.

// maxTriggerBody bounds a trigger request: the payload and the rest.
const maxTriggerBody = spec.MaxTriggerPayload + 64<<10

// LoadTriggers reads the registry's triggers and gives them to the runner.
func (srv *API) LoadTriggers() error {
	if srv.cfg.Async != nil && srv.triggers == nil {
		srv.triggers = trigger.New(trigger.Config{Queue: srv.cfg.Async, NATS: srv.cfg.Async.Conn(), Secret: srv.secretValue, Record: srv.recordTick,
			OutboundAllow: srv.cfg.TriggerNATSAllow, Logger: srv.log.With("component", "triggers")})
		if srv.cfg.Registry != nil {
			srv.cfg.Registry.MustRegister(srv.triggers)
		}
	}
	recs, err := srv.store.Triggers()
	if err != nil {
		return err
	}
	srv.triggerMu.Lock()
	defer srv.triggerMu.Unlock()
	srv.triggerRecs = make(map[string]*store.Trigger, len(recs))
	for _, t := range recs {
		srv.triggerRecs[t.Key()] = t
		srv.runTrigger(t)
	}
	srv.refreshPrewarmLocked()
	return nil
}

// recordTick persists the last tick a cron trigger fired (the runner's
// Record).
func (srv *API) recordTick(key string, tick time.Time) error {
	srv.triggerMu.Lock()
	defer srv.triggerMu.Unlock()
	old := srv.triggerRecs[key]
	if old == nil {
		return nil // deleted meanwhile
	}
	rec := *old
	rec.LastTick = tick
	if err := srv.store.UpdateTrigger(&rec); err != nil {
		return err
	}
	srv.triggerRecs[key] = &rec
	return nil
}

// secretValue is a secret's value for the runner (NATS credentials).
func (srv *API) secretValue(ns, name string) ([]byte, bool) {
	s := srv.cluster.Secret(ns, name)
	if s == nil {
		return nil, false
	}
	return s.Value, true
}

func newTriggerUID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// triggerView is a trigger with its status.
func (srv *API) triggerView(t *store.Trigger) api.TriggerView {
	v := api.TriggerView{Trigger: t.Trigger}
	if v.Namespace == "" {
		v.Namespace = spec.DefaultNamespace
	}
	if srv.triggers != nil {
		v.Status = srv.triggers.Status(t.Key())
	} else {
		v.Status = api.TriggerStatus{State: "failing", LastError: "this control plane has no asynchronous queue (--nats): triggers do not fire"}
	}
	if v.Status.LastTick.IsZero() && t.Cron != nil {
		v.Status.LastTick = t.LastTick
	}
	return v
}

// readTrigger decodes and checks a trigger request's body, in the
// namespace it addresses; name, when set, is the URL's, which the body may
// repeat. On failure it has answered.
func (srv *API) readTrigger(w http.ResponseWriter, r *http.Request, name string) (spec.Trigger, bool) {
	var t spec.Trigger
	if !readJSONLimit(w, r, &t, maxTriggerBody) {
		return t, false
	}
	if name != "" {
		if t.Name != "" && t.Name != name {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid trigger: name %q does not match the URL's %q", t.Name, name))
			return t, false
		}
		t.Name = name
	}
	t.Namespace = srv.requestNamespace(r, t.Namespace)
	t.Function = srv.qualify(r, t.Function, t.Namespace)
	if err := t.Validate(); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return t, false
	}
	return t, true
}

func (srv *API) createTrigger(w http.ResponseWriter, r *http.Request) {
	t, ok := srv.readTrigger(w, r, "")
	if !ok {
		return
	}
	ns := t.Namespace
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, t.Function) {
		return
	}
	if srv.cfg.Async == nil {
		WriteError(w, http.StatusNotImplemented, "triggers need the asynchronous queue, which this control plane does not have (brisk controlplane --nats, as the data planes')")
		return
	}
	if !srv.namespaceExists(ns) {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid trigger: namespace %q does not exist", ns))
		return
	}
	l := srv.nameLock(t.Function)
	l.Lock()
	defer l.Unlock()
	f, ok := srv.triggerTarget(w, ns, &t)
	if !ok {
		return
	}
	now := time.Now().UTC()
	t.UID, t.FunctionUID, t.CreatedAt = newTriggerUID(), f.UID, now
	rec := &store.Trigger{Trigger: t, LastTick: now}
	srv.triggerMu.Lock()
	defer srv.triggerMu.Unlock()
	if srv.triggerRecs[rec.Key()] != nil {
		WriteError(w, http.StatusConflict, fmt.Sprintf("trigger %q already exists in namespace %q", t.Name, ns))
		return
	}
	n := 0
	for _, o := range srv.triggerRecs {
		if spec.TriggerNamespace(&o.Trigger) == ns {
			n++
		}
	}
	if n+1 > spec.MaxTriggersPerNamespace {
		WriteError(w, http.StatusForbidden, fmt.Sprintf("namespace %q: triggers %d is above the limit %d", ns, n+1, spec.MaxTriggersPerNamespace))
		return
	}
	if err := srv.store.CreateTrigger(rec); err != nil {
		if errors.Is(err, store.ErrExists) {
			WriteError(w, http.StatusConflict, fmt.Sprintf("trigger %q already exists in namespace %q", t.Name, ns))
			return
		}
		writeStoreError(w, "storing the trigger: ", err)
		return
	}
	srv.triggerRecs[rec.Key()] = rec
	srv.refreshPrewarmLocked(t.Function)
	srv.runTrigger(rec)
	w.Header().Set("Location", "/v1/triggers/"+t.Name+"?namespace="+ns)
	WriteJSON(w, http.StatusCreated, srv.triggerView(rec))
}

// updateTrigger replaces a trigger's spec in place: it keeps its uid (so
// its call ids, and the ticks already fired, stay its own) and its counts;
// a changed source counts its ticks from now.
func (srv *API) updateTrigger(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	t, ok := srv.readTrigger(w, r, name)
	if !ok {
		return
	}
	ns := t.Namespace
	srv.triggerMu.Lock()
	old := srv.triggerRecs[store.TriggerKey(ns, name)]
	srv.triggerMu.Unlock()
	oldFn := ""
	if old != nil {
		oldFn = old.Function
	}
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, oldFn) || !srv.authorize(w, r, auth.ScopeDeploy, ns, t.Function) {
		return
	}
	if old == nil {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("trigger %q not found in namespace %q", name, ns))
		return
	}
	if old.Managed != "" {
		WriteError(w, http.StatusConflict, fmt.Sprintf("trigger %q is made from function %q's annotations: change them instead", name, old.Function))
		return
	}
	l := srv.nameLock(t.Function)
	l.Lock()
	defer l.Unlock()
	f, ok := srv.triggerTarget(w, ns, &t)
	if !ok {
		return
	}
	srv.triggerMu.Lock()
	cur := srv.triggerRecs[old.Key()]
	if cur == nil || cur.UID != old.UID {
		srv.triggerMu.Unlock()
		WriteError(w, http.StatusConflict, fmt.Sprintf("trigger %q changed meanwhile; try again", name))
		return
	}
	t.UID, t.CreatedAt, t.FunctionUID = cur.UID, cur.CreatedAt, f.UID
	rec := &store.Trigger{Trigger: t, LastTick: cur.LastTick}
	if !reflect.DeepEqual(t.Cron, cur.Cron) || !reflect.DeepEqual(t.NATS, cur.NATS) || t.Paused != cur.Paused {
		rec.LastTick = time.Now().UTC() // ticks of the new schedule count from now
	}
	if err := srv.store.UpdateTrigger(rec); err != nil {
		srv.triggerMu.Unlock()
		writeStoreError(w, "storing the trigger: ", err)
		return
	}
	srv.triggerRecs[rec.Key()] = rec
	srv.refreshPrewarmLocked(cur.Function, t.Function)
	srv.triggerMu.Unlock()
	srv.runTrigger(rec)
	WriteJSON(w, http.StatusOK, srv.triggerView(rec))
}

// runTrigger hands rec to the runner (on a control plane that runs
// triggers): it fires from rec's last tick on.
func (srv *API) runTrigger(rec *store.Trigger) {
	if srv.triggers != nil {
		srv.triggers.Put(trigger.Entry{Trigger: rec.Trigger, LastTick: rec.LastTick})
	}
}

// triggerTarget returns the function trigger t of namespace ns calls,
// after checking it is there and so is t's credentials secret; the caller
// holds the function's name lock. On failure it has answered.
func (srv *API) triggerTarget(w http.ResponseWriter, ns string, t *spec.Trigger) (*spec.Function, bool) {
	f := srv.cluster.Spec(t.Function)
	if f == nil || reconciler.NamespaceOf(f) != ns {
		// The same answer for a function of another namespace: names do
		// not leak.
		WriteError(w, http.StatusNotFound, fmt.Sprintf("function %q not found in namespace %q", t.Function, ns))
		return nil, false
	}
	if n := t.NATS; n != nil && n.CredentialsSecret != "" && srv.cluster.Secret(ns, n.CredentialsSecret) == nil {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid trigger: nats.credentials_secret: secret %q not found in namespace %q (brisk secret create %s -n %s)", n.CredentialsSecret, ns, n.CredentialsSecret, ns))
		return nil, false
	}
	return f, true
}

// lookupTrigger finds the trigger a request names and checks the token
// may manage it; on failure it has answered (404 for another tenant's
// trigger too).
func (srv *API) lookupTrigger(w http.ResponseWriter, r *http.Request) (*store.Trigger, bool) {
	name := r.PathValue("name")
	ns := srv.requestNamespace(r, "")
	srv.triggerMu.Lock()
	t := srv.triggerRecs[store.TriggerKey(ns, name)]
	srv.triggerMu.Unlock()
	fn := ""
	if t != nil {
		fn = t.Function
	}
	if !srv.authorize(w, r, auth.ScopeDeploy, ns, fn) {
		return nil, false
	}
	if t == nil {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("trigger %q not found in namespace %q", name, ns))
		return nil, false
	}
	return t, true
}

func (srv *API) getTrigger(w http.ResponseWriter, r *http.Request) {
	if t, ok := srv.lookupTrigger(w, r); ok {
		WriteJSON(w, http.StatusOK, srv.triggerView(t))
	}
}

// listTriggers answers the triggers of ?namespace= (default: the token's
// namespace, or every namespace for a token bound to none), of
// ?function= if given, that the token may manage.
func (srv *API) listTriggers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns := q.Get("namespace")
	fn := q.Get("function")
	visible := func(*store.Trigger) bool { return true }
	if !srv.cfg.AuthDisabled {
		tok, _ := auth.FromHeader(r.Header.Get("Authorization"))
		if ns == "" {
			ns = auth.NamespaceOf(srv.tokens, tok)
		}
		if err := auth.HasScope(srv.tokens, tok, auth.ScopeDeploy); err != nil {
			WriteError(w, http.StatusForbidden, "token "+auth.ID(tok)+": its scopes do not allow deploy")
			return
		}
		visible = func(t *store.Trigger) bool {
			return auth.Check(srv.tokens, tok, auth.ScopeDeploy, spec.TriggerNamespace(&t.Trigger), t.Function) == nil
		}
	}
	if fn != "" && ns != "" {
		fn = srv.qualify(r, fn, ns) // a bare name is the namespace's function
	}
	srv.triggerMu.Lock()
	recs := make([]*store.Trigger, 0, len(srv.triggerRecs))
	for _, t := range srv.triggerRecs {
		if (ns == "" || spec.TriggerNamespace(&t.Trigger) == ns) && (fn == "" || t.Function == fn) && visible(t) {
			recs = append(recs, t)
		}
	}
	srv.triggerMu.Unlock()
	slices.SortFunc(recs, func(a, b *store.Trigger) int { return strings.Compare(a.Key(), b.Key()) })
	out := make([]api.TriggerView, len(recs))
	for i, t := range recs {
		out[i] = srv.triggerView(t)
	}
	WriteJSON(w, http.StatusOK, out)
}

func (srv *API) deleteTrigger(w http.ResponseWriter, r *http.Request) {
	t, ok := srv.lookupTrigger(w, r)
	if !ok {
		return
	}
	srv.triggerMu.Lock()
	err := srv.store.DeleteTrigger(spec.TriggerNamespace(&t.Trigger), t.Name)
	if err == nil || errors.Is(err, store.ErrNotFound) {
		delete(srv.triggerRecs, t.Key())
		srv.refreshPrewarmLocked(t.Function)
	}
	srv.triggerMu.Unlock()
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		writeStoreError(w, "deleting the trigger: ", err)
		return
	}
	if srv.triggers != nil {
		srv.triggers.Remove(t.Key())
	}
	w.WriteHeader(http.StatusNoContent)
}

// pauseTrigger and resumeTrigger set a trigger's Paused; a resumed cron
// trigger's ticks count from the resumption.
func (srv *API) pauseTrigger(w http.ResponseWriter, r *http.Request) {
	srv.setPaused(w, r, true)
}
func (srv *API) resumeTrigger(w http.ResponseWriter, r *http.Request) {
	srv.setPaused(w, r, false)
}

func (srv *API) setPaused(w http.ResponseWriter, r *http.Request, paused bool) {
	t, ok := srv.lookupTrigger(w, r)
	if !ok {
		return
	}
	srv.triggerMu.Lock()
	cur := srv.triggerRecs[t.Key()]
	if cur == nil {
		srv.triggerMu.Unlock()
		WriteError(w, http.StatusNotFound, fmt.Sprintf("trigger %q not found in namespace %q", t.Name, spec.TriggerNamespace(&t.Trigger)))
		return
	}
	rec := *cur
	changed := rec.Paused != paused
	if changed {
		rec.Paused = paused
		if !paused {
			rec.LastTick = time.Now().UTC()
		}
		if err := srv.store.UpdateTrigger(&rec); err != nil {
			srv.triggerMu.Unlock()
			writeStoreError(w, "storing the trigger: ", err)
			return
		}
		srv.triggerRecs[rec.Key()] = &rec
		srv.refreshPrewarmLocked(rec.Function)
	}
	srv.triggerMu.Unlock()
	if changed {
		srv.runTrigger(&rec)
	}
	WriteJSON(w, http.StatusOK, srv.triggerView(&rec))
}

// deleteFunctionTriggers deletes the triggers of a deleted function; the
// caller holds its name lock.
func (srv *API) deleteFunctionTriggers(ns, fn string) {
	srv.triggerMu.Lock()
	var gone []string
	for k, t := range srv.triggerRecs {
		if t.Function != fn || spec.TriggerNamespace(&t.Trigger) != ns {
			continue
		}
		if err := srv.store.DeleteTrigger(ns, t.Name); err != nil && !errors.Is(err, store.ErrNotFound) {
			srv.log.Warn("trigger of a deleted function not deleted", "trigger", k, "err", err)
			continue
		}
		delete(srv.triggerRecs, k)
		gone = append(gone, k)
	}
	srv.refreshPrewarmLocked(fn)
	srv.triggerMu.Unlock()
	for _, k := range gone {
		if srv.triggers != nil {
			srv.triggers.Remove(k)
		}
	}
}

// functionTriggers lists the triggers of function fn of namespace ns.
func (srv *API) functionTriggers(ns, fn string) []api.TriggerRef {
	srv.triggerMu.Lock()
	defer srv.triggerMu.Unlock()
	var out []api.TriggerRef
	for _, t := range srv.triggerRecs {
		if t.Function == fn && spec.TriggerNamespace(&t.Trigger) == ns {
			out = append(out, api.TriggerRef{Name: t.Name, Kind: t.Kind(), Paused: t.Paused})
		}
	}
	slices.SortFunc(out, func(a, b api.TriggerRef) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RunTriggers starts the runner over the loaded triggers until ctx ends.
func (srv *API) RunTriggers(ctx context.Context) {
	if srv.triggers != nil {
		srv.triggers.Run(ctx)
	}
}

// admitAnnotationTriggers checks the triggers f's OpenFaaS connector
// annotations ask for (spec.AnnotationTriggers); the caller holds f's
// name lock. On failure it has answered.
func (srv *API) admitAnnotationTriggers(w http.ResponseWriter, f *spec.Function) bool {
	ts, err := spec.AnnotationTriggers(f)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return false
	}
	if len(ts) == 0 {
		return true
	}
	if srv.cfg.Async == nil {
		WriteError(w, http.StatusNotImplemented, "annotations: topic asks for a trigger, and triggers need the asynchronous queue, which this control plane does not have (brisk controlplane --nats)")
		return false
	}
	srv.triggerMu.Lock()
	defer srv.triggerMu.Unlock()
	for _, t := range ts {
		if o := srv.triggerRecs[store.TriggerKey(reconciler.NamespaceOf(f), t.Name)]; o != nil && (o.Managed != spec.ManagedByAnnotations || o.Function != f.Name) {
			WriteError(w, http.StatusConflict, fmt.Sprintf("annotations: they make trigger %q, and a trigger of that name exists already in namespace %q (brisk trigger delete %s)", t.Name, reconciler.NamespaceOf(f), t.Name))
			return false
		}
	}
	return true
}

// syncAnnotationTriggers makes the triggers f's annotations own what they
// ask for now: new ones created, changed ones replaced, dropped ones
// deleted. old is the spec f replaces (nil for a new function): without a
// topic annotation in either there is nothing to do, which keeps
// registrations away from the triggers' lock. The caller holds f's name
// lock.
func (srv *API) syncAnnotationTriggers(f, old *spec.Function) {
	if f.Annotations[spec.AnnotationTopic] == "" && (old == nil || old.Annotations[spec.AnnotationTopic] == "") {
		return
	}
	want, err := spec.AnnotationTriggers(f)
	if err != nil { // admitted: cannot happen
		srv.log.Warn("annotation triggers", "function", f.Name, "err", err)
		return
	}
	ns := reconciler.NamespaceOf(f)
	wanted := make(map[string]spec.Trigger, len(want))
	for _, t := range want {
		wanted[store.TriggerKey(ns, t.Name)] = t
	}
	srv.triggerMu.Lock()
	var gone []string
	var made []*store.Trigger
	for k, rec := range srv.triggerRecs {
		if rec.Managed != spec.ManagedByAnnotations || rec.Function != f.Name || spec.TriggerNamespace(&rec.Trigger) != ns {
			continue
		}
		if t, ok := wanted[k]; ok && rec.FunctionUID == f.UID && reflect.DeepEqual(t.Cron, rec.Cron) && reflect.DeepEqual(t.NATS, rec.NATS) {
			delete(wanted, k) // unchanged: keeps its ticks
			continue
		}
		if err := srv.store.DeleteTrigger(ns, rec.Name); err != nil && !errors.Is(err, store.ErrNotFound) {
			srv.log.Warn("annotation trigger not deleted", "trigger", k, "err", err)
			continue
		}
		delete(srv.triggerRecs, k)
		gone = append(gone, k)
	}
	now := time.Now().UTC()
	for k, t := range wanted {
		if srv.triggerRecs[k] != nil {
			continue // admitted, so a managed one whose delete failed
		}
		t.UID, t.FunctionUID, t.CreatedAt = newTriggerUID(), f.UID, now
		rec := &store.Trigger{Trigger: t, LastTick: now}
		if err := srv.store.CreateTrigger(rec); err != nil {
			srv.log.Warn("annotation trigger not created", "trigger", k, "err", err)
			continue
		}
		srv.triggerRecs[k] = rec
		made = append(made, rec)
	}
	if len(gone)+len(made) > 0 {
		srv.refreshPrewarmLocked(f.Name)
	}
	srv.triggerMu.Unlock()
	if srv.triggers == nil {
		return
	}
	for _, k := range gone {
		srv.triggers.Remove(k)
	}
	for _, rec := range made {
		srv.runTrigger(rec)
	}
}

// refreshPrewarmLocked gives the autoscaler's forecaster the schedules of
// the active cron triggers of functions fns (every function with a trigger
// when none is named); the caller holds triggerMu.
func (srv *API) refreshPrewarmLocked(fns ...string) {
	if srv.triggers == nil {
		return // they do not fire here
	}
	// Named functions are set even to none (their last cron trigger
	// went); with none named, every function with a trigger (at load).
	scheds := map[string][]prewarm.Ticks{}
	for _, fn := range fns {
		scheds[fn] = nil
	}
	for _, t := range srv.triggerRecs {
		if _, named := scheds[t.Function]; len(fns) > 0 && !named || t.Cron == nil || t.Paused {
			continue
		}
		if s, err := spec.ParseSchedule(t.Cron); err == nil {
			scheds[t.Function] = append(scheds[t.Function], prewarm.Ticks{Schedule: s, From: t.LastTick})
		}
	}
	srv.cluster.SetPrewarmSchedules(scheds)
}

// dashboardTriggers is the dashboard's list: at most limit triggers,
// failing ones first, then by key; and how many there are.
func (srv *API) dashboardTriggers(limit int) ([]api.TriggerView, int) {
	srv.triggerMu.Lock()
	recs := make([]*store.Trigger, 0, len(srv.triggerRecs))
	for _, t := range srv.triggerRecs {
		recs = append(recs, t)
	}
	srv.triggerMu.Unlock()
	out := make([]api.TriggerView, len(recs))
	for i, t := range recs {
		out[i] = srv.triggerView(t)
	}
	slices.SortFunc(out, func(a, b api.TriggerView) int {
		if fa, fb := a.Status.State == "failing", b.Status.State == "failing"; fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out[:min(len(out), limit)], len(out)
}

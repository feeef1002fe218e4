package dataplane

import (
	"cmp"
	"errors"
	"net/http"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Calls of a function whose spec says auth "token" need a token with the
// invoke scope for it (or an admin token), checked here against the grants
// the control plane sends (AuthConfig) before the call reads its body or
// queues. The token is the platform's: it is not passed on to the
// function. A public function's calls, and every call while the control
// plane runs without auth, keep their Authorization header for the
// function's own use.

// applyAuth takes a batch's auth settings, if it carries any.
func (d *DataPlane) applyAuth(a *briskv1.AuthConfig) {
	if a == nil {
		return
	}
	grants := make([]auth.Grant, len(a.GetTokens()))
	for i, t := range a.GetTokens() {
		grants[i] = auth.Grant{ID: t.GetId(), Hash: t.GetHash(), Scopes: t.GetScopes(), Functions: t.GetFunctions(), Namespace: t.GetNamespace(), SigningKey: t.GetSigningKey()}
	}
	d.tokens.Replace(grants)
	d.authOn.Store(a.GetEnabled())
}

// authorize checks a call's Authorization value for fn. It returns the
// failure to answer with (zero: let it in) and whether the header goes on
// to the function.
func authorize[S string | []byte](d *DataPlane, fn *function, conf *fnConf, authz S) (failure, bool) {
	if conf.public || !d.authOn.Load() {
		return failure{}, true
	}
	var err error
	if tok, ok := bearer(authz); ok {
		err = auth.Check(d.tokens, tok, auth.ScopeInvoke, conf.namespace, fn.name)
	} else if tok, ok := auth.FromHeader(string(authz)); ok { // basic auth: rare, may allocate
		err = auth.Check(d.tokens, tok, auth.ScopeInvoke, conf.namespace, fn.name)
	} else {
		err = auth.ErrNoToken
	}
	switch {
	case err == nil:
		return failure{}, false
	case errors.Is(err, auth.ErrForbidden):
		return fail(http.StatusForbidden, reasonForbidden, "function %q: the token may not call it (it needs the invoke scope, for this function)", fn.name), false
	}
	return fail(http.StatusUnauthorized, reasonUnauthorized, "function %q: %v", fn.name, err), false
}

// unknownFunction is the answer to a call of a function this data plane
// does not have: 404, except to a token that could not call a function of
// that name if there were one (bound to another namespace, or limited to
// other functions), which gets the 403 it gets for one that exists, so
// that a tenant learns nothing of another namespace's names.
func (d *DataPlane) unknownFunction(r *http.Request, name string) failure {
	if f := d.foreignName(r, name); f.code != 0 {
		return f
	}
	return fail(http.StatusNotFound, reasonNoFunction, "function %q not found", name)
}

// foreignName is the 403 a call of function name gets, there or not, when
// its token could not call a function of that name; zero otherwise. It is
// answered at once, before any wait for a function about to appear, so
// that not even the time tells.
func (d *DataPlane) foreignName(r *http.Request, name string) failure {
	if !d.authOn.Load() || name == "" {
		return failure{}
	}
	tok, ok := auth.FromHeader(r.Header.Get("Authorization"))
	if !ok {
		return failure{}
	}
	ns := cmp.Or(spec.NameNamespace(name), spec.DefaultNamespace)
	if errors.Is(auth.Check(d.tokens, tok, auth.ScopeInvoke, ns, name), auth.ErrForbidden) {
		return fail(http.StatusForbidden, reasonForbidden, "function %q: the token may not call it (it needs the invoke scope, for this function)", name)
	}
	return failure{}
}

// mayChooseCallID checks a submit that names its call id (X-Call-Id) of
// fn: on a public function only a caller with a token allowed to invoke
// it may, or an anonymous caller could take an id the function's owner
// will use (the owner's submit is then a duplicate of the attacker's call,
// whose result anyone may read by its id). Other functions' callers passed
// authorize already.
func mayChooseCallID[S string | []byte](d *DataPlane, fn *function, conf *fnConf, authz S) failure {
	if !conf.public || !d.authOn.Load() {
		return failure{}
	}
	tok, ok := auth.FromHeader(string(authz)) // a submit naming its id: rare, may allocate
	if ok && auth.Check(d.tokens, tok, auth.ScopeInvoke, conf.namespace, fn.name) == nil {
		return failure{}
	}
	return fail(http.StatusForbidden, reasonForbidden, "function %q: choosing an asynchronous call's id (X-Call-Id) of a public function needs a token that may invoke it; leave X-Call-Id out to get a fresh id", fn.name)
}

// bearer takes the token out of "Bearer <token>" without allocating.
func bearer[S string | []byte](v S) (S, bool) {
	const scheme = "bearer "
	if len(v) <= len(scheme) {
		return v[:0], false
	}
	for i := 0; i < len(scheme); i++ {
		b := v[i]
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if b != scheme[i] {
			return v[:0], false
		}
	}
	rest := v[len(scheme):]
	for len(rest) > 0 && rest[0] == ' ' {
		rest = rest[1:]
	}
	return rest, len(rest) > 0
}

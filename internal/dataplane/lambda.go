package dataplane

import (
	"context"
	"errors"
	"net/http"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/compat/lambda"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// lambdaBackend is the data plane under the AWS Lambda API
// (internal/compat/lambda): its functions, tokens, body budget, invoke
// path and queue.
type lambdaBackend struct{ d *DataPlane }

func lambdaFunction(fn *function) lambda.Function {
	conf := fn.set.Load().Conf
	return lambda.Function{Name: fn.name, Namespace: conf.namespace, Public: conf.public, MemoryMB: conf.memoryMB,
		Timeout: conf.timeout, Revision: conf.revision, Ref: fn}
}

// Lookup takes the names calls take (NAME, NAME.NAMESPACE). An unknown
// one is not found at once, as AWS answers: Lambda clients call functions
// that exist, so the grace other calls get for one registered a moment ago
// (awaitFunction) would only delay the 404.
func (b lambdaBackend) Lookup(name string) (lambda.Function, bool) {
	if fn := b.d.lookupNamed(name); fn != nil {
		return lambdaFunction(fn), true
	}
	return lambda.Function{}, false
}

func (b lambdaBackend) Functions() []lambda.Function {
	var out []lambda.Function
	for name, fn := range b.d.functions() {
		if !spec.IsRevisionFunction(name) {
			out = append(out, lambdaFunction(fn))
		}
	}
	return out
}

func (b lambdaBackend) AuthOn() bool          { return b.d.authOn.Load() }
func (b lambdaBackend) Tokens() *auth.Checker { return b.d.tokens }
func (b lambdaBackend) MaxBody() int64        { return b.d.cfg.MaxBodyBytes }
func (b lambdaBackend) NewID() string         { return newCallID() }

func (b lambdaBackend) Authorize(f lambda.Function, authz string) (int, string) {
	fn := f.Ref.(*function)
	fl, _ := authorize(b.d, fn, fn.set.Load().Conf, authz)
	return fl.code, fl.msg
}

func (b lambdaBackend) ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, func(), error) {
	d := b.d
	body, held, err := d.readAsyncBody(w, r, limit)
	release := func() { d.bodyBudget.give(held) }
	if errors.Is(err, errAsyncBudget) {
		err = lambda.ErrBusy
	}
	return body, release, err
}

// Invoke runs a RequestResponse call through the invoke path (which
// answers function-deleted for one deleted meanwhile); the API checked its
// credentials already.
func (b lambdaBackend) Invoke(r *http.Request, f lambda.Function) lambda.Result {
	d, fn := b.d, f.Ref.(*function)
	rec := &resultRecorder{h: http.Header{}, max: int(d.cfg.MaxBodyBytes)}
	d.invoke(rec, r, route{fn: fn, name: fn.name, byPath: true, rest: "/", checked: true})
	res := rec.result()
	return lambda.Result{Status: res.Status, Header: res.Header, Body: res.Body, Truncated: res.Truncated, PlatformError: res.PlatformError}
}

func (b lambdaBackend) AsyncMaxBody() int64 {
	if b.d.cfg.Async == nil {
		return 0
	}
	return b.d.cfg.Async.MaxBody()
}

func (b lambdaBackend) Enqueue(ctx context.Context, r *http.Request, f lambda.Function, id string, body []byte) (int, bool, string) {
	d, fn := b.d, f.Ref.(*function)
	c := d.asyncCall(r, fn, id, "/", body, false)
	c.Fresh = true // the request id is ours
	fl := d.storeAsync(ctx, c)
	return fl.code, fl.why == reasonQueueFull, fl.msg
}

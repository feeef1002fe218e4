// Package client is the Go SDK for brisk: its admin API (functions,
// status, tokens, namespaces) and its data planes (synchronous and
// asynchronous calls, their status). Its types are pkg/api's and
// pkg/spec's, so other modules can use it.
//
//	c := client.New("127.0.0.1:9090", "127.0.0.1:8080")
//	c.Token = "brisk_..." // brisk token create, or <data-dir>/admin.token
//	_, err := c.Create(ctx, &spec.Function{Name: "hello", Builtin: "trace"})
//	res, err := c.InvokeFunction(ctx, "hello", "POST", []byte(`{"ms": 5}`), nil)
//	id, err := c.InvokeAsync(ctx, "hello", "POST", []byte(`{"ms": 5}`), nil, "")
//	rec, err := c.WaitCall(ctx, id) // its status, attempts and result
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/codezip"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Error is a non-2xx answer from brisk, with the server's message.
type Error struct {
	Status  int
	Message string
	// Reason is a data plane's own error reason (its X-Brisk-Error
	// header: not-found, no-capacity, queue-timeout, ...), when the data
	// plane answered a call itself.
	Reason string
	// NotForwarded: a control-plane replica answered that it acted on
	// nothing and passed nothing on (api.HeaderNotForwarded).
	NotForwarded bool
	// unknown: another replica, tried before, may have applied the
	// request (the client moved on from it).
	unknown bool
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// IsNotFound reports whether err is a 404 from brisk.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// NotApplied reports whether err says for certain that the admin API
// applied nothing: no replica the client tried got the request, or
// answered anything but that it passed nothing on. Such a request, a write
// included, may be sent again. Other errors of a write leave its outcome
// unknown (a timeout after it was sent, or a 503 from a leader that lost
// its term mid-write) unless the status says otherwise (4xx).
func NotApplied(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return !e.unknown && (e.NotForwarded || e.Status/100 == 4)
	}
	var s *sendError
	return errors.As(err, &s) && s.notApplied
}

// IsConflict reports whether err is a 409 from brisk.
func IsConflict(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusConflict
}

// Client talks to one cluster.
type Client struct {
	Admin  string // base URL of the admin API, e.g. http://127.0.0.1:9090
	Invoke string // base URL of a data plane, e.g. http://127.0.0.1:8080
	// Token is sent as "Authorization: Bearer" on every request (brisk
	// token create; a new cluster's admin token is in its data dir's
	// admin.token). A caller's own Authorization header on an invocation
	// wins.
	Token string
	// Authorization, when set, is sent as the Authorization header as is
	// (a caller's own basic or bearer credentials, passed through by a
	// front end); it wins over Token.
	Authorization string
	HTTP          *http.Client
	// Replicas are the admin APIs of an HA control plane's other
	// replicas (base URLs). Admin requests go to the replica that answered
	// last and move to the next one when it cannot serve them (see
	// failover.go for when moving is safe). New fills them from a
	// comma-separated list.
	Replicas []string

	current atomic.Int32 // index in admins() of the replica answering
}

func (c *Client) authorize(req *http.Request) {
	if req.Header.Get("Authorization") != "" {
		return
	}
	switch {
	case c.Authorization != "":
		req.Header.Set("Authorization", c.Authorization)
	case c.Token != "":
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
}

// New returns a client; addresses may omit the scheme. admin may list
// an HA control plane's replicas, comma-separated (Replicas).
func New(admin, invoke string) *Client {
	c := &Client{Invoke: baseURL(invoke), HTTP: &http.Client{Timeout: 10 * time.Minute}}
	if all := splitAdmins(admin); len(all) > 1 {
		c.Admin, c.Replicas = all[0], all[1:]
		c.HTTP.Transport = failoverTransport()
	} else {
		c.Admin = baseURL(admin)
	}
	return c
}

// TrustCA makes the client trust the PEM CA certificates in pemCerts, as
// well as the system's roots, for https:// URLs: a cluster run with
// --tls-generate serves certificates of its CA, <data-dir>/ca.crt. It
// gives c.HTTP a copy of its transport (http.DefaultTransport when nil)
// with the CA set.
func (c *Client) TrustCA(pemCerts []byte) error {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemCerts) {
		return errors.New("client: no PEM certificate in the CA file")
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 10 * time.Minute}
	}
	var tr *http.Transport
	switch t := c.HTTP.Transport.(type) {
	case *http.Transport:
		tr = t.Clone()
	case nil:
		if d, ok := http.DefaultTransport.(*http.Transport); ok {
			tr = d.Clone()
		} else {
			tr = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
		}
	default:
		return errors.New("client: TrustCA needs HTTP.Transport to be nil or an *http.Transport (otherwise set the CA in your transport's TLS configuration)")
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	h := *c.HTTP
	h.Transport = tr
	c.HTTP = &h
	return nil
}

// TrustCAFile is TrustCA with the certificates in a file.
func (c *Client) TrustCAFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("client: CA certificate: %w", err)
	}
	if err := c.TrustCA(b); err != nil {
		return fmt.Errorf("%w %s", err, path)
	}
	return nil
}

func baseURL(a string) string {
	a = strings.TrimRight(a, "/")
	if a != "" && !strings.Contains(a, "://") {
		a = "http://" + a
	}
	return a
}

// do sends in (a value to encode, or JSON already encoded as []byte) to
// the admin API (moving between replicas: failover.go) and decodes the
// reply into out unless out is nil.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	body, err := encodeBody(in)
	if err != nil {
		return err
	}
	ct := ""
	if in != nil {
		ct = "application/json"
	}
	resp, unknown, err := c.sendAdmin(ctx, c.HTTP, method, path, body, ct)
	if err != nil {
		return err
	}
	return decodeReply(resp, unknown, out)
}

// doAt is do against a data plane at base.
func (c *Client) doAt(ctx context.Context, base, what, method, path string, in, out any) error {
	body, err := encodeBody(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the %s at %s: %w", what, base, err)
	}
	return decodeReply(resp, false, out)
}

// encodeBody is a request's body: nil, JSON already encoded, or a value
// to encode.
func encodeBody(in any) ([]byte, error) {
	switch in := in.(type) {
	case nil:
		return nil, nil
	case []byte:
		return in, nil
	default:
		return json.Marshal(in)
	}
}

// decodeReply reads and closes resp, decoding a 2xx reply into out
// (unless nil) and turning any other into an *Error. unknown: an earlier
// attempt of the request may have been applied (sendAdmin).
func decodeReply(resp *http.Response, unknown bool, out any) error {
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		err := replyError(resp.StatusCode, data)
		err.(*Error).NotForwarded = resp.Header.Get(api.HeaderNotForwarded) != ""
		err.(*Error).unknown = unknown
		return err
	}
	if hs, ok := out.(interface{ setHeader(http.Header) }); ok {
		hs.setHeader(resp.Header)
	}
	if out != nil && len(data) > 0 {
		return json.Unmarshal(data, out)
	}
	return nil
}

func replyError(status int, data []byte) error {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(data))
	}
	return &Error{Status: status, Message: e.Error}
}

// Backup writes a consistent copy of the control plane's registry (a
// registry.db) to w and returns its size; a reply cut short is an error.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	resp, _, err := c.sendAdmin(ctx, c.HTTP, http.MethodGet, "/v1/backup", nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return 0, replyError(resp.StatusCode, data)
	}
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return n, fmt.Errorf("backup: %w", err)
	}
	return n, nil
}

// Create registers a new function.
func (c *Client) Create(ctx context.Context, f *spec.Function) (*spec.Function, error) {
	var out spec.Function
	return &out, c.do(ctx, http.MethodPost, "/v1/functions", f, &out)
}

// UploadCode stores a zip archive of a function's source (at most
// spec.MaxCodeBytes) and returns its digest, which a spec's code.digest
// names (spec.Code). Uploading the same archive again changes nothing.
func (c *Client) UploadCode(ctx context.Context, zip []byte) (*api.CodeUpload, error) {
	var out api.CodeUpload
	return &out, c.do(ctx, http.MethodPost, "/v1/code", zip, &out)
}

// ZipCode packs a directory of source (regular files; __pycache__ and
// .git left out) into an archive for UploadCode, the same tree always
// into the same bytes.
func ZipCode(dir string) ([]byte, error) { return codezip.Zip(dir) }

// CreateJSON registers a new function from its JSON spec and, unlike
// Create, does not decode the stored spec the control plane answers with:
// for callers that register many functions and need only the outcome.
func (c *Client) CreateJSON(ctx context.Context, spec []byte) error {
	return c.do(ctx, http.MethodPost, "/v1/functions", spec, nil)
}

// Update replaces a function's spec (a new revision).
func (c *Client) Update(ctx context.Context, f *spec.Function) (*spec.Function, error) {
	var out spec.Function
	return &out, c.do(ctx, http.MethodPut, "/v1/functions/"+f.Name, f, &out)
}

// Get returns a function with its scaling status.
func (c *Client) Get(ctx context.Context, name string) (*api.FunctionView, error) {
	var out api.FunctionView
	return &out, c.do(ctx, http.MethodGet, "/v1/functions/"+name, nil, &out)
}

// List returns every function.
func (c *Client) List(ctx context.Context) ([]api.FunctionView, error) {
	var out []api.FunctionView
	return out, c.do(ctx, http.MethodGet, "/v1/functions", nil, &out)
}

// ListOptions select and page a function list; zero fields select all.
type ListOptions struct {
	Namespace string
	// Labels: "key=value" or "key" (present) terms, comma-separated; all
	// must match.
	Labels string
	// Status: ready, scaled-to-zero, ok (no condition), or a condition:
	// function-failing, no-capacity, quota-exceeded.
	Status string
	// Limit bounds the page (0: everything); Continue is the token of the
	// page before (ListPage's next).
	Limit    int
	Continue string
}

// ListPage returns one page of the functions opts selects, by name, and
// the token of the next page ("" after the last).
func (c *Client) ListPage(ctx context.Context, opts ListOptions) (fns []api.FunctionView, next string, err error) {
	q := url.Values{}
	for k, v := range map[string]string{"namespace": opts.Namespace, "label": opts.Labels, "status": opts.Status, "continue": opts.Continue} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	path := "/v1/functions"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	p := &page{items: &fns}
	err = c.do(ctx, http.MethodGet, path, nil, p)
	return fns, p.next, err
}

// page decodes a list and keeps its next-page token.
type page struct {
	items *[]api.FunctionView
	next  string
}

func (p *page) UnmarshalJSON(b []byte) error { return json.Unmarshal(b, p.items) }

func (p *page) setHeader(h http.Header) { p.next = h.Get(api.HeaderContinue) }

// Delete removes a function and its sandboxes.
func (c *Client) Delete(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/functions/"+name, nil, nil)
}

// Status returns the cluster overview.
func (c *Client) Status(ctx context.Context) (*api.StatusView, error) {
	var out api.StatusView
	return &out, c.do(ctx, http.MethodGet, "/v1/status", nil, &out)
}

// Result is one invocation's outcome.
type Result struct {
	Status   int
	Header   http.Header
	Body     []byte
	Duration time.Duration
}

// InvokeFunction calls a function synchronously through the data plane.
// The function's own answer, whatever its status, is a Result and a nil
// error; an answer of the data plane itself (no such function, no
// capacity, a timeout: it carries X-Brisk-Error) is the Result and an
// *Error with its Reason, as InvokeAsync's refusals are.
func (c *Client) InvokeFunction(ctx context.Context, name, method string, body []byte, header http.Header) (*Result, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Invoke+"/function/"+name, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	c.authorize(req)
	start := time.Now()
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the data plane at %s: %w", c.Invoke, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	res := &Result{Status: resp.StatusCode, Header: resp.Header, Body: data, Duration: time.Since(start)}
	if why := resp.Header.Get("X-Brisk-Error"); why != "" {
		e := replyError(resp.StatusCode, data).(*Error)
		e.Reason = why
		return res, e
	}
	return res, nil
}

// CreateToken makes an API token (admin scope needed); the answer's Token
// is its secret, shown this once.
func (c *Client) CreateToken(ctx context.Context, req api.TokenRequest) (*api.TokenView, error) {
	var out api.TokenView
	err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &out)
	return &out, err
}

// Tokens lists the API tokens (never their secrets).
func (c *Client) Tokens(ctx context.Context) ([]api.TokenView, error) {
	var out []api.TokenView
	err := c.do(ctx, http.MethodGet, "/v1/tokens", nil, &out)
	return out, err
}

// RevokeToken deletes a token by id; it stops working at once.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// PutNamespace creates a namespace or replaces its quota (admin scope).
func (c *Client) PutNamespace(ctx context.Context, name string, q spec.Quota) (*api.NamespaceView, error) {
	return c.SetNamespace(ctx, name, api.NamespaceRequest{Quota: &q})
}

// SetNamespace creates or updates a namespace: its quota and its egress
// policy, each when set in req (nil keeps the current one).
func (c *Client) SetNamespace(ctx context.Context, name string, req api.NamespaceRequest) (*api.NamespaceView, error) {
	var out api.NamespaceView
	err := c.do(ctx, http.MethodPut, "/v1/namespaces/"+url.PathEscape(name), req, &out)
	return &out, err
}

// Namespace gets one namespace with its quota, egress policy and use.
func (c *Client) Namespace(ctx context.Context, name string) (*api.NamespaceView, error) {
	var out api.NamespaceView
	err := c.do(ctx, http.MethodGet, "/v1/namespaces/"+url.PathEscape(name), nil, &out)
	return &out, err
}

// Namespaces lists the namespaces with their quotas and use.
func (c *Client) Namespaces(ctx context.Context) ([]api.NamespaceView, error) {
	var out []api.NamespaceView
	err := c.do(ctx, http.MethodGet, "/v1/namespaces", nil, &out)
	return out, err
}

// DeleteNamespace deletes an empty namespace.
func (c *Client) DeleteNamespace(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/namespaces/"+url.PathEscape(name), nil, nil)
}

// CreateSecret stores a new secret in req.Namespace ("" = the token's or
// the default namespace); it is an error if the name is taken there.
func (c *Client) CreateSecret(ctx context.Context, req api.SecretRequest) (*api.SecretView, error) {
	var out api.SecretView
	err := c.do(ctx, http.MethodPost, "/v1/secrets", req, &out)
	return &out, err
}

// UpdateSecret replaces the value of an existing secret. Sandboxes started
// from then on see the new value; redeploy a function to roll its others.
func (c *Client) UpdateSecret(ctx context.Context, req api.SecretRequest) (*api.SecretView, error) {
	var out api.SecretView
	err := c.do(ctx, http.MethodPut, "/v1/secrets/"+url.PathEscape(req.Name)+nsQuery(req.Namespace), req, &out)
	return &out, err
}

// Secrets lists the secrets of namespace ("" = every namespace the token
// sees), never their values.
func (c *Client) Secrets(ctx context.Context, namespace string) ([]api.SecretView, error) {
	var out []api.SecretView
	err := c.do(ctx, http.MethodGet, "/v1/secrets"+nsQuery(namespace), nil, &out)
	return out, err
}

// DeleteSecret deletes a secret no function uses.
func (c *Client) DeleteSecret(ctx context.Context, namespace, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name)+nsQuery(namespace), nil, nil)
}

// CreateTrigger creates a trigger (docs/triggers.md) in t.Namespace ("" =
// the token's or the default namespace) for a function of that namespace.
func (c *Client) CreateTrigger(ctx context.Context, t spec.Trigger) (*api.TriggerView, error) {
	var out api.TriggerView
	err := c.do(ctx, http.MethodPost, "/v1/triggers", t, &out)
	return &out, err
}

// Triggers lists the triggers of namespace ("" = every namespace the token
// sees), of function fn only when fn is not "".
func (c *Client) Triggers(ctx context.Context, namespace, fn string) ([]api.TriggerView, error) {
	q := url.Values{}
	if namespace != "" {
		q.Set("namespace", namespace)
	}
	if fn != "" {
		q.Set("function", fn)
	}
	path := "/v1/triggers"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []api.TriggerView
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// Trigger returns one trigger with its status.
func (c *Client) Trigger(ctx context.Context, namespace, name string) (*api.TriggerView, error) {
	var out api.TriggerView
	err := c.do(ctx, http.MethodGet, "/v1/triggers/"+url.PathEscape(name)+nsQuery(namespace), nil, &out)
	return &out, err
}

// UpdateTrigger replaces a trigger's spec (t.Name names it): it keeps its
// uid and counts; a changed schedule or subject counts from now.
func (c *Client) UpdateTrigger(ctx context.Context, t spec.Trigger) (*api.TriggerView, error) {
	var out api.TriggerView
	err := c.do(ctx, http.MethodPut, "/v1/triggers/"+url.PathEscape(t.Name)+nsQuery(t.Namespace), t, &out)
	return &out, err
}

// DeleteTrigger deletes a trigger (a JetStream trigger's durable consumer
// with it).
func (c *Client) DeleteTrigger(ctx context.Context, namespace, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/triggers/"+url.PathEscape(name)+nsQuery(namespace), nil, nil)
}

// PauseTrigger stops a trigger firing until ResumeTrigger; a resumed cron
// trigger fires from its next tick on.
func (c *Client) PauseTrigger(ctx context.Context, namespace, name string) (*api.TriggerView, error) {
	var out api.TriggerView
	err := c.do(ctx, http.MethodPost, "/v1/triggers/"+url.PathEscape(name)+"/pause"+nsQuery(namespace), nil, &out)
	return &out, err
}

// ResumeTrigger undoes PauseTrigger.
func (c *Client) ResumeTrigger(ctx context.Context, namespace, name string) (*api.TriggerView, error) {
	var out api.TriggerView
	err := c.do(ctx, http.MethodPost, "/v1/triggers/"+url.PathEscape(name)+"/resume"+nsQuery(namespace), nil, &out)
	return &out, err
}

func nsQuery(ns string) string {
	if ns == "" {
		return ""
	}
	return "?namespace=" + url.QueryEscape(ns)
}

// Revisions returns a function's revisions, the current one first, then
// the kept earlier ones, newest first.
func (c *Client) Revisions(ctx context.Context, name string) ([]*spec.Function, error) {
	var out []*spec.Function
	err := c.do(ctx, http.MethodGet, "/v1/functions/"+url.PathEscape(name)+"/revisions", nil, &out)
	return out, err
}

// SetTraffic sets how a function's calls are split between its revisions
// (nil: all to the current one); it makes no revision.
func (c *Client) SetTraffic(ctx context.Context, name string, ts []spec.TrafficTarget) (*spec.Function, error) {
	var out spec.Function
	if ts == nil {
		ts = []spec.TrafficTarget{}
	}
	err := c.do(ctx, http.MethodPut, "/v1/functions/"+url.PathEscape(name)+"/traffic", api.TrafficRequest{Traffic: ts}, &out)
	return &out, err
}

// Rollback makes revision rev of a function (0: the one before the
// current) its newest revision again, and returns that.
func (c *Client) Rollback(ctx context.Context, name string, rev uint64) (*spec.Function, error) {
	var out spec.Function
	err := c.do(ctx, http.MethodPost, "/v1/functions/"+url.PathEscape(name)+"/rollback", api.RollbackRequest{Revision: rev}, &out)
	return &out, err
}

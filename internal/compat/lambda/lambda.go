// Package lambda serves the AWS Lambda Invoke API over a brisk data plane
// (POST /2015-03-31/functions/NAME/invocations), so that boto3, the aws CLI
// and the AWS SDKs call brisk functions unmodified: RequestResponse through
// the data plane's invoke path, Event through its asynchronous queue,
// DryRun as a check; GetFunction and ListFunctions. Calls are signed with
// SigV4 by a token's AWS credentials (brisk token aws); a bearer token
// works too. brisk has no versions or aliases yet: a qualifier other than
// $LATEST is not found. The data plane gives a Backend.
package lambda

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/naming"
)

// Prefix starts the API's function routes; ListFunctions is Prefix less
// its last slash.
const Prefix = "/2015-03-31/functions/"

// Function is what the API shows of a function and checks on a call.
type Function struct {
	Name, Namespace string
	Public          bool
	MemoryMB        int64
	Timeout         time.Duration
	Revision        uint64
	// Ref is the backend's own handle on the function, given back to its
	// Authorize, Invoke and Enqueue so that they need not look it up again.
	Ref any
}

// Result is a RequestResponse call's outcome through the invoke path.
type Result struct {
	Status    int
	Header    http.Header
	Body      []byte
	Truncated bool // over MaxBody
	// PlatformError is brisk's reason when brisk, not the function,
	// answered (X-Brisk-Error: function-timeout, queue-full, ...).
	PlatformError string
}

// ErrBusy: the data plane holds as many request bodies as it may.
var ErrBusy = errors.New("the data plane holds as many request bodies as it may (its body buffer budget); try again later")

// Backend is the data plane under the API.
type Backend interface {
	// Lookup finds the function a call names (NAME, or NAME.NAMESPACE).
	Lookup(name string) (Function, bool)
	// Functions lists the functions (not revision targets).
	Functions() []Function
	// AuthOn says calls need credentials; Tokens are the tokens checked.
	AuthOn() bool
	Tokens() *auth.Checker
	// Authorize checks a bearer or basic token for invoking fn: 0 when it
	// may, else the status (401, 403) and why.
	Authorize(fn Function, authz string) (code int, msg string)
	// ReadBody reads a call's body within limit and the data plane's body
	// budget (ErrBusy past it); release gives the budget back.
	ReadBody(w http.ResponseWriter, r *http.Request, limit int64) (body []byte, release func(), err error)
	// MaxBody bounds a synchronous call's body and reply.
	MaxBody() int64
	// Invoke runs r through the invoke path as a call of fn.
	Invoke(r *http.Request, fn Function) Result
	// Enqueue stores an Event call of fn under id. queueFull: the queue is
	// at its bounds. AsyncMaxBody is 0 without a queue.
	Enqueue(ctx context.Context, r *http.Request, fn Function, id string, body []byte) (code int, queueFull bool, msg string)
	AsyncMaxBody() int64
	// NewID is a fresh request (call) id.
	NewID() string
}

// API serves the routes over a Backend.
type API struct{ b Backend }

// New makes the API over b.
func New(b Backend) *API { return &API{b: b} }

var hdrJSON = []string{"application/json"}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header()["Content-Type"] = hdrJSON
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// lambdaError answers an API error the way Lambda does: the type in
// X-Amzn-ErrorType (the clients raise it by that name), a JSON message.
func apiError(w http.ResponseWriter, reqID string, code int, typ, format string, args ...any) {
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h["X-Amzn-Errortype"] = []string{typ}
	h["X-Amzn-Requestid"] = []string{reqID}
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]string{"Type": "User", "message": fmt.Sprintf(format, args...)})
	_, _ = w.Write(b)
}

// lambdaName parses a function name as the API takes it: NAME, NAME:QUAL,
// a partial ARN (ACCOUNT:function:NAME[:QUAL]) or a full one
// (arn:aws:lambda:REGION:ACCOUNT:function:NAME[:QUAL]).
func parseName(s string) (name, qual string, ok bool) {
	if i := strings.Index(s, "function:"); i >= 0 && (strings.HasPrefix(s, "arn:") || strings.Count(s[:i], ":") == 1) {
		s = s[i+len("function:"):]
	} else if strings.HasPrefix(s, "arn:") {
		return "", "", false
	}
	name, qual, _ = strings.Cut(s, ":")
	return name, qual, name != "" && !strings.Contains(qual, ":")
}

// Serve answers the API's routes; false: r is not one of them.
func (a *API) Serve(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		if r.URL.Path != strings.TrimSuffix(Prefix, "/") { // ListFunctions' path
			return false
		}
		rest = ""
	}
	b := a.b
	reqID := b.NewID()
	target, action, _ := strings.Cut(rest, "/")
	switch {
	case r.Method == http.MethodGet && target == "":
		a.list(w, r, reqID)
		return true
	case r.Method == http.MethodGet && action == "":
		a.get(w, r, reqID, target)
		return true
	case action != "invocations" || r.Method != http.MethodPost:
		apiError(w, reqID, http.StatusNotFound, "UnknownOperationException", "brisk serves the Lambda API's Invoke, GetFunction and ListFunctions only")
		return true
	}
	name, qual, ok := parseName(target)
	if !ok || !naming.NamesFunction(name) {
		apiError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "function name %q: want NAME, NAME:QUALIFIER or a function ARN", target)
		return true
	}
	if q := r.URL.Query().Get("Qualifier"); q != "" {
		if qual != "" && qual != q {
			apiError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "the qualifier in the function name (%s) does not match the Qualifier parameter (%s)", qual, q)
			return true
		}
		qual = q
	}
	// Unknown is 404 at once, as AWS answers: Lambda clients call functions
	// that exist (after `brisk fn deploy --wait`, or CreateFunction and its
	// Active state on AWS), so the grace other calls get for a function
	// registered a moment ago (awaitFunction) would only delay the 404.
	fn, found := b.Lookup(name)
	if !found || (qual != "" && qual != "$LATEST") {
		apiError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s%s (brisk has no versions or aliases yet: use $LATEST)", name, qualSuffix(qual))
		return true
	}
	if r.ContentLength > b.MaxBody() {
		apiError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for the InvokeFunction operation", b.MaxBody())
		return true
	}
	body, release, err := b.ReadBody(w, r, b.MaxBody()) // charged to the body budget
	defer release()
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			apiError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for the InvokeFunction operation", b.MaxBody())
		case errors.Is(err, ErrBusy):
			apiError(w, reqID, http.StatusTooManyRequests, "TooManyRequestsException", "Rate Exceeded: %v", err)
		default:
			apiError(w, reqID, http.StatusBadRequest, "InvalidRequestContentException", "reading the body: %v", err)
		}
		return true
	}
	// The function as it is now, after the body's upload: deleted, or its
	// access changed, meanwhile.
	if fn, found = b.Lookup(fn.Name); !found {
		apiError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s", name)
		return true
	}
	if !a.authorize(w, r, reqID, fn, body) {
		return true
	}
	switch typ := r.Header.Get("X-Amz-Invocation-Type"); typ {
	case "", "RequestResponse":
		a.invoke(w, r, reqID, fn, body)
	case "Event":
		a.event(w, r, reqID, fn, body)
	case "DryRun":
		w.Header()["X-Amzn-Requestid"] = []string{reqID}
		w.WriteHeader(http.StatusNoContent)
	default:
		apiError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "X-Amz-Invocation-Type %q: want RequestResponse, Event or DryRun", typ)
	}
	return true
}

func qualSuffix(q string) string {
	if q == "" {
		return ""
	}
	return ":" + q
}

// configOf is a function as GetFunction and ListFunctions show it.
func configOf(fn Function, region string) map[string]any {
	return map[string]any{
		"FunctionName": fn.Name,
		"FunctionArn":  "arn:aws:lambda:" + region + ":000000000000:function:" + fn.Name,
		"Runtime":      "provided",
		"PackageType":  "Image",
		"MemorySize":   fn.MemoryMB,
		"Timeout":      int64(fn.Timeout / time.Second),
		"Version":      "$LATEST",
		"State":        "Active",
		"RevisionId":   strconv.FormatUint(fn.Revision, 10),
	}
}

// caller checks a management call's signature (or token) and returns
// what it may see: allows(fn) is nil for a function the token may invoke;
// region is the signature's (us-east-1 without one). It answers and
// returns ok false when the caller is not authenticated.
func (a *API) caller(w http.ResponseWriter, r *http.Request, reqID string) (allows func(Function) bool, region string, ok bool) {
	region = "us-east-1"
	if !a.b.AuthOn() {
		return func(Function) bool { return true }, region, true
	}
	tokens := a.b.Tokens()
	authz := r.Header.Get("Authorization")
	if !auth.IsSigV4(authz) {
		tok, _ := auth.FromHeader(authz)
		if err := auth.HasScope(tokens, tok, auth.ScopeInvoke); err != nil {
			apiError(w, reqID, http.StatusForbidden, "UnrecognizedClientException", "%v", err)
			return nil, "", false
		}
		return func(fn Function) bool {
			return fn.Public || auth.Check(tokens, tok, auth.ScopeInvoke, fn.Namespace, fn.Name) == nil
		}, region, true
	}
	sig, check, ok := a.verifySigV4(w, r, reqID, authz, nil)
	if !ok {
		return nil, "", false
	}
	return func(fn Function) bool {
		return fn.Public || check(auth.ScopeInvoke, fn.Namespace, fn.Name) == nil
	}, sig.Region, true
}

// verifySigV4 checks a SigV4-signed request (body: its whole body) against
// the key of the token it names, and returns that token's grant check; it
// answers and returns false when the signature does not hold.
func (a *API) verifySigV4(w http.ResponseWriter, r *http.Request, reqID, authz string, body []byte) (*auth.SigV4, func(scope, ns, fn string) error, bool) {
	sig, err := auth.ParseSigV4(authz)
	if err != nil {
		apiError(w, reqID, http.StatusBadRequest, "IncompleteSignatureException", "%v", err)
		return nil, nil, false
	}
	key, check, found := a.b.Tokens().SigningKey(sig.KeyID)
	if !found {
		apiError(w, reqID, http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid: access key %q is not a brisk token's (brisk token aws prints a token's keys)", sig.KeyID)
		return nil, nil, false
	}
	if err := sig.Verify(r, body, key, time.Now()); err != nil {
		typ := "InvalidSignatureException"
		if errors.Is(err, auth.ErrSigV4Malformed) {
			typ = "IncompleteSignatureException"
		}
		apiError(w, reqID, http.StatusForbidden, typ, "%v", err)
		return nil, nil, false
	}
	return sig, check, true
}

// list answers ListFunctions: the functions the caller may invoke.
func (a *API) list(w http.ResponseWriter, r *http.Request, reqID string) {
	allows, region, ok := a.caller(w, r, reqID)
	if !ok {
		return
	}
	// Pages as AWS's: MaxItems (1-10,000, default 50) functions after
	// Marker, the NextMarker of the page before (here the last name it
	// had: opaque to clients).
	q := r.URL.Query()
	limit := 50
	if v := q.Get("MaxItems"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10_000 {
			apiError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "MaxItems %q: want 1 to 10000", v)
			return
		}
		limit = n
	}
	marker := q.Get("Marker")
	var names []string
	fnOf := map[string]Function{}
	for _, fn := range a.b.Functions() {
		if name := fn.Name; name > marker && allows(fn) {
			names = append(names, name)
			fnOf[name] = fn
		}
	}
	slices.Sort(names)
	out := map[string]any{}
	if len(names) > limit {
		names = names[:limit]
		out["NextMarker"] = names[limit-1]
	}
	fns := make([]map[string]any, 0, len(names))
	for _, name := range names {
		fns = append(fns, configOf(fnOf[name], region))
	}
	out["Functions"] = fns
	w.Header()["X-Amzn-Requestid"] = []string{reqID}
	writeJSON(w, http.StatusOK, out)
}

// get answers GetFunction.
func (a *API) get(w http.ResponseWriter, r *http.Request, reqID, target string) {
	allows, region, ok := a.caller(w, r, reqID)
	if !ok {
		return
	}
	name, qual, valid := parseName(target)
	fn, found := a.b.Lookup(name)
	if !valid || !found || (qual != "" && qual != "$LATEST") || !allows(fn) {
		apiError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s", target)
		return
	}
	w.Header()["X-Amzn-Requestid"] = []string{reqID}
	writeJSON(w, http.StatusOK, map[string]any{"Configuration": configOf(fn, region), "Code": map[string]string{"RepositoryType": "brisk"}})
}

// authorize checks the call's SigV4 signature (or a brisk token) for the
// invoke scope on fn; it answers and returns false when it fails.
func (a *API) authorize(w http.ResponseWriter, r *http.Request, reqID string, fn Function, body []byte) bool {
	if fn.Public || !a.b.AuthOn() {
		return true
	}
	authz := r.Header.Get("Authorization")
	if !auth.IsSigV4(authz) {
		if code, msg := a.b.Authorize(fn, authz); code != 0 {
			typ := "UnrecognizedClientException"
			if code == http.StatusForbidden {
				typ = "AccessDeniedException"
			}
			apiError(w, reqID, code, typ, "%s", msg)
			return false
		}
		return true
	}
	sig, allows, ok := a.verifySigV4(w, r, reqID, authz, body)
	if !ok {
		return false
	}
	if err := allows(auth.ScopeInvoke, fn.Namespace, fn.Name); err != nil {
		apiError(w, reqID, http.StatusForbidden, "AccessDeniedException", "the token of access key %s may not invoke %s (it needs the invoke scope, for this function)", sig.KeyID, fn.Name)
		return false
	}
	return true
}

// request is what the function sees of a Lambda call: a POST to /
// with the payload, less the API's own headers.
func request(r *http.Request, reqID string, body []byte) *http.Request {
	out, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://lambda/", bytes.NewReader(body))
	for k, v := range r.Header {
		if strings.HasPrefix(k, "X-Amz-") && k != "X-Amz-Client-Context" || strings.HasPrefix(k, "Amz-Sdk-") || k == "Authorization" {
			continue
		}
		out.Header[k] = v
	}
	out.Header["X-Call-Id"] = []string{reqID}
	out.Host, out.RemoteAddr = r.Host, r.RemoteAddr
	return out
}

// invoke runs a RequestResponse call and answers as Lambda: 200 with
// the function's reply, X-Amz-Function-Error when the function failed, API
// errors when brisk could not run it.
func (a *API) invoke(w http.ResponseWriter, r *http.Request, reqID string, fn Function, body []byte) {
	start := time.Now()
	res := a.b.Invoke(request(r, reqID, body), fn)
	elapsed := time.Since(start)
	if res.Truncated {
		apiError(w, reqID, http.StatusBadGateway, "ResourceLimitExceededException", "the function's reply is over the %d-byte limit of a synchronous call", a.b.MaxBody())
		return
	}
	h := w.Header()
	h["X-Amzn-Requestid"] = []string{reqID}
	h["X-Call-Id"] = []string{reqID}
	h["X-Amz-Executed-Version"] = []string{"$LATEST"}
	if r.Header.Get("X-Amz-Log-Type") == "Tail" {
		h["X-Amz-Log-Result"] = []string{logTail(reqID, elapsed)}
	}
	out := res.Body
	switch res.PlatformError {
	case "":
	case "function-timeout":
		h["X-Amz-Function-Error"] = []string{"Unhandled"}
		out, _ = json.Marshal(map[string]string{"errorType": "Sandbox.Timedout",
			"errorMessage": fmt.Sprintf("%s %s Task timed out after %.2f seconds", time.Now().UTC().Format(time.RFC3339), reqID, fn.Timeout.Seconds())})
		res.Status = http.StatusOK
	case "queue-full", "queue-timeout", "no-capacity", "quota-exceeded":
		apiError(w, reqID, http.StatusTooManyRequests, "TooManyRequestsException", "Rate Exceeded: %s (brisk: %s)", strings.TrimSpace(errorMessage(res.Body)), res.PlatformError)
		return
	case "no-function", "function-deleted":
		apiError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s", fn.Name)
		return
	case "body-too-large":
		apiError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for the InvokeFunction operation", a.b.MaxBody())
		return
	default:
		apiError(w, reqID, http.StatusBadGateway, "ServiceException", "brisk could not run the function: %s (%s)", strings.TrimSpace(errorMessage(res.Body)), res.PlatformError)
		return
	}
	if res.Status >= 400 {
		h["X-Amz-Function-Error"] = []string{"Unhandled"}
		if !json.Valid(out) || !bytes.Contains(out, []byte(`"errorMessage"`)) {
			msg := string(out[:min(len(out), 4096)])
			out, _ = json.Marshal(map[string]any{"errorMessage": msg, "errorType": fmt.Sprintf("HTTP%d", res.Status), "stackTrace": []string{}})
		}
	}
	ct := res.Header.Get("Content-Type")
	if ct == "" || res.Status >= 400 {
		ct = "application/json"
	}
	h["Content-Type"] = []string{ct}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// errorMessage is the message of a brisk error body.
func errorMessage(b []byte) string {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	return string(b)
}

// logTail is X-Amz-Log-Result: Lambda's START/END/REPORT lines. The
// function's own output is not in it (brisk fn logs has it).
func logTail(reqID string, took time.Duration) string {
	ms := float64(took.Microseconds()) / 1000
	s := fmt.Sprintf("START RequestId: %s Version: $LATEST\nEND RequestId: %s\nREPORT RequestId: %s\tDuration: %.2f ms\tBilled Duration: %d ms\n",
		reqID, reqID, reqID, ms, int64(math.Ceil(ms)))
	return base64.StdEncoding.EncodeToString([]byte(s))
}

// event queues an Event call: 202 once stored.
func (a *API) event(w http.ResponseWriter, r *http.Request, reqID string, fn Function, body []byte) {
	limit := a.b.AsyncMaxBody()
	if limit == 0 {
		apiError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "Event invocations need this data plane's asynchronous queue (--nats)")
		return
	}
	if int64(len(body)) > limit {
		apiError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for an Event invocation", limit)
		return
	}
	if code, full, msg := a.b.Enqueue(r.Context(), request(r, reqID, body), fn, reqID, body); code != 0 {
		typ := "ServiceException"
		if full {
			typ, code = "TooManyRequestsException", http.StatusTooManyRequests
		}
		apiError(w, reqID, code, typ, "%s", msg)
		return
	}
	w.Header()["X-Amzn-Requestid"] = []string{reqID}
	w.Header()["X-Call-Id"] = []string{reqID}
	w.WriteHeader(http.StatusAccepted)
}

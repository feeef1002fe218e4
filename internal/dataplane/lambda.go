package dataplane

import (
	"bytes"
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
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The AWS Lambda Invoke API (POST /2015-03-31/functions/NAME/invocations),
// so that boto3, the aws CLI and the AWS SDKs call brisk functions
// unmodified: RequestResponse through the invoke path, Event through the
// asynchronous queue, DryRun as a check. Calls are signed with SigV4 by a
// token's AWS credentials (brisk token aws); a bearer token works too.
// brisk has no versions or aliases yet: a qualifier other than $LATEST is
// not found.

const lambdaPrefix = "/2015-03-31/functions/"

// lambdaError answers an API error the way Lambda does: the type in
// X-Amzn-ErrorType (the clients raise it by that name), a JSON message.
func lambdaError(w http.ResponseWriter, reqID string, code int, typ, format string, args ...any) {
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
func lambdaName(s string) (name, qual string, ok bool) {
	if i := strings.Index(s, "function:"); i >= 0 && (strings.HasPrefix(s, "arn:") || strings.Count(s[:i], ":") == 1) {
		s = s[i+len("function:"):]
	} else if strings.HasPrefix(s, "arn:") {
		return "", "", false
	}
	name, qual, _ = strings.Cut(s, ":")
	return name, qual, name != "" && !strings.Contains(qual, ":")
}

// serveLambda answers the Lambda API's routes; false: not one of them.
func (d *DataPlane) serveLambda(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, lambdaPrefix)
	if !ok {
		if r.URL.Path != strings.TrimSuffix(lambdaPrefix, "/") { // ListFunctions' path
			return false
		}
		rest = ""
	}
	reqID := newCallID()
	target, action, _ := strings.Cut(rest, "/")
	switch {
	case r.Method == http.MethodGet && target == "":
		d.lambdaList(w, r, reqID)
		return true
	case r.Method == http.MethodGet && action == "":
		d.lambdaGet(w, r, reqID, target)
		return true
	case action != "invocations" || r.Method != http.MethodPost:
		lambdaError(w, reqID, http.StatusNotFound, "UnknownOperationException", "brisk serves the Lambda API's Invoke, GetFunction and ListFunctions only")
		return true
	}
	name, qual, ok := lambdaName(target)
	if !ok || !naming.NamesFunction(name) {
		lambdaError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "function name %q: want NAME, NAME:QUALIFIER or a function ARN", target)
		return true
	}
	if q := r.URL.Query().Get("Qualifier"); q != "" {
		if qual != "" && qual != q {
			lambdaError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "the qualifier in the function name (%s) does not match the Qualifier parameter (%s)", qual, q)
			return true
		}
		qual = q
	}
	// Unknown is 404 at once, as AWS answers: Lambda clients call functions
	// that exist (after `brisk fn deploy --wait`, or CreateFunction and its
	// Active state on AWS), so the grace other calls get for a function
	// registered a moment ago (awaitFunction) would only delay the 404.
	fn := d.lookupNamed(name)
	if fn == nil || (qual != "" && qual != "$LATEST") {
		lambdaError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s%s (brisk has no versions or aliases yet: use $LATEST)", name, qualSuffix(qual))
		return true
	}
	if r.ContentLength > d.cfg.MaxBodyBytes {
		lambdaError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for the InvokeFunction operation", d.cfg.MaxBodyBytes)
		return true
	}
	body, held, err := d.readAsyncBody(w, r, d.cfg.MaxBodyBytes) // charged to the body budget
	defer d.bodyBudget.give(held)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			lambdaError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for the InvokeFunction operation", d.cfg.MaxBodyBytes)
		case errors.Is(err, errAsyncBudget):
			lambdaError(w, reqID, http.StatusTooManyRequests, "TooManyRequestsException", "Rate Exceeded: %v", err)
		default:
			lambdaError(w, reqID, http.StatusBadRequest, "InvalidRequestContentException", "reading the body: %v", err)
		}
		return true
	}
	conf := fn.set.Load().conf
	if !d.lambdaAuth(w, r, reqID, fn, conf, body) {
		return true
	}
	switch typ := r.Header.Get("X-Amz-Invocation-Type"); typ {
	case "", "RequestResponse":
		d.lambdaInvoke(w, r, reqID, fn, conf, body)
	case "Event":
		d.lambdaEvent(w, r, reqID, fn, body)
	case "DryRun":
		w.Header()["X-Amzn-Requestid"] = []string{reqID}
		w.WriteHeader(http.StatusNoContent)
	default:
		lambdaError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "X-Amz-Invocation-Type %q: want RequestResponse, Event or DryRun", typ)
	}
	return true
}

func qualSuffix(q string) string {
	if q == "" {
		return ""
	}
	return ":" + q
}

// lambdaConfig is a function as GetFunction and ListFunctions show it.
func lambdaConfig(fn *function, region string) map[string]any {
	conf := fn.set.Load().conf
	return map[string]any{
		"FunctionName": fn.name,
		"FunctionArn":  "arn:aws:lambda:" + region + ":000000000000:function:" + fn.name,
		"Runtime":      "provided",
		"PackageType":  "Image",
		"MemorySize":   conf.memoryMB,
		"Timeout":      int64(conf.timeout / time.Second),
		"Version":      "$LATEST",
		"State":        "Active",
		"RevisionId":   strconv.FormatUint(conf.revision, 10),
	}
}

// lambdaCaller checks a management call's signature (or token) and returns
// what it may see: allows(fn) is nil for a function the token may invoke;
// region is the signature's (us-east-1 without one). It answers and
// returns ok false when the caller is not authenticated.
func (d *DataPlane) lambdaCaller(w http.ResponseWriter, r *http.Request, reqID string) (allows func(*function) bool, region string, ok bool) {
	region = "us-east-1"
	if !d.authOn.Load() {
		return func(*function) bool { return true }, region, true
	}
	authz := r.Header.Get("Authorization")
	if !auth.IsSigV4(authz) {
		tok, _ := auth.FromHeader(authz)
		if err := auth.HasScope(d.tokens, tok, auth.ScopeInvoke); err != nil {
			lambdaError(w, reqID, http.StatusForbidden, "UnrecognizedClientException", "%v", err)
			return nil, "", false
		}
		return func(fn *function) bool {
			c := fn.set.Load().conf
			return c.public || auth.Check(d.tokens, tok, auth.ScopeInvoke, c.namespace, fn.name) == nil
		}, region, true
	}
	sig, check, ok := d.verifySigV4(w, r, reqID, authz, nil)
	if !ok {
		return nil, "", false
	}
	return func(fn *function) bool {
		c := fn.set.Load().conf
		return c.public || check(auth.ScopeInvoke, c.namespace, fn.name) == nil
	}, sig.Region, true
}

// verifySigV4 checks a SigV4-signed request (body: its whole body) against
// the key of the token it names, and returns that token's grant check; it
// answers and returns false when the signature does not hold.
func (d *DataPlane) verifySigV4(w http.ResponseWriter, r *http.Request, reqID, authz string, body []byte) (*auth.SigV4, func(scope, ns, fn string) error, bool) {
	sig, err := auth.ParseSigV4(authz)
	if err != nil {
		lambdaError(w, reqID, http.StatusBadRequest, "IncompleteSignatureException", "%v", err)
		return nil, nil, false
	}
	key, check, found := d.tokens.SigningKey(sig.KeyID)
	if !found {
		lambdaError(w, reqID, http.StatusForbidden, "UnrecognizedClientException", "The security token included in the request is invalid: access key %q is not a brisk token's (brisk token aws prints a token's keys)", sig.KeyID)
		return nil, nil, false
	}
	if err := sig.Verify(r, body, key, time.Now()); err != nil {
		typ := "InvalidSignatureException"
		if errors.Is(err, auth.ErrSigV4Malformed) {
			typ = "IncompleteSignatureException"
		}
		lambdaError(w, reqID, http.StatusForbidden, typ, "%v", err)
		return nil, nil, false
	}
	return sig, check, true
}

// lambdaList answers ListFunctions: the functions the caller may invoke.
func (d *DataPlane) lambdaList(w http.ResponseWriter, r *http.Request, reqID string) {
	allows, region, ok := d.lambdaCaller(w, r, reqID)
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
			lambdaError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "MaxItems %q: want 1 to 10000", v)
			return
		}
		limit = n
	}
	marker := q.Get("Marker")
	var names []string
	fnOf := map[string]*function{}
	for name, fn := range d.functions() {
		if !spec.IsRevisionFunction(name) && name > marker && allows(fn) {
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
		fns = append(fns, lambdaConfig(fnOf[name], region))
	}
	out["Functions"] = fns
	w.Header()["X-Amzn-Requestid"] = []string{reqID}
	writeJSON(w, http.StatusOK, out)
}

// lambdaGet answers GetFunction.
func (d *DataPlane) lambdaGet(w http.ResponseWriter, r *http.Request, reqID, target string) {
	allows, region, ok := d.lambdaCaller(w, r, reqID)
	if !ok {
		return
	}
	name, qual, valid := lambdaName(target)
	fn := d.lookupNamed(name)
	if !valid || fn == nil || (qual != "" && qual != "$LATEST") || !allows(fn) {
		lambdaError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s", target)
		return
	}
	w.Header()["X-Amzn-Requestid"] = []string{reqID}
	writeJSON(w, http.StatusOK, map[string]any{"Configuration": lambdaConfig(fn, region), "Code": map[string]string{"RepositoryType": "brisk"}})
}

// lambdaAuth checks the call's SigV4 signature (or a brisk token) for the
// invoke scope on fn; it answers and returns false when it fails.
func (d *DataPlane) lambdaAuth(w http.ResponseWriter, r *http.Request, reqID string, fn *function, conf *fnConf, body []byte) bool {
	if conf.public || !d.authOn.Load() {
		return true
	}
	authz := r.Header.Get("Authorization")
	if !auth.IsSigV4(authz) {
		if f, _ := authorize(d, fn, conf, authz); f.code != 0 {
			typ := "UnrecognizedClientException"
			if f.code == http.StatusForbidden {
				typ = "AccessDeniedException"
			}
			lambdaError(w, reqID, f.code, typ, "%s", f.msg)
			return false
		}
		return true
	}
	sig, allows, ok := d.verifySigV4(w, r, reqID, authz, body)
	if !ok {
		return false
	}
	if err := allows(auth.ScopeInvoke, conf.namespace, fn.name); err != nil {
		lambdaError(w, reqID, http.StatusForbidden, "AccessDeniedException", "the token of access key %s may not invoke %s (it needs the invoke scope, for this function)", sig.KeyID, fn.name)
		return false
	}
	return true
}

// lambdaRequest is what the function sees of a Lambda call: a POST to /
// with the payload, less the API's own headers.
func lambdaRequest(r *http.Request, reqID string, body []byte) *http.Request {
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

// lambdaInvoke runs a RequestResponse call and answers as Lambda: 200 with
// the function's reply, X-Amz-Function-Error when the function failed, API
// errors when brisk could not run it.
func (d *DataPlane) lambdaInvoke(w http.ResponseWriter, r *http.Request, reqID string, fn *function, conf *fnConf, body []byte) {
	start := time.Now()
	fr := lambdaRequest(r, reqID, body)
	rec := &resultRecorder{h: http.Header{}, max: int(d.cfg.MaxBodyBytes)}
	d.invoke(rec, fr, route{fn: fn, name: fn.name, byPath: true, rest: "/", checked: true})
	res := rec.result()
	elapsed := time.Since(start)
	if res.Truncated {
		lambdaError(w, reqID, http.StatusBadGateway, "ResourceLimitExceededException", "the function's reply is over the %d-byte limit of a synchronous call", d.cfg.MaxBodyBytes)
		return
	}
	h := w.Header()
	h["X-Amzn-Requestid"] = []string{reqID}
	h["X-Call-Id"] = []string{reqID}
	h["X-Amz-Executed-Version"] = []string{"$LATEST"}
	if r.Header.Get("X-Amz-Log-Type") == "Tail" {
		h["X-Amz-Log-Result"] = []string{lambdaLogTail(reqID, elapsed, fn)}
	}
	out := res.Body
	switch res.PlatformError {
	case "":
	case "function-timeout":
		h["X-Amz-Function-Error"] = []string{"Unhandled"}
		out, _ = json.Marshal(map[string]string{"errorType": "Sandbox.Timedout",
			"errorMessage": fmt.Sprintf("%s %s Task timed out after %.2f seconds", time.Now().UTC().Format(time.RFC3339), reqID, conf.timeout.Seconds())})
		res.Status = http.StatusOK
	case "queue-full", "queue-timeout", "no-capacity", "quota-exceeded":
		lambdaError(w, reqID, http.StatusTooManyRequests, "TooManyRequestsException", "Rate Exceeded: %s (brisk: %s)", strings.TrimSpace(errorMessage(res.Body)), res.PlatformError)
		return
	case "no-function", "function-deleted":
		lambdaError(w, reqID, http.StatusNotFound, "ResourceNotFoundException", "Function not found: %s", fn.name)
		return
	case "body-too-large":
		lambdaError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for the InvokeFunction operation", d.cfg.MaxBodyBytes)
		return
	default:
		lambdaError(w, reqID, http.StatusBadGateway, "ServiceException", "brisk could not run the function: %s (%s)", strings.TrimSpace(errorMessage(res.Body)), res.PlatformError)
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
	var e errorBody
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	return string(b)
}

// lambdaLogTail is X-Amz-Log-Result: Lambda's START/END/REPORT lines. The
// function's own output is not in it (brisk fn logs has it).
func lambdaLogTail(reqID string, took time.Duration, fn *function) string {
	ms := float64(took.Microseconds()) / 1000
	s := fmt.Sprintf("START RequestId: %s Version: $LATEST\nEND RequestId: %s\nREPORT RequestId: %s\tDuration: %.2f ms\tBilled Duration: %d ms\n",
		reqID, reqID, reqID, ms, int64(math.Ceil(ms)))
	return base64.StdEncoding.EncodeToString([]byte(s))
}

// lambdaEvent queues an Event call: 202 once stored.
func (d *DataPlane) lambdaEvent(w http.ResponseWriter, r *http.Request, reqID string, fn *function, body []byte) {
	if d.cfg.Async == nil {
		lambdaError(w, reqID, http.StatusBadRequest, "InvalidParameterValueException", "Event invocations need this data plane's asynchronous queue (--nats)")
		return
	}
	if int64(len(body)) > d.cfg.Async.MaxBody() {
		lambdaError(w, reqID, http.StatusRequestEntityTooLarge, "RequestTooLargeException", "Request must be smaller than %d bytes for an Event invocation", d.cfg.Async.MaxBody())
		return
	}
	fr := lambdaRequest(r, reqID, body)
	c := d.asyncCall(fr, fn, reqID, "/", body, false)
	c.Fresh = true // the request id is ours
	if f := d.storeAsync(r.Context(), c); f.code != 0 {
		typ := "ServiceException"
		if f.why == reasonQueueFull {
			typ, f.code = "TooManyRequestsException", http.StatusTooManyRequests
		}
		lambdaError(w, reqID, f.code, typ, "%s", f.msg)
		return
	}
	w.Header()["X-Amzn-Requestid"] = []string{reqID}
	w.Header()["X-Call-Id"] = []string{reqID}
	w.WriteHeader(http.StatusAccepted)
}

package dataplane

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// Every error the data plane itself answers with carries a reason code: in
// the X-Brisk-Error header and the JSON body's "reason". A client (or an
// operator reading logs) can then tell brisk's errors from a function's own
// 502/503/504 and see why the call failed without reading the message.

// errReason is a reason code; errReasonNames has its wire form.
type errReason uint8

const (
	reasonNone             errReason = iota
	reasonNoFunction                 // 404: no such function
	reasonFunctionDeleted            // 404: deleted while the call waited
	reasonBadRequest                 // 400: malformed request or body framing
	reasonBodyTooLarge               // 413
	reasonBodyTooSlow                // 408: a streamed body fell below the minimum rate
	reasonQueueFull                  // 503: the function's queue is at its depth
	reasonQueueTimeout               // 504: no sandbox slot within the queue timeout
	reasonNoCapacity                 // 503/504: the control plane finds no node with room
	reasonFunctionFailing            // 503/504: the function's sandboxes fail to start
	reasonQuotaExceeded              // 504: its namespace's quota has no room for a sandbox
	reasonSandboxFailed              // 502: the sandbox refused, reset or broke its reply
	reasonFunctionTimeout            // 504: the function ran past its timeout
	reasonShuttingDown               // 503: the data plane is draining
	reasonUnauthorized               // 401: no valid token for a function that needs one
	reasonForbidden                  // 403: the token may not call this function
	reasonAsyncDisabled              // 501: no async queue configured
	reasonAsyncUnavailable           // 503: the async queue failed to store or answer
	reasonNoCall                     // 404: no such asynchronous call
	reasonCallIDTaken                // 409: the call id names another function's asynchronous call
	nReasons
)

var errReasonNames = [nReasons]string{
	reasonNone:             "",
	reasonNoFunction:       "no-function",
	reasonFunctionDeleted:  "function-deleted",
	reasonBadRequest:       "bad-request",
	reasonBodyTooLarge:     "body-too-large",
	reasonBodyTooSlow:      "body-too-slow",
	reasonQueueFull:        "queue-full",
	reasonQueueTimeout:     "queue-timeout",
	reasonNoCapacity:       "no-capacity",
	reasonFunctionFailing:  "function-failing",
	reasonQuotaExceeded:    "quota-exceeded",
	reasonSandboxFailed:    "sandbox-failed",
	reasonFunctionTimeout:  "function-timeout",
	reasonShuttingDown:     "shutting-down",
	reasonUnauthorized:     "unauthorized",
	reasonForbidden:        "forbidden",
	reasonAsyncDisabled:    "async-disabled",
	reasonAsyncUnavailable: "async-unavailable",
	reasonNoCall:           "no-call",
	reasonCallIDTaken:      "call-id-taken",
}

func (r errReason) String() string { return errReasonNames[r] }

// reasonOf maps a control plane's function condition (FunctionStatus's
// reason) to the data plane's code; unknown ones count as none.
func reasonOf(cond string) errReason {
	for r, name := range errReasonNames {
		if name == cond && name != "" {
			return errReason(r)
		}
	}
	return reasonNone
}

// failure is a brisk-generated answer: status, reason, message. The zero
// value means no failure.
type failure struct {
	code int
	why  errReason
	msg  string
}

func fail(code int, why errReason, format string, args ...any) failure {
	return failure{code: code, why: why, msg: fmt.Sprintf(format, args...)}
}

// errorBody is a brisk-generated error's JSON.
type errorBody struct {
	Error  string `json:"error"`
	Reason string `json:"reason,omitempty"`
}

// reasonCounters counts brisk-generated errors by reason; a child per
// reason made up front, so counting is one atomic add.
type reasonCounters [nReasons]prometheus.Counter

func newReasonCounters() (*prometheus.CounterVec, *reasonCounters) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "brisk_dataplane_errors_total",
		Help: "Errors the data plane answered itself (not a function's own), by reason (the X-Brisk-Error header).",
	}, []string{"reason"})
	var rc reasonCounters
	for r := errReason(1); r < nReasons; r++ {
		rc[r] = vec.WithLabelValues(r.String())
	}
	return vec, &rc
}

func (rc *reasonCounters) inc(r errReason) {
	if rc != nil && r != reasonNone {
		rc[r].Inc()
	}
}

// hdrReason holds each reason's header value, shared (cap 1: an Add by
// anyone copies).
var hdrReason = func() (h [nReasons][]string) {
	for r := range h {
		h[r] = []string{errReasonNames[r]}[:1:1]
	}
	return h
}()

// statusText is the reason phrase of a status line, with a fallback for
// codes net/http does not name.
func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "Status"
}

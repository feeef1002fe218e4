package dataplane

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// Replies carry X-Start-Time (the call's arrival, Unix ns: OpenFaaS's
// header) on the fast path and the net/http path, never the function's own.
func TestStartTimeHeader(t *testing.T) {
	d, ts := newTestDP(t, nil)
	addr := newSandbox(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Start-Time", "1") // the function's: dropped
		_, _ = w.Write([]byte("ok"))
	})
	d.Apply(&briskv1.EndpointBatch{Snapshot: true, Functions: []*briskv1.FunctionSpec{fnSpec("st")}, Added: []*briskv1.Endpoint{ep("st", "sb-1", addr)}})
	for path, req := range map[string]func() *http.Request{
		"fast": func() *http.Request { r, _ := http.NewRequest("GET", ts.URL+"/function/st", nil); return r },
		"net/http": func() *http.Request {
			r, _ := http.NewRequest("POST", ts.URL+"/function/st", strings.NewReader("x"))
			r.TransferEncoding = []string{"chunked"} // handed to net/http
			return r
		},
	} {
		before := time.Now().UnixNano()
		res := do(t, req())
		after := time.Now().UnixNano()
		if res.code != 200 || len(res.header["X-Start-Time"]) != 1 {
			t.Fatalf("%s: %d %v", path, res.code, res.header)
		}
		v, err := strconv.ParseInt(res.header.Get("X-Start-Time"), 10, 64)
		if err != nil || v < before-int64(time.Second) || v > after {
			t.Fatalf("%s: X-Start-Time %q not the call's arrival (between %d and %d)", path, res.header.Get("X-Start-Time"), before, after)
		}
	}
}

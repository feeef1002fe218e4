package dataplane

import (
	"net/http"
	"testing"
	"time"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// The server's ReadTimeout bounds reading the request, not the function's
// run: net/http clears the read deadline once the body is consumed.
func TestLongFunctionOutlivesReadTimeout(t *testing.T) {
	const rt = 50 * time.Millisecond
	d := runDP(t, Config{ReadTimeout: rt})
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long")},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", g.addr)}})
	start := time.Now()
	res := goGet(t, "http://"+d.Addr()+"/function/long")
	recv(t, g.arrived, "arrival")
	waitFor(t, "ReadTimeout to pass", func() bool { return time.Since(start) > 3*rt })
	g.release <- struct{}{}
	if r := recv(t, res, "response"); r.err != nil || r.code != http.StatusOK {
		t.Fatalf("function longer than ReadTimeout: %v %d %s", r.err, r.code, r.body)
	}
}

func TestLongFunctionExtendsWriteDeadline(t *testing.T) {
	const writeTimeout = 50 * time.Millisecond
	d := runDP(t, Config{WriteTimeout: writeTimeout})
	g := newGate(t)
	d.Apply(&briskv1.EndpointBatch{Snapshot: true,
		Functions: []*briskv1.FunctionSpec{fnSpec("long", func(s *briskv1.FunctionSpec) { s.TimeoutMs = 10_000 })},
		Added:     []*briskv1.Endpoint{ep("long", "sb-1", g.addr)}})
	start := time.Now()
	res := goGet(t, "http://"+d.Addr()+"/function/long")
	recv(t, g.arrived, "arrival")
	// Answer only after the server-wide write deadline has passed.
	waitFor(t, "server WriteTimeout to pass", func() bool { return time.Since(start) > 3*writeTimeout })
	g.release <- struct{}{}
	if r := recv(t, res, "response"); r.err != nil || r.code != http.StatusOK {
		t.Fatalf("function longer than WriteTimeout: %v %d %s", r.err, r.code, r.body)
	}
}

package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The wire client reads what net/http's server writes: fixed-length,
// chunked and close-delimited replies, kept-alive connections used again,
// closed ones replaced.
func TestWireClient(t *testing.T) {
	var conns atomic.Int32
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/async-function/f" || string(b) != `{"ms":1}` || r.Header.Get("Authorization") != "Bearer t" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch n.Add(1) {
		case 2: // chunked
			w.Header().Set("X-Call-Id", "c2")
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, strings.Repeat("x", 600))
			w.(http.Flusher).Flush()
			_, _ = io.WriteString(w, "end")
		case 3:
			w.Header().Set("Connection", "close")
			w.Header().Set("X-Call-Id", "c3")
			w.WriteHeader(http.StatusAccepted)
		case 4:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "queue full\n")
		default:
			w.Header().Set("X-Call-Id", "c"+r.Header.Get("X-N"))
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, `{"call_id":"x"}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	w, err := newWireClient(addr, http.MethodPost, "/async-function/f", addr, http.Header{"Authorization": {"Bearer t"}, "X-N": {"1"}}, []byte(`{"ms":1}`), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	ctx := context.Background()
	want := []struct {
		code  int
		value string
		body  string
	}{
		{202, "c1", `{"call_id":"x"}`},
		{202, "c2", strings.Repeat("x", 512)},
		{202, "c3", ""},
		{503, "", "queue full\n"},
		{202, "c1", `{"call_id":"x"}`},
	}
	for i, wt := range want {
		rep, err := w.do(ctx, "x-call-id")
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if rep.code != wt.code || rep.value != wt.value || string(rep.body) != wt.body {
			t.Fatalf("call %d: %d %q %q, want %d %q %q", i+1, rep.code, rep.value, rep.body, wt.code, wt.value, wt.body)
		}
	}
	// One connection for calls 1-3, closed by the server after 3; one more.
	if got := conns.Load(); got != 2 {
		t.Errorf("%d connections, want 2", got)
	}
}

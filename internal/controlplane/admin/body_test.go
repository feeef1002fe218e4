package admin

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// readBody takes a body as its Content-Length states it, refuses one over
// the limit whether or not it states its length, and fails a body shorter
// than it says.
func TestReadBody(t *testing.T) {
	req := func(body string, length int64) (*httptest.ResponseRecorder, *http.Request) {
		r := httptest.NewRequest(http.MethodPost, "/v1/functions", io.NopCloser(strings.NewReader(body)))
		r.ContentLength = length
		return httptest.NewRecorder(), r
	}
	w, r := req(`{"name":"f"}`, 12)
	if b, err := readBody(w, r, 64); err != nil || string(b) != `{"name":"f"}` {
		t.Errorf("stated length: %q, %v", b, err)
	}
	w, r = req(`{"name":"f"}`, -1) // chunked: no length stated
	if b, err := readBody(w, r, 64); err != nil || string(b) != `{"name":"f"}` {
		t.Errorf("unstated length: %q, %v", b, err)
	}
	var tooBig *http.MaxBytesError
	for _, n := range []int64{100, -1} {
		w, r = req(strings.Repeat("x", 100), n)
		if _, err := readBody(w, r, 64); !errors.As(err, &tooBig) {
			t.Errorf("100 bytes (length %d) over a 64-byte limit: %v, want *http.MaxBytesError", n, err)
		}
	}
	w, r = req("short", 12)
	if _, err := readBody(w, r, 64); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a body shorter than its length: %v, want unexpected EOF", err)
	}
}

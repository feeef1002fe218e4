package tracefn

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWatchdog(t *testing.T) {
	env := map[string]string{"content_type": "application/json"}
	getenv := func(k string) string { return env[k] }
	var log strings.Builder
	for _, c := range []struct {
		fprocess, method, target, body string
		code                           int
		want                           []string
	}{
		{"cat", "POST", "/", `{"x":1}`, 200, []string{`{"x":1}`}},
		{"env", "PUT", "/p/a?testing=1", "", 200, []string{"Http_Method=PUT", "Http_Query=testing=1", "Http_Path=/p/a", "Http_X_Test=yes"}},
		{"false", "GET", "/", "", 500, nil},
		{"/nonexistent/program", "GET", "/", "", 500, nil},
	} {
		h, err := NewWatchdog(c.fprocess, getenv, &log)
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
		req.Header.Set("X-Test", "yes")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		b, _ := io.ReadAll(rec.Body)
		if rec.Code != c.code {
			t.Fatalf("%s: %d %s, want %d", c.fprocess, rec.Code, b, c.code)
		}
		for _, w := range c.want {
			if !strings.Contains(string(b), w) {
				t.Fatalf("%s: reply lacks %q:\n%s", c.fprocess, w, b)
			}
		}
		if c.code == http.StatusOK && rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("%s: content type %q", c.fprocess, rec.Header().Get("Content-Type"))
		}
	}
	if !strings.Contains(log.String(), "Forking fprocess.") || !strings.Contains(log.String(), "Wrote 7 Bytes") {
		t.Fatalf("log lines: %s", log.String())
	}
	if _, err := NewWatchdog("  ", getenv, &log); err == nil {
		t.Fatal("empty fprocess accepted")
	}
}

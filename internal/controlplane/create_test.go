package controlplane

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/brisk-faas/brisk/internal/controlplane/admin"
)

// A create answers with the record it stored (store.Registry.CreateFunction
// returns it), which must be exactly the stored function as the API encodes
// it: compact JSON with a newline, application/json, 201, a Location.
func TestCreateAnswersWithTheStoredFunction(t *testing.T) {
	e := newEnv(t, envOpts{})
	tok, err := admin.ReadAdminToken(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	h := e.cp.admin.Handler()
	req := httptest.NewRequest(http.MethodPost, "/v1/functions", strings.NewReader(`{"name":"rec","builtin":"trace","env":{"K":"<v&>"},"labels":{"team":"a"}}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated || rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("Location") != "/v1/functions/rec" {
		t.Fatalf("create: %d %q %q: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Location"), rec.Body)
	}
	fns, err := e.cp.store.Functions()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, f := range fns {
		if f.Name == "rec" {
			if err := json.NewEncoder(&buf).Encode(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if buf.Len() == 0 || !bytes.Equal(rec.Body.Bytes(), buf.Bytes()) {
		t.Fatalf("create answered\n%s\nthe stored function encodes as\n%s", rec.Body, buf.Bytes())
	}
	if !strings.Contains(rec.Body.String(), `"revision":`) || !strings.Contains(rec.Body.String(), `\u003cv\u0026\u003e`) {
		t.Fatalf("create answered %s: want the assigned revision and HTML-safe escaping, as the encoder writes", rec.Body)
	}
}

package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestCreateJSONSendsTheSpecAsIsAndReportsConflicts(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		if len(got) == 2 {
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"error":"function \"a\" already exists"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"name":"a"}`)
	}))
	defer srv.Close()
	c := New(srv.URL, "")
	spec := []byte(`{"name":"a","builtin":"trace"}`)
	if err := c.CreateJSON(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	err := c.CreateJSON(context.Background(), spec)
	if !IsConflict(err) || err.Error() == "" {
		t.Fatalf("second create: %v, want a conflict", err)
	}
	want := "POST /v1/functions " + string(spec)
	if len(got) != 2 || got[0] != want || got[1] != want {
		t.Fatalf("server saw %q", got)
	}
}

package client

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TrustCA lets the client call an https:// admin API whose certificate is
// of that CA; without it the call fails on the certificate.
func TestTrustCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`[]`))
	}))
	defer srv.Close()
	c := New(srv.URL, srv.URL)
	if _, err := c.List(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := c.TrustCA(caPEM); err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(context.Background()); err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	if err := c.TrustCA([]byte("not PEM")); err == nil {
		t.Fatal("TrustCA took no certificate")
	}
}

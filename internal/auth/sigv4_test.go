package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Requests signed by the AWS SDK for Go's signer verify; any change to
// what was signed, a wrong key or a stale date does not.
func TestSigV4AgainstTheAWSSigner(t *testing.T) {
	tok, _, err := New([]string{ScopeInvoke}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	keyID, secret, ok := AWSCredentials(tok)
	if !ok {
		t.Fatal("no credentials")
	}
	now := time.Now().UTC()
	sign := func(method, target, body string, hdr map[string]string) *http.Request {
		r, err := http.NewRequest(method, "http://127.0.0.1:8080"+target, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		sum := sha256.Sum256([]byte(body))
		err = v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: keyID, SecretAccessKey: secret},
			r, hex.EncodeToString(sum[:]), "lambda", "us-east-1", now)
		if err != nil {
			t.Fatal(err)
		}
		// As a server sees it.
		r.RequestURI = r.URL.RequestURI()
		r.Host = r.URL.Host
		return r
	}
	verify := func(r *http.Request, body, key string, at time.Time) error {
		s, err := ParseSigV4(r.Header.Get("Authorization"))
		if err != nil {
			return err
		}
		if s.KeyID != keyID {
			t.Fatalf("key id %q, want %q", s.KeyID, keyID)
		}
		return s.Verify(r, []byte(body), key, at)
	}
	cases := []struct{ method, target, body string }{
		{"POST", "/2015-03-31/functions/hello/invocations", `{"k":1}`},
		{"POST", "/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-east-1%3A123456789012%3Afunction%3Ahello%3Aprod/invocations", ""},
		{"POST", "/2015-03-31/functions/hello/invocations?Qualifier=%24LATEST", "x"},
		{"GET", "/2015-03-31/functions/?MaxItems=10&Marker=a%20b", ""},
	}
	for _, c := range cases {
		r := sign(c.method, c.target, c.body, map[string]string{"X-Amz-Invocation-Type": "Event", "Content-Type": "application/json"})
		if err := verify(r, c.body, secret, now); err != nil {
			t.Errorf("%s %s: %v", c.method, c.target, err)
		}
		if err := verify(r, c.body+"tampered", secret, now); !errors.Is(err, ErrSigV4Mismatch) {
			t.Errorf("%s %s with another body: %v, want a mismatch", c.method, c.target, err)
		}
		if err := verify(r, c.body, secret+"x", now); !errors.Is(err, ErrSigV4Mismatch) {
			t.Errorf("%s %s with another key: %v", c.method, c.target, err)
		}
		if err := verify(r, c.body, secret, now.Add(20*time.Minute)); !errors.Is(err, ErrSigV4Expired) {
			t.Errorf("%s %s 20 minutes later: %v", c.method, c.target, err)
		}
		r.Header.Set("X-Amz-Invocation-Type", "RequestResponse") // a signed header changed
		if err := verify(r, c.body, secret, now); !errors.Is(err, ErrSigV4Mismatch) {
			t.Errorf("%s %s with a signed header changed: %v", c.method, c.target, err)
		}
	}
	for _, bad := range []string{"", "AWS4-HMAC-SHA256 ", "AWS4-HMAC-SHA256 Credential=a/b/c, SignedHeaders=host, Signature=00",
		"AWS4-HMAC-SHA256 Credential=k/20260101/r/s/aws4_request, SignedHeaders=x-amz-date, Signature=" + strings.Repeat("0", 64)} {
		if _, err := ParseSigV4(bad); err == nil {
			t.Errorf("ParseSigV4(%q) accepted", bad)
		}
	}
}

func TestSigningKeyOnTheGrant(t *testing.T) {
	tok, g, err := New([]string{ScopeInvoke}, []string{"f"}, "ns")
	if err != nil {
		t.Fatal(err)
	}
	id, secret, _ := AWSCredentials(tok)
	if g.SigningKey != secret || g.SigningKey == "" || strings.Contains(tok, secret) {
		t.Fatalf("grant key %q, client key %q", g.SigningKey, secret)
	}
	c := NewChecker()
	c.Replace([]Grant{g})
	key, allows, ok := c.SigningKey(id)
	if !ok || key != secret {
		t.Fatalf("checker key %q %v", key, ok)
	}
	if allows(ScopeInvoke, "ns", "f") != nil || allows(ScopeInvoke, "ns", "g") == nil || allows(ScopeInvoke, "other", "f") == nil || allows(ScopeDeploy, "ns", "f") == nil {
		t.Fatal("the key's grant is not checked as the token's")
	}
	if _, _, ok := c.SigningKey("brisk_0000000000000000"); ok {
		t.Fatal("unknown key id found")
	}
}

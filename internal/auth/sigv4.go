package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// AWS Signature Version 4, as the Lambda Invoke API's clients (boto3, the
// aws CLI, the AWS SDKs) sign requests: brisk checks it with a token's
// SigningKey (AWSCredentials gives a client its key pair). Only what those
// clients send is accepted: the Authorization header form, HMAC-SHA256.

// SigV4 is a parsed "AWS4-HMAC-SHA256 Credential=..., SignedHeaders=...,
// Signature=..." header.
type SigV4 struct {
	KeyID, Date, Region, Service string
	SignedHeaders                []string // lower case, sorted as sent
	Signature                    []byte
}

// Errors of the SigV4 checks.
var (
	ErrSigV4Malformed = errors.New("malformed AWS4-HMAC-SHA256 authorization")
	ErrSigV4Mismatch  = errors.New("the request signature does not match (check the secret access key: brisk token aws)")
	ErrSigV4Expired   = errors.New("the request's X-Amz-Date is more than 15 minutes from the server's time")
)

// IsSigV4 reports whether an Authorization value is a SigV4 signature.
func IsSigV4(authz string) bool { return strings.HasPrefix(authz, "AWS4-HMAC-SHA256 ") }

// ParseSigV4 parses an Authorization header value.
func ParseSigV4(authz string) (*SigV4, error) {
	rest, ok := strings.CutPrefix(authz, "AWS4-HMAC-SHA256 ")
	if !ok {
		return nil, ErrSigV4Malformed
	}
	s := &SigV4{}
	for part := range strings.SplitSeq(rest, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, ErrSigV4Malformed
		}
		switch k {
		case "Credential":
			f := strings.Split(v, "/")
			if len(f) != 5 || f[4] != "aws4_request" || len(f[1]) != 8 {
				return nil, ErrSigV4Malformed
			}
			s.KeyID, s.Date, s.Region, s.Service = f[0], f[1], f[2], f[3]
		case "SignedHeaders":
			s.SignedHeaders = strings.Split(v, ";")
		case "Signature":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != sha256.Size {
				return nil, ErrSigV4Malformed
			}
			s.Signature = b
		}
	}
	if s.KeyID == "" || s.Signature == nil || len(s.SignedHeaders) == 0 || !slices.Contains(s.SignedHeaders, "host") {
		return nil, ErrSigV4Malformed
	}
	return s, nil
}

// Verify checks r's signature with secretKey; body is r's whole body (read
// already). now bounds the signature's age to 15 minutes either way.
func (s *SigV4) Verify(r *http.Request, body []byte, secretKey string, now time.Time) error {
	amzDate := r.Header.Get("X-Amz-Date")
	t, err := time.Parse("20060102T150405Z", amzDate)
	if err != nil || amzDate[:8] != s.Date {
		return ErrSigV4Malformed
	}
	if d := now.Sub(t); d > 15*time.Minute || d < -15*time.Minute {
		return ErrSigV4Expired
	}
	sum := sha256.Sum256(body)
	payload := hex.EncodeToString(sum[:])
	if v := r.Header.Get("X-Amz-Content-Sha256"); v != "" && v != payload {
		return ErrSigV4Mismatch
	}
	rawPath, rawQuery, _ := strings.Cut(r.RequestURI, "?")
	if r.RequestURI == "" { // a request made in-process
		rawPath, rawQuery = r.URL.EscapedPath(), r.URL.RawQuery
	}
	var cr strings.Builder
	cr.WriteString(r.Method)
	cr.WriteByte('\n')
	cr.WriteString(awsEscape(rawPath, true))
	cr.WriteByte('\n')
	cr.WriteString(canonicalQuery(rawQuery))
	cr.WriteByte('\n')
	for _, h := range s.SignedHeaders {
		var vals []string
		switch {
		case h == "host":
			vals = []string{r.Host}
		case h == "content-length" && r.ContentLength >= 0: // net/http keeps it out of Header
			vals = []string{strconv.FormatInt(r.ContentLength, 10)}
		default:
			vals = r.Header.Values(h)
		}
		cr.WriteString(h)
		cr.WriteByte(':')
		for i, v := range vals {
			if i > 0 {
				cr.WriteByte(',')
			}
			cr.WriteString(strings.Join(strings.Fields(v), " "))
		}
		cr.WriteByte('\n')
	}
	cr.WriteByte('\n')
	cr.WriteString(strings.Join(s.SignedHeaders, ";"))
	cr.WriteByte('\n')
	cr.WriteString(payload)
	crSum := sha256.Sum256([]byte(cr.String()))
	scope := s.Date + "/" + s.Region + "/" + s.Service + "/aws4_request"
	toSign := "AWS4-HMAC-SHA256\n" + amzDate + "\n" + scope + "\n" + hex.EncodeToString(crSum[:])
	key := hmacSHA256([]byte("AWS4"+secretKey), s.Date)
	for _, p := range []string{s.Region, s.Service, "aws4_request"} {
		key = hmacSHA256(key, p)
	}
	if subtle.ConstantTimeCompare(hmacSHA256(key, toSign), s.Signature) != 1 {
		return ErrSigV4Mismatch
	}
	return nil
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// canonicalQuery sorts the query's pairs, each name and value encoded the
// AWS way.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	var pairs []string
	for p := range strings.SplitSeq(raw, "&") {
		k, v, _ := strings.Cut(p, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if dv, err := url.QueryUnescape(v); err == nil {
			v = dv
		}
		pairs = append(pairs, awsEscape(k, false)+"="+awsEscape(v, false))
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "&")
}

// awsEscape percent-encodes every byte but the unreserved ones (and '/'
// in a path), as AWS's canonical form wants; a path as sent is escaped once
// more, as the clients do for every service but S3.
func awsEscape(s string, path bool) string {
	const hexd = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' || (path && c == '/') {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexd[c>>4])
		b.WriteByte(hexd[c&15])
	}
	return b.String()
}

// String names a parsed signature for errors.
func (s *SigV4) String() string {
	return fmt.Sprintf("%s/%s/%s/%s", s.KeyID, s.Date, s.Region, s.Service)
}

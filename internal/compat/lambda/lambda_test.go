package lambda

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

// Function names as the API takes them: plain, qualified, partial and full
// ARNs; anything else is refused.
func TestParseName(t *testing.T) {
	for in, want := range map[string][3]string{
		"hello":                       {"hello", "", "ok"},
		"hello:$LATEST":               {"hello", "$LATEST", "ok"},
		"123456789012:function:hello": {"hello", "", "ok"},
		"arn:aws:lambda:us-east-1:123456789012:function:hello":      {"hello", "", "ok"},
		"arn:aws:lambda:us-east-1:123456789012:function:hello:prod": {"hello", "prod", "ok"},
		"arn:aws:s3:::bucket": {"", "", ""},
		"hello:a:b":           {"", "", ""},
		"":                    {"", "", ""},
	} {
		name, qual, ok := parseName(in)
		if ok != (want[2] == "ok") || ok && (name != want[0] || qual != want[1]) {
			t.Errorf("parseName(%q) = %q, %q, %v; want %q", in, name, qual, ok, want)
		}
	}
}

// X-Amz-Log-Result is Lambda's START, END and REPORT lines, base64.
func TestLogTail(t *testing.T) {
	b, err := base64.StdEncoding.DecodeString(logTail("req-1", 1500*time.Microsecond))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"START RequestId: req-1 Version: $LATEST", "END RequestId: req-1", "Duration: 1.50 ms", "Billed Duration: 2 ms"} {
		if !strings.Contains(s, want) {
			t.Errorf("log tail %q lacks %q", s, want)
		}
	}
}

package async

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"reflect"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestMetaJSON: the hand-written encoder of a call's head decodes to what
// encoding/json's encoding does, for any strings a request can carry.
func TestMetaJSON(t *testing.T) {
	pieces := []string{"", "a", "ä", "日本", "\"", "\\", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "\xff", "\xc3", "\xe2\x82", "<>&", "\u2028", "\U0001F600", "/x?y=1", " "}
	rnd := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		s := ""
		for range rnd.IntN(6) {
			s += pieces[rnd.IntN(len(pieces))]
		}
		return s
	}
	cases := []callMeta{
		{},
		{Method: "POST", Path: "/", Submit: 1},
		{Method: "GET", Path: "/a b", Query: "x=1&y=<2>", Header: http.Header{"X-A": {"1", "2"}, "X-Nil": nil, "X-Empty": {}}, Callback: "https://example.test/cb", Submit: -5, Host: "h:1", Remote: "127.0.0.1:9"},
	}
	for range 2000 {
		m := callMeta{Method: str(), Path: str(), Query: str(), Callback: str(), Submit: rnd.Int64() - rnd.Int64(), Host: str(), Remote: str()}
		if rnd.IntN(3) > 0 {
			m.Header = http.Header{}
			for range rnd.IntN(4) {
				vs := []string{}
				for range rnd.IntN(3) {
					vs = append(vs, str())
				}
				m.Header[str()] = vs
			}
		}
		cases = append(cases, m)
	}
	for i, m := range cases {
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := m.appendJSON(nil)
		var a, b callMeta
		if err := json.Unmarshal(want, &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &b); err != nil {
			t.Fatalf("case %d: %q does not decode: %v", i, got, err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("case %d: %q decodes to %+v, encoding/json's %q to %+v", i, got, b, want, a)
		}
	}
}

func TestPubAckErr(t *testing.T) {
	for _, tc := range []struct {
		reply string
		ok    bool
		desc  string
	}{
		{`{"stream":"BRISK_CALLS","seq":12}`, true, ""},
		{`{"stream":"BRISK_CALLS","seq":12,"duplicate":true}`, true, ""},
		{`{"stream":"BRISK_CALLS", "seq":1}`, true, ""},
		{`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"BRISK_CALLS","seq":0}`, false, "maximum messages exceeded"},
		{`{"stream":"BRISK_CALLS","error":{"code":400,"err_code":1,"description":"bad"}}`, false, "bad"},
		{`{"seq":1}`, false, ""},
		{`not json`, false, ""},
		{``, false, ""},
	} {
		err := pubAckErr([]byte(tc.reply))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.reply, err, tc.ok)
			continue
		}
		var apiErr *jetstream.APIError
		if tc.desc != "" && (!errors.As(err, &apiErr) || apiErr.Description != tc.desc) {
			t.Errorf("%s: err %v, want the API error %q", tc.reply, err, tc.desc)
		}
	}
	if !isLimit(pubAckErr([]byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`))) {
		t.Error("a full stream's acknowledgement is not a limit")
	}
}

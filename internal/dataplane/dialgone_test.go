package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	briskv1 "github.com/brisk-faas/brisk/api/brisk/v1"
)

// synSent reports whether a connect to port is waiting in SYN_SENT.
func synSent(port string) bool {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false
	}
	defer f.Close()
	var p int
	fmt.Sscanf(port, "%d", &p)
	want := fmt.Sprintf(":%04X", p)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 3 && strings.HasSuffix(fields[2], want) && fields[3] == "02" {
			return true
		}
	}
	return false
}

// A client that leaves while the data plane is still connecting to the
// sandbox is counted as gone (499), not as the sandbox's failure (502):
// the dial follows the call's context, so leaving cancels it.
func TestClientGoneDuringDial(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp to see the connect wait")
	}
	d, srv := newTestDP(t, nil)
	slow := httptest.NewServer(d.Handler())
	t.Cleanup(slow.Close)
	addr := blackholeAddr(t) // deadends_test.go: connects to it wait in SYN_SENT
	_, port, _ := net.SplitHostPort(addr)
	for _, tc := range []struct{ name, url string }{{"front end", srv.URL}, {"net/http path", slow.URL}} {
		t.Run(tc.name, func(t *testing.T) {
			fn := "dial" + strings.ReplaceAll(tc.name, " ", "")
			fn = strings.ReplaceAll(fn, "/", "")
			d.Apply(&briskv1.EndpointBatch{Functions: []*briskv1.FunctionSpec{fnSpec(fn)},
				Added: []*briskv1.Endpoint{ep(fn, "sb-"+fn, addr)}})
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tc.url+"/function/"+fn, nil)
			done := make(chan result, 1)
			go func() { done <- do(t, req) }()
			waitFor(t, "the data plane connecting to the sandbox", func() bool { return synSent(port) })
			cancel()
			if r := recv(t, done, "cancelled request"); r.err == nil {
				t.Fatalf("cancelled request returned %d", r.code)
			}
			waitFor(t, "499 counted", func() bool {
				return strings.Contains(get(t, srv.URL+"/metrics").body, `brisk_dataplane_requests_total{code="499",function="`+fn+`"} 1`)
			})
			if m := get(t, srv.URL+"/metrics").body; strings.Contains(m, `code="502",function="`+fn+`"`) {
				t.Fatalf("the client's leaving was counted as a sandbox failure:\n%s", grepLines(m, fn))
			}
		})
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

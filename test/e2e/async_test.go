package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// callbackSink counts the callbacks of finished asynchronous calls by call
// id: every accepted call must show up at least once; more than once is a
// duplicate execution (at-least-once delivery), which the tests report.
type callbackSink struct {
	mu   sync.Mutex
	seen map[string]int
	srv  *httptest.Server
}

func newCallbackSink(t *testing.T) *callbackSink {
	s := &callbackSink{seen: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen[r.Header.Get("X-Call-Id")]++
		s.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *callbackSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.seen)
}

// missing returns the accepted ids no callback reported, and how many
// callbacks came more than once.
func (s *callbackSink) missing(accepted []string) (missing []string, dups int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range accepted {
		if s.seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	for _, n := range s.seen {
		if n > 1 {
			dups += n - 1
		}
	}
	return missing, dups
}

// submitAll posts n asynchronous calls of fn, spread over the data planes
// at urls by 16 clients, and returns the ids of those answered 202.
func submitAll(t *testing.T, urls []string, fn, body, callback string, n int) []string {
	t.Helper()
	var mu sync.Mutex
	var accepted []string
	var next atomic.Int64
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: 30 * time.Second}
	for w := range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				url := urls[(int(i)+w)%len(urls)]
				req, _ := http.NewRequest("POST", url+"/async-function/"+fn, strings.NewReader(body))
				req.Header.Set("X-Callback-Url", callback)
				req.Header.Set("X-Call-Id", fmt.Sprintf("%s-%d", fn, i))
				resp, err := hc.Do(req)
				if err != nil {
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusAccepted {
					mu.Lock()
					accepted = append(accepted, resp.Header.Get("X-Call-Id"))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return accepted
}

func waitListening(t testing.TB, addr string) {
	eventually(t, 30*time.Second, "a listener on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// kill -9 of one of two data planes while 1,000 asynchronous calls are in
// flight: every accepted call still runs (the other data plane takes the
// killed one's calls once their ack wait passes).
func TestAsyncSurvivesDataPlaneKill(t *testing.T) {
	c := newCluster(t)
	sink := newCallbackSink(t)
	natsAddr := freePort(t)
	tokFile := filepath.Join(t.TempDir(), "nats.token")
	if err := os.WriteFile(tokFile, []byte("e2e-nats-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startBrisk(t, "nats", "--listen", natsAddr, "--token-file", tokFile, "--data-dir", t.TempDir())
	waitListening(t, natsAddr)
	cp := startBrisk(t, append([]string{"controlplane"}, c.cpArgs()...)...)
	join := joinArgs(t, c.dataDir)
	asyncArgs := []string{"--nats", "nats://" + natsAddr, "--nats-token-file", tokFile, "--async-callback-allow", "127.0.0.0/8", "--async-ack-wait", "2s"}
	dp2Addr := freePort(t)
	registerAdmin(dp2Addr, c.dataDir)
	dp1 := startBrisk(t, append(append([]string{"dataplane", "--invoke", c.invokeAddr, "--controlplane", c.grpc, "--id", "dp-1", "--state-dir", t.TempDir()}, join...), asyncArgs...)...)
	startBrisk(t, append(append([]string{"dataplane", "--invoke", dp2Addr, "--controlplane", c.grpc, "--id", "dp-2", "--state-dir", t.TempDir()}, join...), asyncArgs...)...)
	startBrisk(t, append([]string{"worker", "--controlplane", c.grpc, "--node-id", "w-1", "--state-dir", t.TempDir(), "--stop-on-exit"}, join...)...)
	c.waitHealthy(t, cp)
	waitListening(t, dp2Addr)
	eventually(t, 30*time.Second, "dp-2 healthy", func() bool { return httpOK("http://" + dp2Addr + "/healthz") })

	c.mustBrisk(t, "fn", "deploy", "work", "--builtin", "trace", "--async-concurrency", "16", "--max", "16")
	// Unknown functions are refused before anything is stored.
	if out, code := c.brisk(t, "invoke", "nope", "--async"); code == 0 || !strings.Contains(out, "not found") {
		t.Fatalf("async call of an unknown function: exit %d: %s", code, out)
	}
	urls := []string{"http://" + c.invokeAddr, "http://" + dp2Addr}
	accepted := submitAll(t, urls, "work", `{"ms": 50}`, sink.srv.URL+"/done", 1000)
	if len(accepted) != 1000 {
		t.Fatalf("accepted %d of 1000 calls before any failure", len(accepted))
	}
	eventually(t, 60*time.Second, "some calls finished", func() bool { return sink.count() >= 50 })
	done := sink.count()
	dp1.stop(syscall.SIGKILL)
	t.Logf("killed dp-1 with %d of 1000 calls finished", done)

	eventually(t, 180*time.Second, "every accepted call finished", func() bool {
		m, _ := sink.missing(accepted)
		return len(m) == 0
	})
	_, dups := sink.missing(accepted)
	// A call the killed data plane finished but had not settled runs again;
	// its first callback may not have been sent, so this counts callbacks.
	t.Logf("all 1000 accepted calls ran; %d callbacks came more than once", dups)
}

// kill -9 of brisk up (embedded NATS included) with calls queued: after a
// restart on the same data dir every accepted call runs. A call that fails
// ends in the dead-letter stream, and brisk calls retry runs it again.
func TestAsyncSurvivesUpKill(t *testing.T) {
	c := newCluster(t)
	sink := newCallbackSink(t)
	args := []string{"--async-callback-allow", "127.0.0.0/8", "--async-ack-wait", "2s"}
	up := c.up(t, args...)
	c.mustBrisk(t, "fn", "deploy", "slow", "--builtin", "trace", "--max", "1", "--async-concurrency", "4")
	accepted := submitAll(t, []string{"http://" + c.invokeAddr}, "slow", `{"ms": 20}`, sink.srv.URL, 200)
	if len(accepted) != 200 {
		t.Fatalf("accepted %d of 200", len(accepted))
	}
	eventually(t, 60*time.Second, "some calls finished", func() bool { return sink.count() >= 5 })
	up.stop(syscall.SIGKILL)
	t.Logf("killed brisk up with %d of 200 calls finished", sink.count())
	c.up(t, args...)
	eventually(t, 120*time.Second, "every accepted call finished after the restart", func() bool {
		m, _ := sink.missing(accepted)
		return len(m) == 0
	})
	_, dups := sink.missing(accepted)
	t.Logf("all 200 accepted calls ran; %d callbacks came more than once", dups)
	out := c.mustBrisk(t, "calls", "list", "--function", "slow", "--status", "succeeded", "--limit", "1000")
	if n := strings.Count(out, "\n") - 1; n != 200 {
		t.Fatalf("brisk calls list shows %d succeeded calls, want 200:\n%s", n, tail(out, 2000))
	}

	// A call the function refuses (malformed body: 400) fails, lands in the
	// dead-letter stream, and runs again on brisk calls retry.
	id := strings.TrimSpace(c.mustBrisk(t, "invoke", "slow", "--async", "--data", "not json"))
	var rec struct{ Status, Error string }
	eventually(t, 30*time.Second, "the bad call failed", func() bool {
		r, err := c.cl.Call(context.Background(), id)
		if err != nil {
			return false
		}
		rec.Status, rec.Error = string(r.Status), r.Error
		return r.Status == "failed"
	})
	if !strings.Contains(rec.Error, "400") {
		t.Fatalf("failed call's error %q does not say 400", rec.Error)
	}
	retried := time.Now()
	c.mustBrisk(t, "calls", "retry", id)
	eventually(t, 30*time.Second, "the retried call ran again and failed again", func() bool {
		r, err := c.cl.Call(context.Background(), id)
		return err == nil && r.Status == "failed" && r.StartedAt != nil && r.StartedAt.After(retried)
	})
	if out, code := c.brisk(t, "calls", "get", "no-such-call"); code == 0 || !strings.Contains(out, "no such call") {
		t.Fatalf("calls get of an unknown id: exit %d: %s", code, out)
	}
}

package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/loadgen"
)

// TestHTTPSendsToAnyEndpoint points bench http at a plain server that
// routes on Host, as another platform would, and checks what arrived.
func TestHTTPSendsToAnyEndpoint(t *testing.T) {
	var mu sync.Mutex
	hosts := map[string]int{}
	paths := map[string]int{}
	var badHeader int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts[r.Host]++
		paths[r.URL.Path]++
		if r.Header.Get("Workload") != "empty" || r.Header.Get("Requested_cpu") != "3" {
			badHeader++
		}
		mu.Unlock()
		if r.Host == "fn2" {
			http.Error(w, "no such function", http.StatusNotFound)
			return
		}
		w.Write([]byte(`{"Status":"OK","Function":"` + r.Host + `","ExecutionTime":3000}`))
	}))
	defer srv.Close()

	o := Options{Out: t.TempDir(), Lateness: loadgen.Lateness{Late: time.Second, MaxFraction: 1}}
	cfg := HTTPConfig{URL: srv.URL + "/call/{i}", Host: "fn{i}", Header: http.Header{"Workload": {"empty"}},
		Functions: 3, Rate: 200, Duration: 300 * time.Millisecond, Warmup: 0, ExecMs: 3}
	s, text, err := HTTP(context.Background(), o, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Issued != 60 || s.Completed != 40 || s.Failed != 20 || s.Statuses["404"] != 20 || !strings.Contains(text, "40 ok") {
		t.Fatalf("summary %+v\n%s", s.Summary, text)
	}
	if hosts["fn0"] != 20 || hosts["fn1"] != 20 || hosts["fn2"] != 20 || paths["/call/0"] != 20 || paths["/call/2"] != 20 || badHeader != 0 {
		t.Fatalf("hosts %v paths %v, %d calls without the headers", hosts, paths, badHeader)
	}
	checkFiles(t, o.Out, "summary.json", "invocations.csv", "latency_cdf.png")
}

// A closed loop keeps its callers' calls in flight and no more.
func TestHTTPClosedLoop(t *testing.T) {
	var mu sync.Mutex
	inflight, peak, calls := 0, 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inflight++
		calls++
		peak = max(peak, inflight)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		inflight--
		mu.Unlock()
		w.Write([]byte(`{"Status":"OK","ExecutionTime":1}`))
	}))
	defer srv.Close()
	o := Options{Out: t.TempDir()}
	s, _, err := HTTP(context.Background(), o, HTTPConfig{URL: srv.URL + "/", Functions: 1, Closed: 3, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if peak != 3 || s.Completed == 0 || s.Failed != 0 || s.Issued+s.WarmupIssued != calls || s.Config.Closed != 3 || !s.Valid {
		t.Fatalf("peak %d in flight, %d calls; summary %+v", peak, calls, s)
	}
}

func TestHTTPRejectsBadConfig(t *testing.T) {
	for _, cfg := range []HTTPConfig{
		{Rate: 1, Duration: time.Second, Functions: 1},
		{URL: "ftp://x/", Rate: 1, Duration: time.Second, Functions: 1},
		{URL: "http:///path", Rate: 1, Duration: time.Second, Functions: 1},
		{URL: "http://127.0.0.1:1/", Host: "a b", Rate: 1, Duration: time.Second, Functions: 1},
		{URL: "http://127.0.0.1:1/", Rate: 0, Duration: time.Second, Functions: 1},
		{URL: "http://127.0.0.1:1/", Rate: 1, Duration: time.Second, Functions: 0},
		{URL: "http://127.0.0.1:1/", Rate: 1, Closed: 4, Duration: time.Second, Functions: 1},
		{URL: "http://127.0.0.1:1/", Closed: -1, Duration: time.Second, Functions: 1},
	} {
		if _, _, err := HTTP(context.Background(), Options{}, cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

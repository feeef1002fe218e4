package tracefn

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/testutil"
)

type reply struct {
	Status        string
	Function      string
	MachineName   string
	ExecutionTime int64
	Sandbox       string  `json:"sandbox"`
	ExecUS        int64   `json:"exec_us"`
	RequestedMS   float64 `json:"requested_ms"`
	MB            float64 `json:"mb"`
	Error         string  `json:"error"`
}

var testCfg = Config{SandboxID: "sb-1", Function: "trace-func-0"}

// call runs one request through a fresh handler and decodes the JSON reply.
func call(t *testing.T, cfg Config, body string, headers map[string]string) (int, reply) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	New(cfg).ServeHTTP(rec, req)
	var r reply
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("reply %q is not JSON: %v", rec.Body.String(), err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	return rec.Code, r
}

func TestSpinsAtLeastTheRequestedTime(t *testing.T) {
	code, r := call(t, testCfg, `{"ms":30}`, nil)
	if code != http.StatusOK {
		t.Fatalf("status %d: %+v", code, r)
	}
	if r.ExecUS < 30_000 {
		t.Errorf("exec_us = %d, want >= 30000", r.ExecUS)
	}
	want := reply{Status: "OK", Function: "trace-func-0", MachineName: "sb-1", Sandbox: "sb-1",
		ExecutionTime: r.ExecUS, ExecUS: r.ExecUS, RequestedMS: 30}
	if r != want {
		t.Errorf("reply = %+v, want %+v", r, want)
	}
}

func TestEmptyBodyIsAZeroRequest(t *testing.T) {
	for _, body := range []string{"", "  \n", "{}", `{"ms":null}`} {
		code, r := call(t, testCfg, body, nil)
		if code != http.StatusOK || r.RequestedMS != 0 || r.MB != 0 || r.Status != "OK" {
			t.Errorf("body %q: status %d reply %+v", body, code, r)
		}
	}
}

func TestHeadersOverrideBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		headers map[string]string
		ms, mb  float64
	}{
		{"runtime header", `{"ms":100000,"mb":2}`, map[string]string{"requested_cpu": "5"}, 5, 2},
		{"memory header", `{"ms":3,"mb":1000}`, map[string]string{"requested_memory": "1"}, 3, 1},
		{"both headers, opaque body not read", "\x00\x01 not json",
			map[string]string{"requested_cpu": "4", "requested_memory": "2"}, 4, 2},
		{"canonical header spelling", "", map[string]string{"Requested_cpu": "2"}, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, r := call(t, testCfg, tc.body, tc.headers)
			if code != http.StatusOK || r.RequestedMS != tc.ms || r.MB != tc.mb {
				t.Fatalf("status %d reply %+v, want ms=%g mb=%g", code, r, tc.ms, tc.mb)
			}
			if r.ExecUS < int64(tc.ms*1000) {
				t.Errorf("exec_us = %d, want >= %g", r.ExecUS, tc.ms*1000)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		headers map[string]string
		status  int
		field   string // the error message must start with it
	}{
		{"negative ms", `{"ms":-1}`, nil, 400, "ms:"},
		{"absurd ms", `{"ms":600001}`, nil, 400, "ms:"},
		{"absurd mb", `{"mb":10241}`, nil, 400, "mb:"},
		{"negative mb", `{"ms":1,"mb":-0.5}`, nil, 400, "mb:"},
		{"ms not a number", `{"ms":"10"}`, nil, 400, "ms:"},
		{"mb not a number", `{"mb":[1]}`, nil, 400, "mb:"},
		{"huge number", `{"ms":1e999}`, nil, 400, "ms:"},
		{"malformed", `{"ms":`, nil, 400, "body:"},
		{"not an object", `[1,2]`, nil, 400, "body:"},
		{"trailing garbage", `{"ms":1} x`, nil, 400, "body:"},
		{"runtime header not a number", "", map[string]string{"requested_cpu": "ten"}, 400, "requested_cpu:"},
		{"runtime header negative", "", map[string]string{"requested_cpu": "-3"}, 400, "requested_cpu:"},
		{"runtime header NaN", "", map[string]string{"requested_cpu": "NaN"}, 400, "requested_cpu:"},
		{"memory header Inf", "", map[string]string{"requested_memory": "+Inf"}, 400, "requested_memory:"},
		{"memory header empty", "", map[string]string{"requested_memory": ""}, 400, "requested_memory:"},
		{"body too large", `{"ms":1,"pad":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, "body:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testCfg
			cfg.MaxBody = 1024
			code, r := call(t, cfg, tc.body, tc.headers)
			if code != tc.status || !strings.HasPrefix(r.Error, tc.field) {
				t.Fatalf("status %d error %q, want %d and an error naming %q", code, r.Error, tc.status, tc.field)
			}
		})
	}
}

func TestTouchesMemory(t *testing.T) {
	code, r := call(t, testCfg, `{"ms":1,"mb":8}`, nil)
	if code != http.StatusOK || r.MB != 8 || r.ExecUS < 1000 {
		t.Fatalf("status %d reply %+v", code, r)
	}
	// take must leave every page written, a reused buffer's too.
	var m memory
	mem := m.take(8*mib + 1)
	for round := range 2 {
		for i := 0; i < len(mem); i += pageSize {
			if mem[i] != 1 {
				t.Fatalf("round %d: page at offset %d not touched", round, i)
			}
		}
		clear(mem)
		m.give(mem)
		if mem = m.take(4 * mib); len(mem) != 4*mib {
			t.Fatalf("take(4 MiB) gave %d bytes", len(mem))
		}
	}
}

// TestGrowingMemoryReturnsTheSmaller: a call asking for more than the
// buffer it is handed gets a new one, and the old one goes back to the
// system first, so that the sandbox never holds both.
func TestGrowingMemoryReturnsTheSmaller(t *testing.T) {
	var m memory
	m.give(m.take(48 * mib))
	mem := m.take(96 * mib)
	var st runtime.MemStats
	runtime.ReadMemStats(&st)
	if held := st.HeapSys - st.HeapReleased; held >= (48+96)*mib {
		t.Fatalf("the heap holds %d MiB from the system after growing 48 → 96 MiB: the old buffer was kept", held/mib)
	}
	m.give(mem)
}

// TestCallsReuseMemory: a call's memory goes to the next call instead of
// being left as garbage, which let a sandbox reach twice its calls' memory
// before Go collected it and so be OOM-killed under its limit.
func TestCallsReuseMemory(t *testing.T) {
	h := New(testCfg)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 4 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"ms":0,"mb":32}`)))
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 48*mib {
		t.Fatalf("4 calls of 32 MiB allocated %d MiB: each call allocates its own memory", grew/mib)
	}
}

func TestSleepMode(t *testing.T) {
	cfg := testCfg
	cfg.Sleep = true
	code, r := call(t, cfg, `{"ms":20,"mb":4096}`, nil)
	if code != http.StatusOK || r.ExecUS < 20_000 || r.RequestedMS != 20 || r.MB != 4096 {
		t.Fatalf("status %d reply %+v", code, r)
	}
}

func TestCancelledRequestStopsWithoutReply(t *testing.T) {
	for _, sleep := range []bool{false, true} {
		t.Run(fmt.Sprintf("sleep=%v", sleep), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(`{"ms":600000}`))
			rec := httptest.NewRecorder()
			done := make(chan struct{})
			go func() {
				defer close(done)
				New(Config{Sleep: sleep}).ServeHTTP(rec, req)
			}()
			cancel()
			<-done // a 10-minute request returns because ctx ended
			if rec.Body.Len() != 0 {
				t.Errorf("cancelled request replied %q", rec.Body.String())
			}
		})
	}
}

func TestHealthz(t *testing.T) {
	rec := httptest.NewRecorder()
	New(testCfg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ok" {
		t.Fatalf("GET /healthz = %d %q", rec.Code, rec.Body.String())
	}
	// Any other method or path runs the function.
	rec = httptest.NewRecorder()
	New(testCfg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/some/path?x=1", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"Status":"OK"`) {
		t.Fatalf("GET /some/path = %d %q", rec.Code, rec.Body.String())
	}
}

func TestEscapesNames(t *testing.T) {
	code, r := call(t, Config{SandboxID: `a"b\c`, Function: "f\n"}, "", nil)
	if code != http.StatusOK || r.MachineName != `a"b\c` || r.Function != "f\n" {
		t.Fatalf("status %d reply %+v", code, r)
	}
}

func TestServe(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Serve(ctx, addr, testCfg) }()

	var body string
	testutil.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Post("http://"+addr+"/", "application/json", strings.NewReader(`{"ms":1}`))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK
	}, "trace server on %s never answered", addr)
	if !strings.Contains(body, `"MachineName":"sb-1"`) {
		t.Errorf("reply %q", body)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
}

func TestServeBadAddr(t *testing.T) {
	if err := Serve(context.Background(), "127.0.0.1:-1", testCfg); err == nil {
		t.Fatal("Serve on a bad address returned nil")
	}
}

func TestFromEnv(t *testing.T) {
	env := map[string]string{"PORT": "8123", "BRISK_SANDBOX_ID": "sb-9", "BRISK_FUNCTION": "fn"}
	addr, cfg, err := FromEnv(func(k string) string { return env[k] })
	if err != nil || addr != "127.0.0.1:8123" || cfg.SandboxID != "sb-9" || cfg.Function != "fn" || cfg.FProcess != "" {
		t.Fatalf("FromEnv = %q %+v %v", addr, cfg, err)
	}
	env["BRISK_LISTEN_HOST"] = "::1"
	if addr, _, err := FromEnv(func(k string) string { return env[k] }); err != nil || addr != "[::1]:8123" {
		t.Errorf("FromEnv with BRISK_LISTEN_HOST = %q, %v", addr, err)
	}
	for _, p := range []string{"", "0", "65536", "http"} {
		env["PORT"] = p
		if _, _, err := FromEnv(func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "PORT") {
			t.Errorf("PORT=%q: err = %v, want one naming PORT", p, err)
		}
	}
}

// discard is a ResponseWriter that costs nothing, so the handler benchmarks
// count only the handler's own work.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

func BenchmarkHandlerEmpty(b *testing.B) {
	h := New(testCfg)
	for _, tc := range []struct {
		name    string
		body    string
		headers map[string]string
	}{
		{"no-input", "", nil},
		{"json-body", `{"ms":0,"mb":0}`, nil},
		{"loader-headers", "", map[string]string{"requested_cpu": "0", "requested_memory": "0"}},
	} {
		newReq := func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			return r
		}
		b.Run(tc.name, func(b *testing.B) {
			req, w := newReq(), &discard{h: http.Header{}}
			body := strings.NewReader(tc.body)
			req.Body, req.ContentLength = io.NopCloser(body), int64(len(tc.body))
			b.ReportAllocs()
			for b.Loop() {
				body.Reset(tc.body)
				h.ServeHTTP(w, req)
			}
		})
		b.Run(tc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, w := newReq(), &discard{h: http.Header{}}
				body := strings.NewReader(tc.body)
				req.Body, req.ContentLength = io.NopCloser(body), int64(len(tc.body))
				for pb.Next() {
					body.Reset(tc.body)
					h.ServeHTTP(w, req)
				}
			})
		})
	}
}

// BenchmarkServerEmpty is the whole path: a keep-alive HTTP/1.1 call over
// loopback into the handler and back.
func BenchmarkServerEmpty(b *testing.B) {
	srv := httptest.NewServer(New(testCfg))
	defer srv.Close()
	client := srv.Client()
	post := func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
		req.Header.Set("requested_cpu", "0")
		req.Header.Set("requested_memory", "0")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	b.Run("sequential", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			post()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				post()
			}
		})
	})
}

func TestCommandPrefersTheLeanBinaryBesideBrisk(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "brisk")
	if got := Command(exe); !slices.Equal(got, []string{exe, "__trace"}) {
		t.Fatalf("without brisk-trace: %q", got)
	}
	lean := filepath.Join(dir, BinaryName)
	if err := os.WriteFile(lean, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Command(exe); !slices.Equal(got, []string{exe, "__trace"}) {
		t.Fatalf("with a brisk-trace that is not executable: %q", got)
	}
	if err := os.Chmod(lean, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := Command(exe); !slices.Equal(got, []string{lean}) {
		t.Fatalf("with brisk-trace beside brisk: %q", got)
	}
}

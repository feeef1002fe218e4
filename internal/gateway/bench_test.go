package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkRelay is a call through the gateway to one data plane (a plain
// HTTP server standing in for it) over loopback: "direct" calls the
// stand-in with no gateway, the limit to compare against. seq is one call
// at a time; sat 16 goroutines, where ns/op is CPU per call.
//
//	go test -run '^$' -bench Relay -benchmem ./internal/gateway/
func BenchmarkRelay(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "hello")
	}))
	b.Cleanup(up.Close)
	g, err := New(Config{DataPlanes: []string{up.Listener.Addr().String()}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	gw := httptest.NewServer(g.Handler())
	b.Cleanup(gw.Close)
	for _, tc := range []struct{ name, url string }{
		{"direct", up.URL + "/function/hello/"},
		{"gateway", gw.URL + "/function/hello/"},
	} {
		for _, par := range []struct {
			name string
			p    int
		}{{"seq", 0}, {"sat", 16}} {
			b.Run(tc.name+"/"+par.name, func(b *testing.B) {
				c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}}
				defer c.CloseIdleConnections()
				get := func() {
					resp, err := c.Get(tc.url)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
				b.ReportAllocs()
				if par.p == 0 {
					for b.Loop() {
						get()
					}
					return
				}
				b.SetParallelism(max(par.p/runtime.GOMAXPROCS(0), 1))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						get()
					}
				})
			})
		}
	}
}

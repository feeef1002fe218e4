package async

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSubmitFresh: the queue's share of accepting a call, with a
// data-plane id (one JetStream write), from 16 submitters as the accept
// benchmark's clients are; the embedded server's work included. "cpu-µs/op"
// is the process's CPU per submit: on a machine where the submits saturate
// the cores it sets the accept rate.
func BenchmarkSubmitFresh(b *testing.B) {
	e := start(b, b.TempDir(), Config{})
	h := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"Go-http-client/1.1"}, "Accept-Encoding": {"gzip"}}
	body := []byte(`{"ms":1}`)
	var n atomic.Int64
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // 16 goroutines
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "bench-" + strconv.FormatInt(n.Add(1), 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			c := &Call{ID: id, Function: "fn", Method: http.MethodPost, Path: "/", Header: h, Body: body,
				Host: "127.0.0.1:8080", Remote: "127.0.0.1:50000", Fresh: true}
			if err := e.q.Submit(context.Background(), c); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/1e3/float64(b.N), "cpu-µs/op")
}

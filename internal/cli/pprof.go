package cli

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"time"
)

// maybeServePprof serves Go's profiler on $BRISK_PPROF (e.g. 127.0.0.1:6060)
// so a running component can be profiled in place.
func maybeServePprof() {
	addr := os.Getenv("BRISK_PPROF")
	if addr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil {
			slog.Warn("pprof server", "addr", addr, "err", err)
		}
	}()
}

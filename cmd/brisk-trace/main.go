// Command brisk-trace serves the built-in trace function on $PORT. It does
// what `brisk __trace` does from a binary that links only the standard
// library and internal/tracefn: it starts in ~2 ms instead of ~10 ms (the
// brisk binary's package initialisation), which is part of every cold start
// of a trace function. Workers and `brisk image build trace` use it when it
// sits next to the brisk binary; `make build` puts it there.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/brisk-faas/brisk/internal/tracefn"
)

func main() {
	addr, cfg, err := tracefn.FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "brisk-trace:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := tracefn.Serve(ctx, addr, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "brisk-trace:", err)
		os.Exit(1)
	}
}

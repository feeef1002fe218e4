// Command echoserver is the process runtime tests' stand-in for a function
// and for the brisk binary. With no arguments it serves GET / on
// 127.0.0.1:$PORT, replying with its pid and environment as JSON, and to
// GET /secrets with what it sees of its secrets (secretsprobe). With
// "__trace" it serves the trace function, as "brisk __trace" does. With
// "hog" it allocates memory until something stops it.
//
// Environment switches: ECHO_SPAWN_CHILD=1 starts "sleep 1000" as a child
// first (its pid is in the reply); ECHO_IGNORE_TERM=1 ignores SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/tracefn"
	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "__trace":
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			addr, cfg, err := tracefn.FromEnv(os.Getenv)
			if err == nil {
				err = tracefn.Serve(ctx, addr, cfg)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			return
		case "hog":
			hog()
			return
		}
	}
	if os.Getenv("ECHO_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	child := 0
	if os.Getenv("ECHO_SPAWN_CHILD") == "1" {
		cmd := exec.Command("sleep", "1000")
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		child = cmd.Process.Pid
		go cmd.Wait() //nolint:errcheck // reaps the child if it dies first
	}
	reply, _ := json.Marshal(map[string]any{
		"pid":      os.Getpid(),
		"pgid":     syscall.Getpgrp(),
		"child":    child,
		"sandbox":  os.Getenv("BRISK_SANDBOX_ID"),
		"function": os.Getenv("BRISK_FUNCTION"),
		"echo_env": os.Getenv("ECHO_ENV"),
		"port":     os.Getenv("PORT"),
	})
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", os.Getenv("PORT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("echoserver listening on", l.Addr())
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == secretsprobe.Path {
				secretsprobe.ServeHTTP(w, r)
				return
			}
			w.Write(reply)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	fmt.Fprintln(os.Stderr, srv.Serve(l))
	os.Exit(1)
}

// hog touches memory a MiB at a time, holding on to all of it, for up to
// 1 GiB; under a smaller memory limit the OOM killer ends it first.
func hog() {
	var held [][]byte
	for range 1024 {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
	}
	fmt.Println("hog survived holding", len(held), "MiB")
}

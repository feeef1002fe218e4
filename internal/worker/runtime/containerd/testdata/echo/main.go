// Command echo is the containerd runtime tests' function: a static HTTP
// server on 0.0.0.0:$PORT that replies to GET / with its environment and
// what it can see of its sandbox as JSON, and to GET /dial?addr=HOST:PORT
// with "connected" or the error of a TCP connect (1 s at most) from inside
// the sandbox, to GET /lookup?name=NAME with the addresses its resolver
// finds, and to GET /secrets with what it sees of its secrets
// (secretsprobe). With ECHO_MODE=hog it instead
// allocates memory until the OOM killer (or 1 GiB) stops it; with
// ECHO_MODE=exit it exits with status 3; with ECHO_MODE=flood it writes
// 256 MiB to stdout as fast as it can, then exits 0.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/brisk-faas/brisk/internal/worker/runtime/runtimetest/secretsprobe"
)

func main() {
	switch os.Getenv("ECHO_MODE") {
	case "hog":
		hog()
		return
	case "exit":
		os.Exit(3)
	case "flood":
		line := []byte(strings.Repeat("x", 1023) + "\n")
		for range 256 << 10 {
			if _, err := os.Stdout.Write(line); err != nil {
				os.Exit(2)
			}
		}
		return
	}
	host, _ := os.Hostname()
	_, rootErr := os.Create("/written-by-echo")
	tmp, tmpErr := os.Create("/tmp/written-by-echo")
	if tmpErr == nil {
		tmp.Close()
	}
	reply, _ := json.Marshal(map[string]any{
		"pid":           os.Getpid(),
		"hostname":      host,
		"port":          os.Getenv("PORT"),
		"sandbox":       os.Getenv("BRISK_SANDBOX_ID"),
		"function":      os.Getenv("BRISK_FUNCTION"),
		"echo_env":      os.Getenv("ECHO_ENV"),
		"image_env":     os.Getenv("IMAGE_ENV"),
		"root_writable": rootErr == nil,
		"tmp_writable":  tmpErr == nil,
	})
	l, err := net.Listen("tcp", net.JoinHostPort("0.0.0.0", os.Getenv("PORT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("echo listening on", l.Addr())
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == secretsprobe.Path {
				secretsprobe.ServeHTTP(w, r)
				return
			}
			if r.URL.Path == "/lookup" { // through the sandbox's /etc/resolv.conf
				addrs, err := net.LookupHost(r.URL.Query().Get("name"))
				if err != nil {
					fmt.Fprint(w, err)
					return
				}
				fmt.Fprint(w, strings.Join(addrs, ","))
				return
			}
			if r.URL.Path == "/dial" {
				c, err := net.DialTimeout("tcp", r.URL.Query().Get("addr"), time.Second)
				if err != nil {
					fmt.Fprint(w, err)
					return
				}
				c.Close()
				fmt.Fprint(w, "connected")
				return
			}
			w.Write(reply)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(l); err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// hog touches memory a MiB at a time, holding on to all of it.
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

package testutil

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"testing"
	"time"
)

// pollInterval is how often Eventually re-checks. Short enough that a test
// never waits noticeably past the moment its condition holds, long enough
// not to starve the code under test on a two-core machine.
const pollInterval = 5 * time.Millisecond

// Eventually polls cond until it returns true and fails the test if that has
// not happened within timeout. It checks once immediately. msgAndArgs is an
// optional format string and its arguments, printed on failure. Use it
// instead of time.Sleep to wait for something asynchronous to happen; pick a
// generous timeout, since it only bounds a failing test.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %s", timeout, message(msgAndArgs))
		}
		<-tick.C
	}
}

func message(msgAndArgs []any) string {
	switch {
	case len(msgAndArgs) == 0:
		return "(no message)"
	case len(msgAndArgs) == 1:
		return fmt.Sprint(msgAndArgs[0])
	}
	if format, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(format, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}

// RequiresRoot skips a test that needs root when run by an ordinary user,
// and fails it when the CI environment variable is set: brisk CI runs as
// root, so a skip there would silently hide the test.
func RequiresRoot(t testing.TB) {
	t.Helper()
	requiresRoot(t, os.Geteuid(), os.Getenv("CI"))
}

func requiresRoot(t testing.TB, euid int, ci string) {
	t.Helper()
	if euid == 0 {
		return
	}
	if ci != "" {
		t.Fatal("test needs root; CI runs as root")
	}
	t.Skip("test needs root")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it, so prefer listening on
// port 0 when the code under test allows it.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("FreePort: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatalf("FreePort: %v", err)
	}
	return port
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: each is held until all are chosen, so that the kernel cannot
// hand one out twice (FreePort called n times can).
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	ls := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("FreePorts: %v", err)
		}
		ls[i], ports[i] = l, l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		_ = l.Close()
	}
	return ports
}

// RawExchange writes raw to a new TCP connection to addr and returns all
// the server sent back until it closed the connection; a server that has
// not closed it within 10 s fails the test.
func RawExchange(t testing.TB, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading until %s closes: %v (got %q)", addr, err, b)
	}
	return string(b)
}

// GoBuild builds the Go package pkg (as the go tool takes it, relative to
// the test's directory) into out, with CGO_ENABLED=0 when static: for
// TestMains that need a function binary or brisk itself. The go tool's
// output is in the error.
func GoBuild(pkg, out string, static bool) error {
	gotool, err := exec.LookPath("go")
	if err != nil {
		gotool = filepath.Join(goruntime.GOROOT(), "bin", "go")
	}
	build := exec.Command(gotool, "build", "-o", out, pkg)
	if static {
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if b, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// RequestCounter is an http.RoundTripper that counts the requests it
// passes to Base (http.DefaultTransport when nil), by "METHOD /path".
type RequestCounter struct {
	Base http.RoundTripper
	mu   sync.Mutex
	n    map[string]int
}

func (r *RequestCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[req.Method+" "+req.URL.Path]++
	r.mu.Unlock()
	return cmp.Or[http.RoundTripper](r.Base, http.DefaultTransport).RoundTrip(req)
}

// Count is how many requests "METHOD /path" went through.
func (r *RequestCounter) Count(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[k]
}

// ServeConns hands each connection ln accepts to handle, in a goroutine of
// its own, until ln is closed, which the test's cleanup does.
func ServeConns(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// Greet writes greeting to c and closes it: a ServeConns handler for tests
// that only need to know a connection got through.
func Greet(greeting string) func(net.Conn) {
	return func(c net.Conn) {
		_, _ = io.WriteString(c, greeting)
		c.Close()
	}
}

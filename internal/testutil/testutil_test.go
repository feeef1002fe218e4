package testutil

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records how a helper ended the test instead
// of ending the real one. Fatal and Skip stop the calling goroutine, as the
// real ones do, so helpers run inside run().
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	r.failed = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestEventuallySucceedsOncePolledConditionHolds(t *testing.T) {
	var calls atomic.Int32
	r := run(t, func(tb testing.TB) {
		Eventually(tb, time.Minute, func() bool { return calls.Add(1) >= 3 })
	})
	if r.failed != "" {
		t.Fatalf("Eventually failed: %s", r.failed)
	}
	if got := calls.Load(); got != 3 {
		t.Fatalf("cond called %d times, want 3", got)
	}
}

func TestEventuallyFailsWithMessage(t *testing.T) {
	r := run(t, func(tb testing.TB) {
		Eventually(tb, 20*time.Millisecond, func() bool { return false }, "sandbox %s never ready", "sb-1")
	})
	if !strings.Contains(r.failed, "sandbox sb-1 never ready") {
		t.Fatalf("failure message %q does not carry the formatted message", r.failed)
	}
}

func TestRequiresRoot(t *testing.T) {
	for _, tc := range []struct {
		name          string
		euid          int
		ci            string
		fail, skipped bool
	}{
		{name: "root", euid: 0},
		{name: "root in CI", euid: 0, ci: "true"},
		{name: "user", euid: 1000, skipped: true},
		{name: "user in CI", euid: 1000, ci: "true", fail: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, func(tb testing.TB) { requiresRoot(tb, tc.euid, tc.ci) })
			if (r.failed != "") != tc.fail || (r.skipped != "") != tc.skipped {
				t.Fatalf("failed=%q skipped=%q, want fail=%v skip=%v", r.failed, r.skipped, tc.fail, tc.skipped)
			}
			if tc.fail && !strings.Contains(r.failed, "CI runs as root") {
				t.Fatalf("failure %q does not explain why", r.failed)
			}
		})
	}
}

func TestFreePortIsBindable(t *testing.T) {
	port := FreePort(t)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("port %d from FreePort is not bindable: %v", port, err)
	}
	l.Close()
}

func TestFreePortsAreDistinct(t *testing.T) {
	ports := FreePorts(t, 50)
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: %d repeated or invalid", ports, p)
		}
		seen[p] = true
	}
}

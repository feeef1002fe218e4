package containerd

import (
	"io"
	"net"
	"net/netip"
	"net/url"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// Issue 18's attack on the containerd runtime: a sandbox that has learnt
// addresses (from the admin API, say) connects to the host's ports (the
// control plane's admin and gRPC ports, a data plane) and to another
// function's sandbox. The pool's firewall refuses both, while the host
// still reaches every sandbox.
func TestSandboxCannotReachHostOrOtherSandboxes(t *testing.T) {
	testutil.RequiresRoot(t)
	cfg := poolConfig(0)
	pool := newPoolFrom(t, cfg, true)
	r := newRuntime(t, pool, "")
	a := createReady(t, r, newID(), echoFn("echo-a", nil))
	b := createReady(t, r, newID(), echoFn("echo-b", nil))
	get(t, a.Addr) // the host reaches both
	get(t, b.Addr)

	gateway := cfg.Subnet.Addr().Next() // the bridge: the host as the sandboxes see it
	ln, err := net.Listen("tcp", netip.AddrPortFrom(gateway, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	dial := func(from, to string) string {
		t.Helper()
		resp, err := httpClient.Get("http://" + from + "/dial?addr=" + url.QueryEscape(to))
		if err != nil {
			t.Fatalf("GET %s/dial: %v", from, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := dial(a.Addr, a.Addr); got != "connected" { // the probe itself works
		t.Fatalf("sandbox cannot connect to itself: %s", got)
	}
	for what, to := range map[string]string{"the host's port on the gateway": ln.Addr().String(), "another function's sandbox": b.Addr} {
		if got := dial(a.Addr, to); got == "connected" {
			t.Errorf("sandbox reached %s (%s)", what, to)
		} else {
			t.Logf("sandbox -> %s (%s): %s", what, to, got)
		}
	}
}

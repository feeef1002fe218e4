package containerd

import (
	"io"
	"net"
	"net/netip"
	"net/url"
	"testing"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/fakenet"
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
	testutil.ServeConns(t, ln, testutil.Greet(""))

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

// A container's /etc/resolv.conf names the pool's DNS forwarder, so names
// resolve (here through a fake internet's DNS server), and its connections
// go beyond the host through NAT.
func TestSandboxResolvesAndReachesOut(t *testing.T) {
	testutil.RequiresRoot(t)
	f := fakenet.Start(t, 50)
	cfg := poolConfig(0)
	cfg.Egress, cfg.DNS, cfg.DNSUpstreams = true, true, []string{f.DNS}
	r := newRuntime(t, newPoolFrom(t, cfg, true), "")
	a := createReady(t, r, newID(), echoFn("echo-net", nil))
	call := func(path string) string {
		t.Helper()
		resp, err := httpClient.Get("http://" + a.Addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := call("/lookup?name=" + url.QueryEscape("web."+fakenet.Zone)); got != f.Addr.String() {
		t.Fatalf("lookup from the container: %q, want %v", got, f.Addr)
	}
	if got := call("/dial?addr=" + url.QueryEscape(f.HTTP)); got != "connected" {
		t.Fatalf("connect beyond the host: %q", got)
	}
}

package netpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/fakenet"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// egressConfig is testConfig n with egress and DNS to the fake internet's
// resolver.
func egressConfig(n int, f *fakenet.Net) Config {
	cfg := testConfig(n, 0)
	cfg.Egress, cfg.DNS, cfg.DNSUpstreams = true, true, []string{f.DNS}
	return cfg
}

// dialIn dials from inside ep's namespace (the socket is made on a thread
// there, and stays the namespace's), whichever goroutine asks.
func dialIn(ep *Endpoint) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNetNS(ep.NetNS, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// lookupFrom resolves name from inside ep's namespace through the
// gateway's port 53, as a sandbox whose /etc/resolv.conf names the gateway.
func lookupFrom(ep *Endpoint, name, network string) ([]string, error) {
	dial := dialIn(ep)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dial(ctx, network, netip.AddrPortFrom(ep.Gateway, 53).String())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return r.LookupHost(ctx, name)
}

// getFrom fetches url from inside ep's namespace, resolving through it.
func getFrom(ep *Endpoint, url string) (string, error) {
	dial := dialIn(ep)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return dial(ctx, "udp", netip.AddrPortFrom(ep.Gateway, 53).String())
	}}
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := r.LookupHost(ctx, host)
		if err != nil {
			return nil, err
		}
		return dial(ctx, network, net.JoinHostPort(ips[0], port))
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// A sandbox reaches the world beyond the host through NAT, and resolves
// names through the gateway's forwarder (over UDP and TCP); the world sees
// the host's address, not the sandbox's.
func TestEgressAndDNS(t *testing.T) {
	t.Parallel()
	f := fakenet.Start(t, 30)
	p := startPool(t, egressConfig(30, f), false)
	a := take(t, p)
	for _, network := range []string{"udp", "tcp"} {
		addrs, err := lookupFrom(a, "web."+fakenet.Zone, network)
		if err != nil || len(addrs) != 1 || addrs[0] != f.Addr.String() {
			t.Fatalf("lookup over %s from the sandbox: %v, %v; want [%v]", network, addrs, err, f.Addr)
		}
	}
	if _, err := lookupFrom(a, "nowhere.example.", "udp"); !isNotFound(err) {
		t.Fatalf("lookup of a name the upstream does not know: %v, want not found", err)
	}
	body, err := getFrom(a, "http://web."+strings.TrimSuffix(fakenet.Zone, ".")+"/")
	if err != nil || body != "hello from the internet" {
		t.Fatalf("GET from the sandbox: %q, %v", body, err)
	}
	clients := f.Clients()
	if len(clients) != 1 || !strings.HasPrefix(clients[0], f.Host.String()+":") {
		t.Fatalf("the internet saw %v, want the host's address %v (masqueraded)", clients, f.Host)
	}
	if p.ResolvConf() != "# written by brisk: the worker's DNS forwarder on the sandbox network's gateway\nnameserver "+a.Gateway.String()+"\noptions timeout:2 attempts:2\n" {
		t.Fatalf("resolv.conf %q", p.ResolvConf())
	}
}

// Refused destinations fail at once (a reset or an unreachable, never a
// silent drop): without egress, a denied network, link-local addresses
// (metadata services), the host's own ports.
func TestEgressRefusalsAreRejected(t *testing.T) {
	t.Parallel()
	f := fakenet.Start(t, 31)
	cfg := egressConfig(31, f)
	cfg.Egress = false
	p := startPool(t, cfg, false)
	a := take(t, p)
	refused := func(what, addr string) {
		t.Helper()
		_, err := dialFrom(a.NetNS, addr, 20*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("%s (%s): %v, want refused or unreachable at once", what, addr, err)
		}
	}
	refused("egress off", f.HTTP)
	refused("the host's port", hostListen(t, a.Gateway).Addr().String())

	f2 := fakenet.Start(t, 32)
	cfg2 := egressConfig(32, f2)
	cfg2.EgressDeny = []netip.Prefix{netip.MustParsePrefix("198.18.32.0/24")}
	b := take(t, startPool(t, cfg2, false))
	for _, addr := range []string{f2.HTTP, "169.254.169.254:80"} {
		if _, err := dialFrom(b.NetNS, addr, 20*time.Second); !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("denied %s: %v, want refused or unreachable at once", addr, err)
		}
	}
	// Denied destinations are not reached, but names still resolve.
	if addrs, err := lookupFrom(b, "web."+fakenet.Zone, "udp"); err != nil || len(addrs) != 1 {
		t.Errorf("lookup with the resolver's network denied to sandboxes: %v, %v", addrs, err)
	}
}

// With no upstream answering, the forwarder answers SERVFAIL: a sandbox's
// lookup fails as a server failure, not by waiting out its timeouts.
func TestDNSWithoutUpstreamFailsFast(t *testing.T) {
	t.Parallel()
	cfg := testConfig(33, 0)
	cfg.Egress, cfg.DNS, cfg.DNSUpstreams = true, true, []string{"127.0.0.1:9"} // discard: nothing answers
	a := take(t, startPool(t, cfg, false))
	_, err := lookupFrom(a, "web."+fakenet.Zone, "udp")
	var de *net.DNSError
	if !errors.As(err, &de) || de.IsTimeout || de.IsNotFound {
		t.Fatalf("lookup with no upstream: %v, want a server failure (not a timeout)", err)
	}
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// With forwarding on for egress, a machine that routes the sandboxes'
// subnet to this host still reaches no sandbox: nothing is forwarded into
// the bridge but replies (review finding: sandboxes' ports were open to
// the host's network, past the data plane).
func TestEgressAdmitsNoInboundConnections(t *testing.T) {
	t.Parallel()
	f := fakenet.Start(t, 34)
	cfg := egressConfig(34, f)
	a := take(t, startPool(t, cfg, false))
	ln := listenIn(t, a)
	f.Route(t, cfg.Subnet)
	if c, err := f.Dial("tcp", ln.Addr().String(), blockedWithin); err == nil {
		c.Close()
		t.Fatalf("the internet connected to sandbox %s at %s", a.Name, ln.Addr())
	}
	// The sandbox's own connections out still work (their replies come in).
	if body, err := getFrom(a, "http://"+f.HTTP+"/"); err != nil || body != "hello from the internet" {
		t.Fatalf("sandbox -> internet: %q, %v", body, err)
	}
}

// A namespace's egress policy narrows where its sandboxes go: deny first,
// then only what allow lists (ports per protocol); another namespace's
// sandboxes are untouched; names still resolve; a policy set later applies
// to running sandboxes, cutting their open connections; and a restarted
// worker's pool keeps an adopted sandbox under its policy.
func TestNamespaceEgressPolicy(t *testing.T) {
	t.Parallel()
	f, g := fakenet.Start(t, 35), fakenet.Start(t, 36)
	f81, g81 := f.Listen(t, 81), g.Listen(t, 81)
	f82 := f.Listen(t, 82)
	echo := f.ListenFunc(t, 83, func(c net.Conn) { defer c.Close(); _, _ = io.Copy(c, c) })
	cfg := egressConfig(35, f)
	p := startPool(t, cfg, false)
	a, b := take(t, p), take(t, p)
	for ep, ns := range map[*Endpoint]string{a: "team-a", b: "team-b"} {
		if err := p.Bind(ep, ns); err != nil {
			t.Fatalf("Bind(%s, %s): %v", ep.Name, ns, err)
		}
	}
	policies := map[string]spec.EgressPolicy{
		"team-a": {Allow: []spec.EgressRule{{CIDR: f.Addr.String(), Ports: []string{"80-81"}, Protocol: "tcp"}}},
		"team-b": {Deny: []spec.EgressRule{{CIDR: "198.18.36.0/24"}}},
	}
	if err := p.SetEgress(policies); err != nil {
		t.Fatalf("SetEgress: %v", err)
	}
	reaches := func(ep *Endpoint, addr string, want bool) {
		t.Helper()
		got, err := dialFrom(ep.NetNS, addr, 20*time.Second)
		switch {
		case want && (err != nil || !strings.HasPrefix(got, "port ")):
			t.Errorf("%s -> %s: %q, %v; want reached", ep.Name, addr, got, err)
		case !want && !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH):
			t.Errorf("%s -> %s: %q, %v; want refused at once", ep.Name, addr, got, err)
		}
	}
	reaches(a, f81, true)  // allowed network and port
	reaches(a, f82, false) // allowed network, not the port
	reaches(a, g81, false) // not allowed
	reaches(b, f82, true)  // b's policy allows all but g
	reaches(b, g81, false)
	if addrs, err := lookupFrom(a, "web."+fakenet.Zone, "udp"); err != nil || len(addrs) != 1 {
		t.Errorf("lookup under an allow list without the resolver: %v, %v", addrs, err)
	}
	// An address bound to no namespace goes nowhere.
	unbound, err := p.Take(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	reaches(unbound, f81, false) // left to the restart below, as a is

	// An open connection, then a policy that denies its destination.
	conn := openFrom(t, b, echo)
	policies["team-b"] = spec.EgressPolicy{Deny: []spec.EgressRule{{CIDR: "198.18.35.0/24", Ports: []string{"82-83"}}}}
	delete(policies, "team-a")
	if err := p.SetEgress(policies); err != nil {
		t.Fatalf("SetEgress: %v", err)
	}
	reaches(a, g81, true) // team-a has no policy now
	reaches(b, f82, false)
	reaches(b, g81, true)
	if _, err := conn.Write([]byte("more")); err == nil {
		buf := make([]byte, 16)
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err = conn.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("an open connection to a destination denied since: read %v, want a reset", err)
		}
	}

	// A worker restart: the next pool adopts b's endpoint and keeps it
	// under its policy before any policy is sent again; a's binding goes.
	p.closeHandlesForTest()
	p2 := newPool(t, cfg)
	p2.autoFill = false
	b2, err := p2.Adopt(b.Name)
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if err := p2.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	reaches(b2, f82, false)
	reaches(b2, g81, true)
	if got := p2.egress.bound; len(got) != 1 || got[b.IP] != "team-b" {
		t.Errorf("bindings after the restart: %v, want only %v in team-b", got, b.IP)
	}
	// The control plane's policies arrive again, tightened.
	if err := p2.SetEgress(map[string]spec.EgressPolicy{"team-b": {Allow: []spec.EgressRule{{CIDR: "192.0.2.0/24"}}}}); err != nil {
		t.Fatalf("SetEgress after restart: %v", err)
	}
	reaches(b2, g81, false)
	p2.Release(b2)
	testutil.Eventually(t, 20*time.Second, func() bool {
		p2.egress.mu.Lock()
		defer p2.egress.mu.Unlock()
		return len(p2.egress.bound) == 0
	}, "a released endpoint's binding is removed")
}

// openFrom opens a TCP connection from inside ep's namespace to an echo
// server at addr and checks it echoes.
func openFrom(t *testing.T, ep *Endpoint, addr string) net.Conn {
	t.Helper()
	c, err := dialIn(ep)(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatalf("%s -> %s: %v", ep.Name, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through %s: %q, %v", addr, buf, err)
	}
	return c
}

// A sandbox (with CAP_NET_RAW, or root in its namespace as here) that
// claims an address not its own sends nothing from it: not out under
// another sandbox's namespace's egress policy (a one-way datagram), nor
// from an address no sandbox has. Its own address still works.
func TestSpoofedSourceIsDropped(t *testing.T) {
	t.Parallel()
	f := fakenet.Start(t, 37)
	sink, arrived := f.ListenUDP(t, 9999)
	cfg := egressConfig(37, f)
	p := startPool(t, cfg, false)
	a, b := take(t, p), take(t, p)
	if err := p.Bind(a, "closed"); err != nil {
		t.Fatal(err)
	}
	if err := p.SetEgress(map[string]spec.EgressPolicy{"closed": {Allow: []spec.EgressRule{{CIDR: "192.0.2.0/24"}}}}); err != nil {
		t.Fatal(err)
	}
	send := func(ep *Endpoint, from netip.Addr, msg string) {
		t.Helper()
		err := inNetNS(ep.NetNS, func() error {
			var laddr *net.UDPAddr
			if from.IsValid() {
				laddr = &net.UDPAddr{IP: from.AsSlice()}
			}
			c, err := net.DialUDP("udp4", laddr, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(sink)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(msg))
			return err
		})
		if err != nil && !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Fatalf("send %q: %v", msg, err)
		}
	}
	// a takes b's address, then an unused one, as second addresses.
	h := nsHandle(t, a.NetNS)
	defer h.Close()
	eth0, err := h.LinkByName(sandboxIf)
	if err != nil {
		t.Fatal(err)
	}
	unused := addrAt(cfg.Subnet, 200)
	for _, ip := range []netip.Addr{b.IP, unused} {
		if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: p.ipNet(ip)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		send(a, netip.Addr{}, fmt.Sprint("a as itself ", i))
		send(a, b.IP, fmt.Sprint("a as b ", i))
		send(a, unused, fmt.Sprint("a as nobody ", i))
	}
	// b's own datagram, sent last, arrives: what a sent has had its chance.
	testutil.Eventually(t, 20*time.Second, func() bool {
		send(b, netip.Addr{}, "b")
		return slices.Contains(arrived(), "b")
	}, "b's datagram arrives")
	if got := slices.DeleteFunc(arrived(), func(s string) bool { return s == "b" }); len(got) > 0 {
		t.Fatalf("the internet got %q from a sandbox held to 192.0.2.0/24", got)
	}
}

// With Ingress, hosts of the networks it lists (data planes on other
// hosts) that route the pool's subnet here connect to sandboxes and get
// their replies, with egress off and with a namespace policy that allows
// nothing; a host of another network still connects to none.
func TestIngressAdmitsDataPlanesOnly(t *testing.T) {
	t.Parallel()
	dp, other := fakenet.Start(t, 38), fakenet.Start(t, 39)
	cfg := testConfig(38, 0)
	cfg.Ingress = []netip.Prefix{netip.PrefixFrom(dp.Addr, 32)}
	p := startPool(t, cfg, false)
	a := take(t, p)
	ln := listenIn(t, a)
	dp.Route(t, cfg.Subnet)
	other.Route(t, cfg.Subnet)
	read := func(f *fakenet.Net) (string, error) {
		c, err := f.Dial("tcp", ln.Addr().String(), blockedWithin)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(blockedWithin))
		b, err := io.ReadAll(c)
		return string(b), err
	}
	if got, err := read(dp); err != nil || got != "hello from "+a.Name {
		t.Fatalf("data plane -> sandbox: %q, %v; want the sandbox's greeting", got, err)
	}
	if c, err := other.Dial("tcp", ln.Addr().String(), blockedWithin); err == nil {
		c.Close()
		t.Fatalf("a host outside Ingress connected to sandbox %s at %s", a.Name, ln.Addr())
	}
	// The sandbox's namespace allows no egress at all: replies to the
	// data plane are no egress, and still go back.
	if err := p.Bind(a, "team-a"); err != nil {
		t.Fatal(err)
	}
	if err := p.SetEgress(map[string]spec.EgressPolicy{"team-a": {Allow: []spec.EgressRule{{CIDR: "192.0.2.1"}}}}); err != nil {
		t.Fatal(err)
	}
	if got, err := read(dp); err != nil || got != "hello from "+a.Name {
		t.Fatalf("data plane -> sandbox under a closed egress policy: %q, %v", got, err)
	}
}

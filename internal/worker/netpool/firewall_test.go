package netpool

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// Blocked connects must fail within this; allowed ones get far longer.
const (
	blockedWithin = 700 * time.Millisecond
	allowedWithin = 5 * time.Second
)

// The attack of issue 18: a sandbox learns addresses (the admin API's
// port on the host, another function's sandbox) and connects to them.

func TestFirewallSandboxCannotReachHost(t *testing.T) {
	t.Parallel()
	cfg := testConfig(19, 0)
	other := hostAddress(t, 19) // a host address besides the gateway
	p := startPool(t, cfg, false)
	a := take(t, p)

	for _, ip := range []netip.Addr{a.Gateway, other} {
		ln := hostListen(t, ip)
		if got, err := dialFrom(a.NetNS, ln.Addr().String(), blockedWithin); err == nil {
			t.Errorf("sandbox %s reached the host's %s (%q)", a.Name, ln.Addr(), got)
		}
		// The host itself still connects to its own listener.
		if _, err := dialFrom("", ln.Addr().String(), allowedWithin); err != nil {
			t.Errorf("host -> %s: %v", ln.Addr(), err)
		}
	}
	// The host reaches the sandbox, and the sandbox's replies come back.
	ln := listenIn(t, a)
	if got, err := dialFrom("", ln.Addr().String(), allowedWithin); err != nil || got != "hello from "+a.Name {
		t.Errorf("host -> sandbox %s: %q, %v", ln.Addr(), got, err)
	}
}

func TestFirewallAllowHostPorts(t *testing.T) {
	t.Parallel()
	cfg := testConfig(20, 0)
	ip := hostAddress(t, 20)
	allowed, denied := hostListen(t, ip), hostListen(t, ip)
	cfg.AllowHostPorts = []uint16{port(allowed)}
	p := startPool(t, cfg, false)
	a := take(t, p)

	if got, err := dialFrom(a.NetNS, allowed.Addr().String(), allowedWithin); err != nil || got != "hello from host" {
		t.Errorf("sandbox -> allowed %s: %q, %v", allowed.Addr(), got, err)
	}
	if got, err := dialFrom(a.NetNS, denied.Addr().String(), blockedWithin); err == nil {
		t.Errorf("sandbox reached %s (%q), not in AllowHostPorts %v", denied.Addr(), got, cfg.AllowHostPorts)
	}
}

// A host that routes between its bridge's ports (forwarding on, and
// proxy ARP for private VLANs, which answers the sandboxes' ARP for each
// other with the host's address) would carry one sandbox's connection to
// another through the gateway, port isolation notwithstanding.
func TestFirewallSandboxesCannotReachEachOtherThroughTheHost(t *testing.T) {
	t.Parallel()
	cfg := testConfig(21, 0)
	p := startPool(t, cfg, false)
	a, b := take(t, p), take(t, p)
	for _, kv := range [][2]string{
		{"ipv4/conf/" + cfg.Bridge + "/forwarding", "1"},
		{"ipv4/conf/" + cfg.Bridge + "/proxy_arp_pvlan", "1"},
		{"ipv4/conf/" + cfg.Bridge + "/send_redirects", "0"},
		{"ipv4/neigh/" + cfg.Bridge + "/proxy_delay", "0"},
	} { // the bridge's own settings: they go with it
		writeSysctl(t, kv[0], kv[1])
	}
	checkSandboxesApart(t, a, b)
}

// Port isolation (build sets it) keeps frames from one sandbox's port to
// another's; the bridge table drops them if it were lost.
func TestFirewallSandboxesCannotReachEachOtherOverTheBridge(t *testing.T) {
	t.Parallel()
	cfg := testConfig(22, 0)
	p := startPool(t, cfg, false)
	a, b := take(t, p), take(t, p)
	for _, ep := range []*Endpoint{a, b} {
		l, err := netlink.LinkByName(ep.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		mustDo(t, netlink.LinkSetIsolated(l, false))
	}
	checkSandboxesApart(t, a, b)
	// Where br_netfilter hands bridged IPv4 to the inet table, the forward
	// rule there drops the connection too; ARP shows the bridge table at
	// work on its own: a never learned b's MAC address.
	h := nsHandle(t, a.NetNS)
	defer h.Close()
	neighs, err := retryDump(func() ([]netlink.Neigh, error) { return h.NeighList(0, netlink.FAMILY_V4) })
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if n.IP.Equal(b.IP.AsSlice()) && len(n.HardwareAddr) > 0 && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 {
			t.Errorf("%s resolved %s's address %v to %v (state %#x) over the bridge", a.Name, b.Name, b.IP, n.HardwareAddr, n.State)
		}
	}
}

func checkSandboxesApart(t *testing.T, a, b *Endpoint) {
	t.Helper()
	lnA, lnB := listenIn(t, a), listenIn(t, b)
	for _, c := range []struct {
		from *Endpoint
		to   net.Listener
	}{{a, lnB}, {b, lnA}} {
		if got, err := dialFrom(c.from.NetNS, c.to.Addr().String(), blockedWithin); err == nil {
			t.Errorf("sandbox %s reached sandbox %s (%q)", c.from.Name, c.to.Addr(), got)
		}
	}
	for _, c := range []struct {
		ep *Endpoint
		ln net.Listener
	}{{a, lnA}, {b, lnB}} {
		if got, err := dialFrom("", c.ln.Addr().String(), allowedWithin); err != nil || got != "hello from "+c.ep.Name {
			t.Errorf("host -> sandbox %s: %q, %v", c.ln.Addr(), got, err)
		}
	}
}

// The rules come with Start and go with Close (assertNoLeaks checks that
// after every test); a restarted pool replaces its predecessor's without
// duplicates; another table, even one named like the pool's, is never
// touched.
func TestFirewallLifecycle(t *testing.T) {
	t.Parallel()
	cfg := testConfig(23, 1)
	foreign := &nftables.Table{Name: firewallTable(cfg.NamePrefix) + "x", Family: nftables.TableFamilyINet}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.AddTable(foreign)
	c.AddChain(&nftables.Chain{Name: "input", Table: foreign, Hooknum: nftables.ChainHookInput,
		Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter})
	mustDo(t, c.Flush())
	t.Cleanup(func() {
		c.DelTable(foreign)
		if err := c.Flush(); err != nil {
			t.Errorf("foreign table was removed: %v", err)
		}
	})

	// input: established, reject (TCP and the rest); forward: drops of
	// other than IPv4 and of forged sources, rejects (TCP and the rest) of
	// other sandboxes, link-local and, without Egress, everything, then
	// replies into the bridge accepted and the rest dropped.
	want := map[string]int{"inet/input": 3, "inet/forward": 10, "bridge/forward": 1, "bridge/prerouting": 2}
	old := startPool(t, cfg, false)
	if got := firewallRules(t, cfg.NamePrefix); !maps.Equal(got, want) {
		t.Fatalf("after Start: rules %v, want %v", got, want)
	}
	take(t, old)
	old.closeHandlesForTest() // the worker dies; its rules stay and protect its sandboxes

	p := startPool(t, cfg, false)
	if got := firewallRules(t, cfg.NamePrefix); !maps.Equal(got, want) {
		t.Fatalf("after a restart: rules %v, want %v (no duplicates)", got, want)
	}
	if tables := firewallLeftovers(t, cfg.NamePrefix); len(tables) != 2 {
		t.Fatalf("after a restart: tables %v, want one inet and one bridge", tables)
	}
	if err := p.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l := firewallLeftovers(t, cfg.NamePrefix); len(l) > 0 {
		t.Fatalf("after Close: %v", l)
	}
	if _, err := c.ListTableOfFamily(foreign.Name, foreign.Family); err != nil {
		t.Fatalf("foreign table: %v", err)
	}

	// NoFirewall: nothing installed.
	cfg.NoFirewall = true
	startPool(t, cfg, false)
	cfg.NoFirewall = false
	if l := firewallLeftovers(t, cfg.NamePrefix); len(l) > 0 {
		t.Fatalf("NoFirewall pool installed %v", l)
	}
}

func TestAllowHostPortsValidation(t *testing.T) {
	for _, cfg := range []Config{
		{AllowHostPorts: []uint16{80, 0}},
		{AllowHostPorts: []uint16{80}, NoFirewall: true},
	} {
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// hostAddress gives the host an address of its own besides the pools'
// gateways, on a veth pair of the test's (the kernel may lack dummy links)
// that goes nowhere: the sandboxes must not reach any host address.
func hostAddress(t *testing.T, n int) netip.Addr {
	t.Helper()
	name := fmt.Sprintf("btha%d", n)
	_ = deleteLink(name)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	mustDo(t, netlink.LinkAdd(veth))
	t.Cleanup(func() {
		if err := deleteLink(name); err != nil {
			t.Errorf("delete %s: %v", name, err)
		}
	})
	ip := netip.MustParseAddr(fmt.Sprintf("10.216.%d.1", n))
	mustDo(t, netlink.AddrAdd(veth, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}))
	mustDo(t, netlink.LinkSetUp(veth))
	return ip
}

// hostListen listens on ip in the host's namespace and greets each
// connection with "hello from host".
func hostListen(t *testing.T, ip netip.Addr) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, testutil.Greet("hello from host"))
	return ln
}

func port(ln net.Listener) uint16 { return uint16(ln.Addr().(*net.TCPAddr).Port) }

// dialFrom connects to addr from the namespace at nsPath ("" for the
// host's) and returns the greeting.
func dialFrom(nsPath, addr string, timeout time.Duration) (string, error) {
	var got []byte
	dial := func() error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		got, err = io.ReadAll(c)
		return err
	}
	if nsPath == "" {
		err := dial()
		return string(got), err
	}
	err := inNetNS(nsPath, dial)
	return string(got), err
}

func writeSysctl(t *testing.T, key, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join("/proc/sys/net", key), []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
}

// firewallLeftovers lists the tables of the prefix's firewall present.
func firewallLeftovers(t *testing.T, prefix string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, tb := range tables {
		if tb.Name == firewallTable(prefix) {
			left = append(left, "nftables "+familyName(tb.Family)+" "+tb.Name)
		}
	}
	slices.Sort(left)
	return left
}

// firewallRules counts the rules of the prefix's tables by family/chain.
func firewallRules(t *testing.T, prefix string) map[string]int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != firewallTable(prefix) {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		got[familyName(ch.Table.Family)+"/"+ch.Name] += len(rules)
	}
	return got
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return strconv.Itoa(int(f))
}

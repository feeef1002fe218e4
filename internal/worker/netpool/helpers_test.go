package netpool

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// Every root test gets its own n: prefix "bt<n>", bridge "btbr<n>" and subnet
// 10.212.<n>.0/24, so tests (and other packages' tests) can run in parallel.
func testConfig(n, size int) Config {
	return Config{
		Size:       size,
		Bridge:     fmt.Sprintf("btbr%d", n),
		Subnet:     netip.MustParsePrefix(fmt.Sprintf("10.212.%d.0/24", n)),
		NamePrefix: fmt.Sprintf("bt%d", n),
	}
}

// startPool starts a pool for cfg and registers Close and the leak check.
// autoFill false leaves the refiller off, for tests that count exactly.
func startPool(t *testing.T, cfg Config, autoFill bool) *Pool {
	t.Helper()
	p := newPool(t, cfg)
	p.autoFill = autoFill
	if err := p.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return p
}

// newPool returns an unstarted pool whose Close and leak check run at the
// end of the test.
func newPool(t *testing.T, cfg Config) *Pool {
	t.Helper()
	testutil.RequiresRoot(t)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		assertNoLeaks(t, cfg)
	})
	return p
}

// assertNoLeaks fails the test if any namespace file, bind mount, link or
// bridge of cfg's prefix is left on the host.
func assertNoLeaks(t *testing.T, cfg Config) {
	t.Helper()
	if l := leftovers(t, cfg); len(l) > 0 {
		t.Errorf("leaked: %s", strings.Join(l, ", "))
	}
}

func leftovers(t *testing.T, cfg Config) []string {
	t.Helper()
	cfg = cfg.withDefaults()
	match := nameRE(cfg.NamePrefix)
	var left []string
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if match.MatchString(e.Name()) {
			left = append(left, "netns file "+e.Name())
		}
	}
	links, err := retryDump(netlink.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if n := l.Attrs().Name; match.MatchString(n) || n == cfg.Bridge {
			left = append(left, "link "+n)
		}
	}
	if !cfg.NoFirewall {
		left = append(left, firewallLeftovers(t, cfg.NamePrefix)...)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text()) // field 5 is the mount point
		if len(fields) > 4 && strings.HasPrefix(fields[4], "/run/netns/") && match.MatchString(strings.TrimPrefix(fields[4], "/run/netns/")) {
			left = append(left, "mount "+fields[4])
		}
	}
	return left
}

// nsHandle opens a netlink socket inside the namespace at path.
func nsHandle(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	var h *netlink.Handle
	err := inNetNS(path, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		t.Fatalf("netlink socket in %s: %v", path, err)
	}
	return h
}

// checkEndpoint asserts ep is configured as build leaves it: host veth up on
// the bridge; inside, only lo and eth0, both up, eth0 with exactly ep.IP and
// a default route via the gateway.
func checkEndpoint(t *testing.T, p *Pool, ep *Endpoint) {
	t.Helper()
	host, err := netlink.LinkByName(ep.HostVeth)
	if err != nil {
		t.Fatalf("%s: host veth: %v", ep.Name, err)
	}
	if a := host.Attrs(); a.MasterIndex != p.bridgeIndex || a.Flags&net.FlagUp == 0 {
		t.Errorf("%s: host veth master %d (bridge %d), flags %v", ep.Name, a.MasterIndex, p.bridgeIndex, a.Flags)
	}
	if ep.NetNS != netnsDir+"/"+ep.Name {
		t.Errorf("NetNS %q, want %s/%s", ep.NetNS, netnsDir, ep.Name)
	}
	h := nsHandle(t, ep.NetNS)
	defer h.Close()
	links, err := retryDump(h.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
		if l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("%s: %s is down", ep.Name, l.Attrs().Name)
		}
	}
	if strings.Join(names, ",") != "lo,eth0" {
		t.Errorf("%s: links %v, want [lo eth0]", ep.Name, names)
	}
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return h.AddrList(eth0, netlink.FAMILY_V4) })
	if err != nil {
		t.Fatal(err)
	}
	want := netip.PrefixFrom(ep.IP, p.cfg.Subnet.Bits()).String()
	if len(addrs) != 1 || addrs[0].IPNet.String() != want {
		t.Errorf("%s: eth0 addresses %v, want [%s]", ep.Name, addrs, want)
	}
	routes, err := retryDump(func() ([]netlink.Route, error) { return h.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	for _, r := range routes {
		if isDefault(r) {
			defaults = append(defaults, r.Gw.String())
		} else if r.Protocol != unix.RTPROT_KERNEL {
			t.Errorf("%s: stray route %v", ep.Name, r)
		}
	}
	if len(defaults) != 1 || defaults[0] != ep.Gateway.String() {
		t.Errorf("%s: default routes via %v, want via %v", ep.Name, defaults, ep.Gateway)
	}
}

// closeHandlesForTest stands in for a worker process dying: the kernel
// closes its sockets, and nothing else of the pool's is released.
func (p *Pool) closeHandlesForTest() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for r := range p.all {
		if r.nsh != nil {
			r.nsh.Close()
			r.nsh = nil
		}
	}
}

// inNetNS runs f on an OS thread inside the namespace at path; sockets f
// opens belong to that namespace.
func inNetNS(path string, f func() error) error { return testutil.InNetNS(path, f) }

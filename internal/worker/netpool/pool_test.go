package netpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// waitStats polls until cond holds for the pool's Stats.
func waitStats(t *testing.T, p *Pool, what string, cond func(Stats) bool) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool { return cond(p.Stats()) }, "%s; stats %+v", what, statsOf(p))
}

// statsOf defers reading Stats until the failure message is formatted.
type statsOf *Pool

// take takes an endpoint and binds it to the default namespace, as a
// runtime does before its sandbox runs.
func take(t *testing.T, p *Pool) *Endpoint {
	t.Helper()
	ep, err := p.Take(t.Context())
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if err := p.Bind(ep, "default"); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	return ep
}

func TestPrefillToSize(t *testing.T) {
	t.Parallel()
	cfg := testConfig(1, 4)
	p := startPool(t, cfg, true)
	if s := p.Stats(); s.Ready != 4 || s.Created != 4 || s.CreatedOnDemand != 0 || s.InUse != 0 {
		t.Fatalf("after Start: %+v, want 4 ready and created", s)
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if nameRE(cfg.NamePrefix).MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	if len(names) != 4 {
		t.Errorf("namespaces %v, want 4", names)
	}
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		t.Fatalf("bridge: %v", err)
	}
	addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.212.1.1/24" {
		t.Errorf("bridge addresses %v, want [10.212.1.1/24]", addrs)
	}
}

func TestTakeReturnsDistinctConfiguredEndpoints(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(2, 5), true)
	seen := map[netip.Addr]string{}
	for range 5 {
		ep := take(t, p)
		if prev, dup := seen[ep.IP]; dup {
			t.Fatalf("%s and %s share %v", prev, ep.Name, ep.IP)
		}
		seen[ep.IP] = ep.Name
		if !p.cfg.Subnet.Contains(ep.IP) || ep.IP == ep.Gateway {
			t.Errorf("%s: IP %v outside %v or the gateway", ep.Name, ep.IP, p.cfg.Subnet)
		}
		if ep.Gateway.String() != "10.212.2.1" || ep.HostVeth != ep.Name {
			t.Errorf("%s: gateway %v host veth %s", ep.Name, ep.Gateway, ep.HostVeth)
		}
		checkEndpoint(t, p, ep)
	}
	if s := p.Stats(); s.InUse != 5 {
		t.Errorf("InUse %d, want 5", s.InUse)
	}
}

func TestExhaustedPoolCreatesOnDemand(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(3, 2), false)
	for range 5 {
		checkEndpoint(t, p, take(t, p))
	}
	if s := p.Stats(); s.Created != 5 || s.CreatedOnDemand != 3 || s.Ready != 0 || s.InUse != 5 {
		t.Errorf("stats %+v, want 5 created, 3 on demand, 5 in use", s)
	}
}

func TestSubnetExhaustion(t *testing.T) {
	t.Parallel()
	cfg := testConfig(4, 0)
	cfg.Subnet = netip.MustParsePrefix("10.212.4.0/30") // gateway .1, one sandbox .2
	p := startPool(t, cfg, true)
	ep := take(t, p)
	if _, err := p.Take(t.Context()); !errors.Is(err, ErrExhausted) {
		t.Fatalf("second Take: %v, want ErrExhausted", err)
	}
	p.Release(ep) // Size 0: destroyed, and its address freed
	waitStats(t, p, "endpoint destroyed", func(s Stats) bool { return s.Destroyed == 1 })
	if ep2 := take(t, p); ep2.IP != ep.IP {
		t.Errorf("freed address not reused: got %v, want %v", ep2.IP, ep.IP)
	}
}

func TestRefillAfterTakes(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(5, 3), true)
	for range 3 {
		take(t, p)
	}
	waitStats(t, p, "refilled to Size", func(s Stats) bool { return s.Ready == 3 && s.InUse == 3 })
	if s := p.Stats(); s.Created != 6 || s.CreatedOnDemand != 0 {
		t.Errorf("stats %+v, want 6 created, none on demand", s)
	}
}

func TestReleaseRecyclesClean(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(6, 2), false)
	ep := take(t, p)

	// Dirty it as a sandbox with CAP_NET_ADMIN could.
	h := nsHandle(t, ep.NetNS)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	mustDo(t, h.AddrAdd(eth0, &netlink.Addr{IPNet: mustCIDR("10.99.0.1/32")}))
	mustDo(t, h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: mustCIDR("10.98.0.0/16"), Gw: ep.Gateway.AsSlice()}))
	mustDo(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "stray0"}, PeerName: "stray1"}))
	mustDo(t, h.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: ep.Gateway.AsSlice()}))
	mustDo(t, h.LinkSetDown(eth0))
	h.Close()

	p.Release(ep)
	waitStats(t, p, "endpoint recycled", func(s Stats) bool { return s.Recycled == 1 && s.Ready == 2 })
	var again *Endpoint
	for range 2 {
		if e := take(t, p); e.Name == ep.Name {
			again = e
		}
	}
	if again == nil {
		t.Fatalf("recycled %s did not come back", ep.Name)
	}
	if again.IP != ep.IP || again.NetNS != ep.NetNS {
		t.Errorf("recycled endpoint changed: %+v, was %+v", again, ep)
	}
	checkEndpoint(t, p, again)
	if s := p.Stats(); s.Created != 2 || s.Destroyed != 0 {
		t.Errorf("stats %+v, want nothing created or destroyed by the recycle", s)
	}
}

func TestReleaseIsIdempotentPerLease(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(7, 1), false)
	first := take(t, p)
	p.Release(first)
	p.Release(first)
	waitStats(t, p, "recycled once", func(s Stats) bool { return s.Recycled == 1 && s.Ready == 1 })
	second := take(t, p)
	if second.Name != first.Name {
		t.Fatalf("took %s, want the recycled %s", second.Name, first.Name)
	}
	p.Release(first) // stale lease: must not take the endpoint from its new holder
	p.Release(nil)
	p.Release(&Endpoint{Name: "forged"})
	if s := p.Stats(); s.InUse != 1 || s.Ready != 0 || s.Recycled != 1 {
		t.Errorf("stale releases changed the pool: %+v", s)
	}
}

// The bridge keeps one MAC address while endpoints join and leave: the
// sandboxes' neighbour caches hold it, and a change drops their replies.
func TestBridgeMACStaysAsEndpointsComeAndGo(t *testing.T) {
	t.Parallel()
	cfg := testConfig(18, 2)
	cfg.MaxReady = 2
	p := startPool(t, cfg, true)
	mac := func() string {
		br, err := netlink.LinkByName(cfg.Bridge)
		if err != nil {
			t.Fatalf("bridge: %v", err)
		}
		return br.Attrs().HardwareAddr.String()
	}
	if b, err := os.ReadFile("/sys/class/net/" + cfg.Bridge + "/addr_assign_type"); err != nil || strings.TrimSpace(string(b)) != "3" {
		t.Errorf("bridge addr_assign_type %q (%v), want 3 (set)", b, err)
	}
	want := mac()
	var held []*Endpoint
	for i := 0; i < 12; i++ { // the pool holds 2: most are created now
		held = append(held, take(t, p))
		if got := mac(); got != want {
			t.Fatalf("bridge MAC %s after endpoint %d joined, was %s", got, i+1, want)
		}
	}
	for i, ep := range held { // beyond MaxReady: destroyed
		p.Release(ep)
		waitStats(t, p, "release", func(s Stats) bool { return s.InUse == int64(len(held)-i-1) })
		if got := mac(); got != want {
			t.Fatalf("bridge MAC %s after %d endpoints left, was %s", got, i+1, want)
		}
	}
	waitStats(t, p, "surplus destroyed", func(s Stats) bool { return s.Destroyed >= 8 })
	if got := mac(); got != want {
		t.Fatalf("bridge MAC %s after endpoints were destroyed, was %s", got, want)
	}
}

func TestReleaseBeyondMaxReadyDestroys(t *testing.T) {
	t.Parallel()
	cfg := testConfig(8, 1)
	cfg.MaxReady = 1
	p := startPool(t, cfg, false)
	a, b := take(t, p), take(t, p) // b on demand
	p.Release(a)
	waitStats(t, p, "a recycled", func(s Stats) bool { return s.Recycled == 1 && s.Ready == 1 })
	p.Release(b)
	waitStats(t, p, "b destroyed", func(s Stats) bool { return s.Destroyed == 1 })
	if _, err := os.Stat(b.NetNS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists: %v", b.NetNS, err)
	}
	if _, err := netlink.LinkByName(b.HostVeth); err == nil {
		t.Errorf("host veth %s still exists", b.HostVeth)
	}
}

func TestConcurrentTakesGetDistinctEndpoints(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(9, 20), true)
	const n = 50
	eps := make([]*Endpoint, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { eps[i], errs[i] = p.Take(t.Context()) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	names, ips := map[string]bool{}, map[netip.Addr]bool{}
	for _, ep := range eps {
		if names[ep.Name] || ips[ep.IP] {
			t.Fatalf("endpoint %s (%v) handed out twice", ep.Name, ep.IP)
		}
		names[ep.Name], ips[ep.IP] = true, true
	}
	// 20 came from the pool; the rest were created on demand or by the
	// refiller racing the takers. Every endpoint is accounted for.
	s := p.Stats()
	if s.InUse != n || s.Created != s.InUse+s.Ready || s.CreatedOnDemand == 0 {
		t.Errorf("stats %+v, want %d in use, created = in use + ready, some on demand", s, n)
	}
	for _, ep := range eps {
		wg.Go(func() { p.Release(ep) })
	}
	wg.Wait()
	waitStats(t, p, "all released", func(s Stats) bool {
		return s.InUse == 0 && s.Recycled+s.Destroyed >= n && s.Ready >= 20
	})
	checkEndpoint(t, p, take(t, p))
}

func TestHostReachesSandboxOverTCP(t *testing.T) {
	t.Parallel()
	p := startPool(t, testConfig(10, 2), false)
	a, b := take(t, p), take(t, p)
	lnA := listenIn(t, a)

	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(t.Context(), "tcp", lnA.Addr().String())
	if err != nil {
		t.Fatalf("host -> %s: %v", lnA.Addr(), err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello from "+a.Name {
		t.Fatalf("read %q, %v", got, err)
	}

	// Bridge ports are isolated: another sandbox cannot reach a's listener.
	err = inNetNS(b.NetNS, func() error {
		d := net.Dialer{Timeout: 500 * time.Millisecond}
		c, err := d.Dial("tcp", lnA.Addr().String())
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("%s reached %s directly; bridge ports should be isolated", b.Name, a.Name)
	}
}

// listenIn starts a TCP listener on ep.IP inside ep's namespace that greets
// each connection and closes it.
func listenIn(t *testing.T, ep *Endpoint) net.Listener {
	t.Helper()
	var ln net.Listener
	err := inNetNS(ep.NetNS, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(ep.IP, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", ep.Name, err)
	}
	testutil.ServeConns(t, ln, testutil.Greet("hello from "+ep.Name))
	return ln
}

func TestCleanupRemovesLeftoversOfUnclosedPool(t *testing.T) {
	t.Parallel()
	cfg := testConfig(11, 3)
	p := startPool(t, cfg, false)
	take(t, p)
	take(t, p)
	take(t, p)
	take(t, p) // on demand
	p.closeHandlesForTest()
	if l := leftovers(t, cfg); len(l) != 4*3+1+2 { // per endpoint file, mount, veth; plus the bridge and the firewall's two tables
		t.Fatalf("before Cleanup: %d leftovers %v, want 15", len(l), l)
	}
	if err := Cleanup(t.Context(), cfg); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	assertNoLeaks(t, cfg)
}

func TestStartReapsLeftovers(t *testing.T) {
	t.Parallel()
	cfg := testConfig(12, 3)
	old := startPool(t, cfg, false)
	for range 4 {
		take(t, old)
	}
	old.closeHandlesForTest()

	cfg.Size = 1
	p := startPool(t, cfg, false)
	l := leftovers(t, cfg)
	slices.Sort(l)
	want := []string{"link bt12-2", "link btbr12", "mount /run/netns/bt12-2", "netns file bt12-2",
		"nftables bridge brisk_netpool_bt12", "nftables inet brisk_netpool_bt12"}
	if !slices.Equal(l, want) {
		t.Errorf("after the new pool's Start: %v, want only its own %v", l, want)
	}
	checkEndpoint(t, p, take(t, p))
}

func TestCloseLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	cfg := testConfig(13, 3)
	p := startPool(t, cfg, true)
	a := take(t, p)
	take(t, p)
	p.Release(a)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	assertNoLeaks(t, cfg)
	s := p.Stats()
	if s.Created != s.Destroyed || s.Ready != 0 || s.InUse != 0 {
		t.Errorf("after Close: %+v, want every created endpoint destroyed", s)
	}
	if _, err := p.Take(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Take after Close: %v, want ErrClosed", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestTakeBeforeStart(t *testing.T) {
	p := newPool(t, testConfig(14, 1))
	if _, err := p.Take(t.Context()); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Take before Start: %v, want ErrNotStarted", err)
	}
}

func TestTeardownFailureResumesAtTheFailedStep(t *testing.T) {
	t.Parallel()
	cfg := testConfig(15, 1)
	cfg.MaxReady = 1
	p := newPool(t, cfg)
	var (
		armed    atomic.Bool
		mu       sync.Mutex
		steps    []string
		failures int
	)
	p.faultHook = func(name, step string) error {
		if !armed.Load() {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, name+" "+step)
		if step == "remove" && failures < 2 {
			failures++
			return fmt.Errorf("injected failure %d", failures)
		}
		return nil
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := take(t, p)
	waitStats(t, p, "refilled", func(s Stats) bool { return s.Ready == 1 })
	armed.Store(true)
	p.Release(a) // Ready is at MaxReady: a is destroyed, and removal fails twice
	waitStats(t, p, "a destroyed after retries", func(s Stats) bool { return s.Destroyed == 1 })
	mu.Lock()
	defer mu.Unlock()
	n := a.Name
	want := []string{n + " veth", n + " unmount", n + " remove", n + " remove", n + " remove"}
	if !slices.Equal(steps, want) {
		t.Errorf("teardown steps %v, want %v", steps, want)
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

func TestCloseRetriesUntilTeardownSucceeds(t *testing.T) {
	t.Parallel()
	cfg := testConfig(16, 2)
	p := newPool(t, cfg)
	var failing atomic.Bool
	p.faultHook = func(_, step string) error {
		if step == "unmount" && failing.Load() {
			return errors.New("injected unmount failure")
		}
		return nil
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	take(t, p)
	failing.Store(true)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); err == nil {
		t.Fatal("Close succeeded although every unmount fails")
	}
	if l := leftovers(t, cfg); len(l) == 0 {
		t.Fatal("nothing left after a failed Close")
	}
	failing.Store(false)
	if err := p.Close(t.Context()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	assertNoLeaks(t, cfg)
}

// A restarted worker adopts the endpoint of a sandbox that still runs: the
// new pool's Start reaps every other leftover but keeps it (the sandbox
// stays reachable at its address), never hands its address out again while
// it is leased, and destroys it on Release; Adopt refuses what it cannot
// take over.
func TestAdoptKeepsARunningSandboxsEndpoint(t *testing.T) {
	t.Parallel()
	cfg := testConfig(17, 2)
	old := startPool(t, cfg, false)
	a, b := take(t, old), take(t, old)
	lnA := listenIn(t, a) // the sandbox still running in a
	old.closeHandlesForTest()

	p := newPool(t, cfg)
	p.autoFill = false
	ad, err := p.Adopt(a.Name)
	if err != nil {
		t.Fatalf("Adopt(%s): %v", a.Name, err)
	}
	if ad.Name != a.Name || ad.IP != a.IP || ad.NetNS != a.NetNS || ad.HostVeth != a.HostVeth || ad.Gateway != a.Gateway {
		t.Fatalf("adopted %+v, was %+v", ad, a)
	}
	for _, bad := range []string{a.Name, "bt17-200", "bt170-2", "other-3", "bt17-x"} {
		if _, err := p.Adopt(bad); err == nil {
			t.Errorf("Adopt(%q) succeeded", bad)
		}
	}
	if err := p.Start(t.Context()); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := p.Adopt(b.Name); err == nil {
		t.Error("Adopt after Start succeeded")
	}
	// Start reaped every other leftover (b among them) and made Size fresh
	// endpoints: the namespaces on the host are a's and those two.
	fresh := []*Endpoint{take(t, p), take(t, p)}
	want := []string{"netns file " + a.Name}
	for _, ep := range fresh {
		want = append(want, "netns file "+ep.Name)
	}
	var files []string
	for _, l := range leftovers(t, cfg) {
		if strings.HasPrefix(l, "netns file ") {
			files = append(files, l)
		}
	}
	slices.Sort(files)
	slices.Sort(want)
	if !slices.Equal(files, want) {
		t.Fatalf("namespaces after Start: %v, want %v", files, want)
	}
	if st := p.Stats(); st.Created != 2 || st.InUse != 3 {
		t.Fatalf("stats %+v: want 2 created, 3 in use (adopted + 2 taken)", st)
	}
	c, err := net.DialTimeout("tcp", lnA.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("the adopted sandbox is unreachable: %v", err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "hello from "+a.Name {
		t.Fatalf("adopted sandbox said %q", got)
	}
	for _, ep := range append(fresh, take(t, p), take(t, p)) {
		if ep.IP == a.IP || ep.Name == a.Name {
			t.Fatalf("took %s (%v), the adopted endpoint's address", ep.Name, ep.IP)
		}
		checkEndpoint(t, p, ep)
	}
	st := p.Stats()
	p.Release(ad)
	waitStats(t, p, "adopted endpoint destroyed on release", func(s Stats) bool {
		return s.InUse == st.InUse-1 && s.Destroyed == st.Destroyed+1
	})
}

package netpool

import (
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// query is a DNS query for name, id id.
func query(t *testing.T, id uint16, name string) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// silentUpstream reads queries and never answers.
func silentUpstream(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := c.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return c.LocalAddr().String()
}

// ask sends q from local to the forwarder and returns the reply's rcode,
// or false with no reply within wait.
func ask(t *testing.T, local, fwd netip.AddrPort, q []byte, wait time.Duration) (dnsmessage.RCode, bool) {
	t.Helper()
	c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(local), net.UDPAddrFromAddrPort(fwd))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		return 0, false
	}
	var p dnsmessage.Parser
	h, err := p.Start(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return h.RCode, true
}

// The forwarder answers sandboxes only (its subnet, not its own address:
// a forged source would make it reflect replies at others), and one
// sandbox's flood takes only its own share of the slots.
func TestDNSForwarderSourcesAndShares(t *testing.T) {
	gw := netip.MustParseAddr("127.0.0.1")
	f, err := startDNS(gw, netip.MustParsePrefix("127.0.0.0/8"), []string{silentUpstream(t)}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	fwd := netip.AddrPortFrom(gw, f.port())
	if _, ok := ask(t, netip.AddrPortFrom(gw, 0), fwd, query(t, 1, "a.example."), 3*dnsUpstreamWait); ok {
		t.Fatal("the forwarder answered a query from its own address")
	}
	if rc, ok := ask(t, netip.MustParseAddrPort("127.0.0.2:0"), fwd, query(t, 2, "a.example."), 3*dnsUpstreamWait); !ok || rc != dnsmessage.RCodeServerFailure {
		t.Fatalf("a sandbox's query with no upstream answering: %v %v, want SERVFAIL", rc, ok)
	}
	// 127.0.0.3 fills its share with queries the upstream never answers.
	flood, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.3:0")), net.UDPAddrFromAddrPort(fwd))
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	for i := range 4 * dnsPerSourceInFlight {
		if _, err := flood.Write(query(t, uint16(100+i), "flood.example.")); err != nil {
			t.Fatal(err)
		}
	}
	flooder := netip.MustParseAddr("127.0.0.3")
	testutil.Eventually(t, 10*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.queries[flooder] == dnsPerSourceInFlight
	}, "the flooding sandbox at its share of queries in flight")
	if rc, ok := ask(t, netip.MustParseAddrPort("127.0.0.4:0"), fwd, query(t, 3, "b.example."), 3*dnsUpstreamWait); !ok || rc != dnsmessage.RCodeServerFailure {
		t.Fatalf("another sandbox during the flood: %v %v, want its answer", rc, ok)
	}
}

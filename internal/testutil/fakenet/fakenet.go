// Package fakenet is a "fake internet" for tests of sandboxes' egress: a
// network namespace the test creates, reached from the host over a veth
// pair in 198.18.0.0/15 (the range RFC 2544 sets aside for benchmarks, so
// never a real destination), with a DNS server and an HTTP server in it.
// Nothing leaves the machine.
package fakenet

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/brisk-faas/brisk/internal/testutil"
)

// Zone is the domain the DNS server answers for: every name under it
// resolves to the namespace's address; others are NXDOMAIN.
const Zone = "fake.test."

// Net is one fake internet.
type Net struct {
	Name string     // the namespace, under /run/netns
	Host netip.Addr // the host's end: 198.18.n.1
	Addr netip.Addr // the namespace's: 198.18.n.2, where the servers listen
	DNS  string     // the DNS server, Addr:53 (UDP and TCP)
	HTTP string     // the HTTP server, Addr:80; it answers "hello from the internet"

	mu      sync.Mutex
	clients []string // remote addresses the HTTP server saw
	queries []string // names the DNS server was asked
}

// Start makes fake internet n (0-255: the address block 198.18.n.0/24,
// the namespace "bfake<n>"); the test's cleanup removes it all.
func Start(t testing.TB, n int) *Net {
	t.Helper()
	testutil.RequiresRoot(t)
	if n < 0 || n > 255 {
		t.Fatalf("fakenet: n %d out of 0-255", n)
	}
	f := &Net{Name: fmt.Sprintf("bfake%d", n),
		Host: netip.MustParseAddr(fmt.Sprintf("198.18.%d.1", n)), Addr: netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", n))}
	f.DNS, f.HTTP = netip.AddrPortFrom(f.Addr, 53).String(), netip.AddrPortFrom(f.Addr, 80).String()
	hostIf, nsIf := fmt.Sprintf("bfk%dh", n), fmt.Sprintf("bfk%dn", n)
	// Leftovers of a killed run first.
	_ = exec.Command("ip", "netns", "del", f.Name).Run()
	_ = exec.Command("ip", "link", "del", hostIf).Run()
	t.Cleanup(func() {
		// The namespace's deletion takes the veth pair with it, in the
		// background: the host's end may be gone before its own deletion
		// ("Cannot find"), or while it runs ("No such device").
		for _, args := range [][]string{{"netns", "del", f.Name}, {"link", "del", hostIf}} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") &&
				!strings.Contains(string(out), "No such file") && !strings.Contains(string(out), "No such device") {
				t.Errorf("fakenet: ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	})
	for _, args := range [][]string{
		{"netns", "add", f.Name},
		{"link", "add", hostIf, "type", "veth", "peer", "name", nsIf},
		{"link", "set", nsIf, "netns", f.Name},
		{"addr", "add", f.Host.String() + "/24", "dev", hostIf},
		{"link", "set", hostIf, "up"},
		{"-n", f.Name, "addr", "add", f.Addr.String() + "/24", "dev", nsIf},
		{"-n", f.Name, "link", "set", nsIf, "up"},
		{"-n", f.Name, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("fakenet: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	var (
		udp      net.PacketConn
		tcp, web net.Listener
	)
	if err := f.in(func() error {
		var err error
		if udp, err = net.ListenPacket("udp4", f.DNS); err != nil {
			return err
		}
		if tcp, err = net.Listen("tcp4", f.DNS); err != nil {
			return err
		}
		web, err = net.Listen("tcp4", f.HTTP)
		return err
	}); err != nil {
		t.Fatalf("fakenet: listen in %s: %v", f.Name, err)
	}
	t.Cleanup(func() { udp.Close(); tcp.Close(); web.Close() })
	go f.serveUDP(udp)
	go f.serveTCP(tcp)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.clients = append(f.clients, r.RemoteAddr)
		f.mu.Unlock()
		_, _ = io.WriteString(w, "hello from the internet")
	})}
	go func() { _ = srv.Serve(web) }()
	t.Cleanup(func() { srv.Close() })
	return f
}

// Clients lists the remote addresses the HTTP server saw, in order.
func (f *Net) Clients() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.clients...)
}

// Queries lists the names the DNS server was asked, in order.
func (f *Net) Queries() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.queries...)
}

// Dial connects from inside the namespace (as a machine of the internet
// would).
func (f *Net) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := f.in(func() error {
		var err error
		c, err = net.DialTimeout(network, addr, timeout)
		return err
	})
	return c, err
}

// Listen serves TCP port on the namespace's address until the test ends:
// each connection gets "port <port>" and is closed. It returns the
// address.
func (f *Net) Listen(t testing.TB, port int) string {
	t.Helper()
	return f.ListenFunc(t, port, testutil.Greet(fmt.Sprintf("port %d", port)))
}

// ListenFunc serves TCP port on the namespace's address with handle (in a
// goroutine per connection) until the test ends. It returns the address.
func (f *Net) ListenFunc(t testing.TB, port int, handle func(net.Conn)) string {
	t.Helper()
	addr := netip.AddrPortFrom(f.Addr, uint16(port)).String()
	var ln net.Listener
	if err := f.in(func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatalf("fakenet: listen on %s: %v", addr, err)
	}
	testutil.ServeConns(t, ln, handle)
	return addr
}

// ListenUDP serves UDP port on the namespace's address until the test
// ends, recording each datagram's payload; it returns the address and what
// has arrived so far.
func (f *Net) ListenUDP(t testing.TB, port int) (string, func() []string) {
	t.Helper()
	addr := netip.AddrPortFrom(f.Addr, uint16(port)).String()
	var pc net.PacketConn
	if err := f.in(func() error {
		var err error
		pc, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatalf("fakenet: listen on udp %s: %v", addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	var (
		mu  sync.Mutex
		got []string
	)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			got = append(got, string(buf[:n]))
			mu.Unlock()
		}
	}()
	return addr, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// Route sends the namespace's traffic for prefix through the host, as a
// router in front of the host would.
func (f *Net) Route(t testing.TB, prefix netip.Prefix) {
	t.Helper()
	if out, err := exec.Command("ip", "-n", f.Name, "route", "add", prefix.String(), "via", f.Host.String()).CombinedOutput(); err != nil {
		t.Fatalf("fakenet: route %v: %v: %s", prefix, err, out)
	}
}

// in runs fn on a thread inside the namespace: the sockets it opens are
// the namespace's for good.
func (f *Net) in(fn func() error) error { return testutil.InNetNS("/run/netns/"+f.Name, fn) }

func (f *Net) serveUDP(c net.PacketConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply := f.answer(buf[:n]); reply != nil {
			_, _ = c.WriteTo(reply, from)
		}
	}
}

func (f *Net) serveTCP(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			var lb [2]byte
			if _, err := io.ReadFull(c, lb[:]); err != nil {
				return
			}
			q := make([]byte, int(lb[0])<<8|int(lb[1]))
			if _, err := io.ReadFull(c, q); err != nil {
				return
			}
			if reply := f.answer(q); reply != nil {
				_, _ = c.Write(append([]byte{byte(len(reply) >> 8), byte(len(reply))}, reply...))
			}
		}()
	}
}

// answer is the reply to query q: A records of Addr under Zone, NXDOMAIN
// elsewhere, an empty answer for other types.
func (f *Net) answer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qq, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.ToLower(qq.Name.String())
	f.mu.Lock()
	f.queries = append(f.queries, name)
	f.mu.Unlock()
	h.Response, h.Authoritative, h.RecursionAvailable = true, true, true
	inZone := strings.HasSuffix(name, "."+Zone) || name == Zone
	if !inZone {
		h.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(qq)
	if inZone && qq.Type == dnsmessage.TypeA {
		_ = b.StartAnswers()
		_ = b.AResource(dnsmessage.ResourceHeader{Name: qq.Name, Class: dnsmessage.ClassINET, TTL: 60},
			dnsmessage.AResource{A: f.Addr.As4()})
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

package netpool

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The pool's DNS forwarder gives sandboxes a resolver: /etc/resolv.conf in
// a sandbox names the gateway, the firewall redirects the gateway's port 53
// (UDP and TCP) to the forwarder's own port on it (so that no DNS server
// of the host's needs to move), and the forwarder relays each query, as
// bytes, to the host's resolvers (the nameservers of the host's
// /etc/resolv.conf, loopback ones included: the forwarder runs on the
// host). It never parses more than a failed query's header and question,
// for the SERVFAIL it answers when no upstream replies, so that a sandbox's
// resolver fails in about a second rather than waiting out its own
// timeouts.

const (
	sandboxDNSPort  = 53          // DNS's port: where a sandbox's resolver sends (the gateway's) and upstreams listen
	dnsUpstreamWait = time.Second // per upstream and query
	dnsTCPIdle      = 10 * time.Second
	dnsMaxInFlight  = 256 // queries relayed at once (UDP and TCP)
	dnsMaxTCPConns  = 64
	// One sandbox's share of those, so that a sandbox that floods (or
	// holds connections open) slows only its own lookups.
	dnsPerSourceInFlight = 16
	dnsPerSourceTCPConns = 4
	dnsMaxMessage        = 65535
	resolvConfPath       = "/etc/resolv.conf"
)

// HostResolvers reads the nameservers of the host's /etc/resolv.conf as
// host:port upstreams for the forwarder.
func HostResolvers() ([]string, error) {
	f, err := os.Open(resolvConfPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(strings.SplitN(fields[1], "%", 2)[0]); err == nil {
				out = append(out, netip.AddrPortFrom(a, sandboxDNSPort).String())
			}
		}
	}
	return out, sc.Err()
}

// dnsForwarder relays sandboxes' queries to the upstreams.
type dnsForwarder struct {
	log       *slog.Logger
	subnet    netip.Prefix // queries from elsewhere are ignored
	gateway   netip.Addr
	upstreams []string
	udp       *net.UDPConn
	tcp       *net.TCPListener
	slots     chan struct{} // bounds queries in flight
	conns     chan struct{} // bounds TCP connections
	wg        sync.WaitGroup
	closeOnce sync.Once

	done chan struct{} // closed by close

	mu          sync.Mutex
	closed      bool
	active      map[*net.TCPConn]struct{} // closed by close
	queries     map[netip.Addr]int        // in flight per source
	tcpBySource map[netip.Addr]int        // TCP connections per source
}

// startDNS listens on addr's ephemeral UDP and TCP ports (the same number)
// and serves sandboxes of subnet until close.
func startDNS(addr netip.Addr, subnet netip.Prefix, upstreams []string, log *slog.Logger) (*dnsForwarder, error) {
	var (
		u   *net.UDPConn
		t   *net.TCPListener
		err error
	)
	// One port for both protocols: try a few ephemeral UDP ports until the
	// TCP one of the same number is free too.
	for range 16 {
		u, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
		if err != nil {
			return nil, err
		}
		port := u.LocalAddr().(*net.UDPAddr).AddrPort().Port()
		t, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
		if err == nil {
			break
		}
		u.Close()
		u = nil
	}
	if u == nil {
		return nil, err
	}
	f := &dnsForwarder{log: log, subnet: subnet, gateway: addr, upstreams: upstreams, udp: u, tcp: t,
		slots: make(chan struct{}, dnsMaxInFlight), conns: make(chan struct{}, dnsMaxTCPConns), done: make(chan struct{}),
		active: map[*net.TCPConn]struct{}{}, queries: map[netip.Addr]int{}, tcpBySource: map[netip.Addr]int{}}
	f.wg.Add(2)
	go f.serveUDP()
	go f.serveTCP()
	return f, nil
}

// port is the forwarder's port (UDP and TCP).
func (f *dnsForwarder) port() uint16 { return f.udp.LocalAddr().(*net.UDPAddr).AddrPort().Port() }

func (f *dnsForwarder) close() {
	f.closeOnce.Do(func() {
		close(f.done)
		f.udp.Close()
		f.tcp.Close()
		f.mu.Lock()
		f.closed = true
		for c := range f.active {
			c.Close()
		}
		f.mu.Unlock()
	})
	f.wg.Wait()
}

func (f *dnsForwarder) serveUDP() {
	defer f.wg.Done()
	buf := make([]byte, dnsMaxMessage)
	for {
		n, from, err := f.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		src := from.Addr().Unmap()
		if !f.sandbox(src) || !f.take(f.queries, src, dnsPerSourceInFlight) {
			continue // not a sandbox, or it has its share in flight: as a lost packet
		}
		select {
		case f.slots <- struct{}{}:
		default:
			f.give(f.queries, src)
			continue // overloaded: the client retries, as with a lost packet
		}
		q := append([]byte(nil), buf[:n]...)
		f.wg.Add(1)
		go func() {
			defer func() { <-f.slots; f.give(f.queries, src); f.wg.Done() }()
			if reply := f.relay(q, "udp"); reply != nil {
				_, _ = f.udp.WriteToUDPAddrPort(reply, from)
			}
		}()
	}
}

func (f *dnsForwarder) serveTCP() {
	defer f.wg.Done()
	for {
		c, err := f.tcp.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		if !f.sandbox(src) || !f.take(f.tcpBySource, src, dnsPerSourceTCPConns) {
			c.Close()
			continue
		}
		select {
		case f.conns <- struct{}{}:
		default:
			f.give(f.tcpBySource, src)
			c.Close()
			continue
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			<-f.conns
			f.give(f.tcpBySource, src)
			return
		}
		f.active[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer func() {
				f.mu.Lock()
				delete(f.active, c)
				f.mu.Unlock()
				c.Close()
				<-f.conns
				f.give(f.tcpBySource, src)
				f.wg.Done()
			}()
			f.serveConn(c)
		}()
	}
}

// serveConn answers a TCP connection's queries (two-byte length prefixed,
// RFC 1035 4.2.2) one after another until it idles or closes.
func (f *dnsForwarder) serveConn(c *net.TCPConn) {
	for {
		_ = c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		q, err := readTCPMessage(c)
		if err != nil {
			return
		}
		select {
		case f.slots <- struct{}{}:
		case <-f.done:
			return
		}
		reply := f.relay(q, "tcp")
		<-f.slots
		if reply == nil {
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(reply)))); err != nil {
			return
		}
		if _, err := c.Write(reply); err != nil {
			return
		}
	}
}

// sandbox reports whether a query from src is a sandbox's: in the subnet,
// not the gateway (a sandbox with CAP_NET_RAW could forge other sources,
// which the firewall drops too).
func (f *dnsForwarder) sandbox(src netip.Addr) bool {
	return f.subnet.Contains(src) && src != f.gateway
}

// take counts one more of src's in m, unless it has limit already.
func (f *dnsForwarder) take(m map[netip.Addr]int, src netip.Addr, limit int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m[src] >= limit {
		return false
	}
	m[src]++
	return true
}

// give undoes take.
func (f *dnsForwarder) give(m map[netip.Addr]int, src netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m[src]--; m[src] <= 0 {
		delete(m, src)
	}
}

func readTCPMessage(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint16(l[:])
	if n == 0 {
		return nil, errors.New("empty message")
	}
	m := make([]byte, n)
	_, err := io.ReadFull(r, m)
	return m, err
}

// relay sends q to each upstream in turn until one answers; without an
// answer it returns q's SERVFAIL (nil if q is not a query at all).
func (f *dnsForwarder) relay(q []byte, network string) []byte {
	for _, up := range f.upstreams {
		reply, err := exchange(network, up, q)
		if err == nil {
			return reply
		}
		f.log.Debug("dns upstream", "upstream", up, "err", err)
	}
	return servfail(q)
}

func exchange(network, upstream string, q []byte) ([]byte, error) {
	c, err := net.DialTimeout(network, upstream, dnsUpstreamWait)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dnsUpstreamWait))
	if network == "tcp" {
		if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
			return nil, err
		}
		return readTCPMessage(c)
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, dnsMaxMessage)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		// A reply to this query (its id), not a stray datagram.
		if n >= 2 && len(q) >= 2 && buf[0] == q[0] && buf[1] == q[1] {
			return buf[:n], nil
		}
	}
}

// servfail is the SERVFAIL answer to query q, or nil if q does not parse
// as a query.
func servfail(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil
	}
	h.Response, h.RCode, h.RecursionAvailable, h.Authoritative = true, dnsmessage.RCodeServerFailure, true, false
	b := dnsmessage.NewBuilder(nil, h)
	if err := b.StartQuestions(); err != nil {
		return nil
	}
	for _, qq := range qs {
		if err := b.Question(qq); err != nil {
			return nil
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// ResolvConf is the /etc/resolv.conf of a sandbox on a pool whose gateway
// is gw.
func ResolvConf(gw netip.Addr) string {
	return "# written by brisk: the worker's DNS forwarder on the sandbox network's gateway\nnameserver " + gw.String() + "\noptions timeout:2 attempts:2\n"
}

// HostsFile is the /etc/hosts of a sandbox at ip named hostname.
func HostsFile(ip netip.Addr, hostname string) string {
	var b strings.Builder
	b.WriteString("# written by brisk\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	if ip.IsValid() && hostname != "" {
		b.WriteString(ip.String() + "\t" + hostname + "\n")
	}
	return b.String()
}

package netpool

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The pool's firewall keeps sandboxes away from the host and from each
// other, lets them out to the world through NAT, and sends their DNS to the
// pool's forwarder. It lives in two nf_tables tables of the pool's own,
// named after its prefix (firewallTable), so it never touches a rule it did
// not create:
//
//	table inet brisk_netpool_<prefix>
//	  chain input   (hook input, priority filter, policy accept)
//	    iifname <bridge> ct state established,related accept
//	    iifname <bridge> tcp dport <AllowHostPorts...> accept
//	    iifname <bridge> ip saddr <subnet> ip daddr <gateway> udp,tcp dport <dns port> accept   (DNS)
//	    iifname <bridge> reject (tcp reset, else icmpx admin-prohibited)
//	  chain forward (hook forward, priority filter, policy accept)
//	    iifname <bridge> meta nfproto != ipv4 drop
//	    iifname <bridge> ip saddr != <subnet> drop
//	    iifname <bridge> ct original ip saddr <Ingress...> accept                (replies to data planes)
//	    iifname <bridge> ip daddr <subnet> reject
//	    iifname <bridge> ip daddr 169.254.0.0/16 reject
//	    iifname <bridge> ip daddr <EgressDeny...> reject
//	    iifname <bridge> reject                                              (without Egress)
//	    oifname <bridge> ip saddr <Ingress...> meta l4proto tcp accept          (data planes' connections)
//	    oifname <bridge> ct state established,related accept
//	    oifname <bridge> drop
//	  chain prerouting  (hook prerouting, priority dstnat; DNS)
//	    iifname <bridge> ip saddr <subnet> ip daddr <gateway> udp,tcp dport 53 redirect to :<dns port>
//	  chain postrouting (hook postrouting, priority srcnat; Egress)
//	    ip saddr <subnet> ip saddr != <gateway> oifname != <bridge> masquerade
//	table bridge brisk_netpool_<prefix>
//	  set ports { type ifname . ipv4_addr }   each endpoint's host veth and address (addPort)
//	  chain prerouting (hook prerouting, priority filter, policy accept)
//	    iifname "<prefix>-*" ether type ip iifname . ip saddr != @ports drop
//	    iifname "<prefix>-*" ether type arp iifname . arp saddr ip != @ports drop
//	  chain forward (hook forward, priority filter, policy accept)
//	    iifname "<prefix>-*" oifname "<prefix>-*" drop
//
// input: a sandbox reaches no address of the host's (the gateway, every
// other local address, over IPv4 or IPv6): not the control plane's admin or
// gRPC ports, not a data plane, not the worker; only the DNS forwarder's
// port on the gateway, from a sandbox's own address. The host's own
// connections into sandboxes (data
// plane, readiness probe) still work: their replies are established
// traffic. forward (inet): no sandbox reaches another through the host's
// routing (a hairpin through the gateway, which needs the host to forward,
// e.g. with proxy_arp_pvlan, or a sandbox with CAP_NET_RAW addressing frames
// to the gateway), nor a link-local address (a cloud's metadata service),
// nor a denied network; the rest is forwarded, with the sandbox's address
// masqueraded as the host's; packets with a forged source or other than
// IPv4 are dropped; nothing is forwarded into the bridge but replies (with
// forwarding on, a machine routing the subnet here would otherwise reach
// sandboxes' ports past the data plane), and TCP connections from the
// Ingress networks (data planes on other hosts), whose replies go back
// whatever the sandbox's egress. forward (bridge): no frame goes from one
// sandbox's port to another's even if port isolation (set on every veth by
// build) were lost. prerouting (bridge): a sandbox sends IPv4 and ARP only
// with its own address (one with CAP_NET_RAW could otherwise claim another
// sandbox's, and be answered in its place or go out under its namespace's
// egress policy). What is refused is rejected, not dropped: a
// connection fails at once (reset, or host unreachable) instead of hanging
// until the client's timeout.
//
// installFirewall replaces the tables in one transaction: a restarted
// worker swaps its predecessor's rules for its own without a moment
// unprotected and without duplicates. Namespaces' egress policies live in
// a third table (egress.go), which a restart keeps.

// linkLocal is refused to sandboxes always: cloud metadata services answer
// there.
var linkLocal = netip.MustParsePrefix("169.254.0.0/16")

// firewallTable names the pool's tables (one inet, one bridge).
func firewallTable(prefix string) string { return "brisk_netpool_" + prefix }

func firewallTables(prefix string) (inet, bridge *nftables.Table) {
	name := firewallTable(prefix)
	return &nftables.Table{Name: name, Family: nftables.TableFamilyINet},
		&nftables.Table{Name: name, Family: nftables.TableFamilyBridge}
}

// ErrFirewall matches (errors.Is) installFirewall's errors.
var ErrFirewall = errors.New("netpool: cannot install the sandbox firewall (nf_tables); Config.NoFirewall (--net-firewall=false) runs without it")

// installFirewall creates (or atomically replaces) the pool's tables.
// dnsPort is the DNS forwarder's port on the gateway (0: none); ports are
// the endpoints that exist already (adopted ones), for the ports set.
func installFirewall(cfg Config, dnsPort uint16, ports []*record) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	inet, br := firewallTables(cfg.NamePrefix)
	accept := nftables.ChainPolicyAccept
	for _, t := range []*nftables.Table{inet, br} {
		// Add (a no-op if it exists) then delete: the classic idiom for
		// "replace" that fails on neither a first start nor a restart.
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
	}
	chain := func(t *nftables.Table, name string, hook *nftables.ChainHook, typ nftables.ChainType, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Hooknum: hook, Priority: prio, Type: typ, Policy: &accept})
	}
	base := func(t *nftables.Table, name string, hook *nftables.ChainHook) *nftables.Chain {
		return chain(t, name, hook, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	}
	rule := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: exprs})
	}
	// reject refuses what match matches at once (rejectOn).
	reject := func(ch *nftables.Chain, match ...[]expr.Any) { rejectOn(c, ch, concat(match...)) }
	fromBridge := matchIfname(expr.MetaKeyIIFNAME, cfg.Bridge, true)
	gw := netip.PrefixFrom(gatewayOf(cfg.Subnet), 32)

	in := base(inet, "input", nftables.ChainHookInput)
	rule(in, concat(fromBridge, ctEstablished(), verdict(expr.VerdictAccept))...)
	for _, port := range cfg.AllowHostPorts {
		rule(in, concat(fromBridge, tcpDport(port), verdict(expr.VerdictAccept))...)
	}
	// A sandbox's own address, as its packets must carry (one with
	// CAP_NET_RAW could forge another: forward drops those, and DNS takes
	// only these).
	fromSandbox := concat(fromBridge, ipv4(), ipInPrefix(12, cfg.Subnet))
	if dnsPort != 0 {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(in, concat(fromSandbox, ipInPrefix(16, gw), l4proto(proto), thDport(dnsPort), verdict(expr.VerdictAccept))...)
		}
	}
	reject(in, fromBridge)

	// forward: what enters from the bridge is a sandbox's own IPv4 or
	// nothing; what leaves into the bridge is a reply to a sandbox's
	// connection or nothing (with forwarding on, a machine routing the
	// subnet to this host would otherwise reach sandboxes' ports past the
	// data plane).
	fwd := base(inet, "forward", nftables.ChainHookForward)
	rule(fwd, concat(fromBridge, notIPv4(), verdict(expr.VerdictDrop))...)
	rule(fwd, concat(fromBridge, ipv4(), ipNotInPrefix(12, cfg.Subnet), verdict(expr.VerdictDrop))...)
	for _, from := range cfg.Ingress {
		rule(fwd, concat(fromBridge, ipv4(), ctOriginalSourceIn(from), verdict(expr.VerdictAccept))...)
	}
	for _, to := range append([]netip.Prefix{cfg.Subnet, linkLocal}, cfg.EgressDeny...) {
		reject(fwd, fromBridge, ipv4(), ipInPrefix(16, to))
	}
	if !cfg.Egress {
		reject(fwd, fromBridge)
	}
	toBridge := matchIfname(expr.MetaKeyOIFNAME, cfg.Bridge, true)
	for _, from := range cfg.Ingress {
		rule(fwd, concat(toBridge, ipv4(), ipInPrefix(12, from), l4proto(unix.IPPROTO_TCP), verdict(expr.VerdictAccept))...)
	}
	rule(fwd, concat(toBridge, ctEstablished(), verdict(expr.VerdictAccept))...)
	rule(fwd, concat(toBridge, verdict(expr.VerdictDrop))...)

	if dnsPort != 0 {
		pre := chain(inet, "prerouting", nftables.ChainHookPrerouting, nftables.ChainTypeNAT, nftables.ChainPriorityNATDest)
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			rule(pre, concat(fromSandbox, ipInPrefix(16, gw), l4proto(proto), thDport(sandboxDNSPort),
				[]expr.Any{&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(dnsPort)},
					&expr.Redir{RegisterProtoMin: 1}})...)
		}
	}
	if cfg.Egress {
		// Not the gateway's own traffic (the DNS forwarder's): only
		// sandboxes' is masqueraded.
		post := chain(inet, "postrouting", nftables.ChainHookPostrouting, nftables.ChainTypeNAT, nftables.ChainPriorityNATSource)
		rule(post, concat(ipv4(), ipInPrefix(12, cfg.Subnet), ipNotInPrefix(12, gw), matchIfnameNot(expr.MetaKeyOIFNAME, cfg.Bridge),
			[]expr.Any{&expr.Masq{}})...)
	}

	bfwd := base(br, "forward", nftables.ChainHookForward)
	port := cfg.NamePrefix + "-"
	rule(bfwd, concat(matchIfname(expr.MetaKeyIIFNAME, port, false), matchIfname(expr.MetaKeyOIFNAME, port, false),
		verdict(expr.VerdictDrop))...)

	set := portsSet(br)
	var elems []nftables.SetElement
	for _, r := range ports {
		elems = append(elems, nftables.SetElement{Key: portKey(r.name, r.ip)})
	}
	if err := c.AddSet(set, elems); err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	bpre := base(br, "prerouting", nftables.ChainHookPrerouting)
	for _, m := range []struct {
		etherType uint16
		srcOffset uint32 // of the sender's IPv4 address in the network header
	}{{unix.ETH_P_IP, 12}, {unix.ETH_P_ARP, 14}} {
		rule(bpre, concat(matchIfname(expr.MetaKeyIIFNAME, port, false),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(m.etherType)},
				// iifname . source address, in registers 8-11 and 12.
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
				&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseNetworkHeader, Offset: m.srcOffset, Len: 4},
				&expr.Lookup{SourceRegister: 8, SetName: set.Name, SetID: set.ID, Invert: true},
			}, verdict(expr.VerdictDrop))...)
	}

	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	return nil
}

// portsSet is the bridge table's set of (host veth, address) pairs: the
// address each endpoint's sandbox may send from.
func portsSet(br *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: br, Name: "ports", Concatenation: true, ID: portsSetID,
		KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
}

// The pool's sets' ids, which name a set within the transaction that makes
// it. Set here: google/nftables allocates one from a package variable it
// does not synchronise (a data race between pools started at once).
const (
	portsSetID  = 1
	egressMapID = 2
)

// portKey is the ports set's key of host veth name and address.
func portKey(name string, ip netip.Addr) []byte {
	k := make([]byte, unix.IFNAMSIZ+4)
	copy(k, name)
	a := ip.As4()
	copy(k[unix.IFNAMSIZ:], a[:])
	return k
}

// addPort lets r's sandbox send from its address. The pair stays in the
// set when r goes: the veth's name and the address are both r's index's,
// so a later endpoint of that index needs the same pair, and no other
// interface can carry that name meanwhile (the prefix is the pool's).
func (p *Pool) addPort(r *record) error {
	if p.cfg.NoFirewall {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	_, br := firewallTables(p.cfg.NamePrefix)
	if err := c.SetAddElements(portsSet(br), []nftables.SetElement{{Key: portKey(r.name, r.ip)}}); err != nil {
		return err
	}
	return c.Flush()
}

// removeFirewall deletes the pool's tables; tables already gone are
// success.
func removeFirewall(prefix string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netpool: remove firewall: %w", err)
	}
	inet, br := firewallTables(prefix)
	for _, t := range []*nftables.Table{inet, br, egressTable(prefix)} {
		c.AddTable(t) // a no-op if it exists, so that the delete cannot fail
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) || errors.Is(err, unix.EPROTONOSUPPORT) {
			return nil // no nf_tables (or no bridge family): nothing of ours can exist
		}
		return fmt.Errorf("netpool: remove firewall: %w", err)
	}
	return nil
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// matchIfname compares the input or output interface's name with name:
// exactly (whole, NUL-padded) or as a prefix (nft's "name*").
func matchIfname(key expr.MetaKey, name string, exact bool) []expr.Any {
	data := []byte(name)
	if exact {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

// ctEstablished is "ct state established,related".
func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// ctOriginalSourceIn matches packets of connections first sent from
// prefix (conntrack's original source): in the forward chain, from the
// bridge, a sandbox's replies to them.
func ctOriginalSourceIn(prefix netip.Prefix) []expr.Any {
	m := ipInPrefix(12, prefix)
	// The register gets the tuple's address (16 bytes in an inet table;
	// an IPv4 one in the first 4), in place of the header's source.
	m[0] = &expr.Ct{Register: 1, Key: expr.CtKeySRC, Direction: 0}
	return m
}

// matchIfnameNot is matchIfname's exact match, negated.
func matchIfnameNot(key expr.MetaKey, name string) []expr.Any {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: data},
	}
}

// l4proto is "meta l4proto proto".
func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// thDport is "th dport port": the destination port of a TCP or UDP header
// (after an l4proto match).
func thDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func tcpDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// ipv4 is "meta nfproto ipv4", which must precede IPv4 header matches in
// an inet table.
func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// notIPv4 is "meta nfproto != ipv4".
func notIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// ipNotInPrefix is ipInPrefix negated.
func ipNotInPrefix(offset uint32, prefix netip.Prefix) []expr.Any {
	m := ipInPrefix(offset, prefix)
	m[len(m)-1].(*expr.Cmp).Op = expr.CmpOpNeq
	return m
}

// ipInPrefix matches the IPv4 address at offset (12 source, 16
// destination) of the network header against prefix.
func ipInPrefix(offset uint32, prefix netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	for i := range prefix.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	net := prefix.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: net[:]},
	}
}

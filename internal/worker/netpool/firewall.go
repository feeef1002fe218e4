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
// other. It lives in two nf_tables tables of the pool's own, named after
// its prefix (firewallTable), so it never touches a rule it did not create:
//
//	table inet brisk_netpool_<prefix>
//	  chain input   (hook input, priority filter, policy accept)
//	    iifname <bridge> ct state established,related accept
//	    iifname <bridge> tcp dport <AllowHostPorts...> accept
//	    iifname <bridge> drop
//	  chain forward (hook forward, priority filter, policy accept)
//	    ip saddr <subnet> ip daddr <subnet> drop
//	table bridge brisk_netpool_<prefix>
//	  chain forward (hook forward, priority filter, policy accept)
//	    iifname "<prefix>-*" oifname "<prefix>-*" drop
//
// input: a sandbox reaches no address of the host's (the gateway, every
// other local address, over IPv4 or IPv6): not the control plane's admin or
// gRPC ports, not a data plane, not the worker. The host's own connections
// into sandboxes (data plane, readiness probe) still work: their replies are
// established traffic. forward (inet): no sandbox reaches another through
// the host's routing (a hairpin through the gateway, which needs the host
// to forward, e.g. with proxy_arp_pvlan, or a sandbox with CAP_NET_RAW
// addressing frames to the gateway). forward (bridge): no frame goes from
// one sandbox's port to another's even if port isolation (set on every
// veth by build) were lost. Everything else, sandboxes' outbound traffic
// beyond the host included, is left as it was.
//
// installFirewall replaces the tables in one transaction: a restarted
// worker swaps its predecessor's rules for its own without a moment
// unprotected and without duplicates.

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
func installFirewall(cfg Config) error {
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
	base := func(t *nftables.Table, name string, hook *nftables.ChainHook) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Hooknum: hook,
			Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter, Policy: &accept})
	}
	rule := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: exprs})
	}
	fromBridge := matchIfname(expr.MetaKeyIIFNAME, cfg.Bridge, true)

	in := base(inet, "input", nftables.ChainHookInput)
	rule(in, concat(fromBridge, ctEstablished(), verdict(expr.VerdictAccept))...)
	for _, port := range cfg.AllowHostPorts {
		rule(in, concat(fromBridge, tcpDport(port), verdict(expr.VerdictAccept))...)
	}
	rule(in, concat(fromBridge, verdict(expr.VerdictDrop))...)

	fwd := base(inet, "forward", nftables.ChainHookForward)
	rule(fwd, concat(ipv4(), ipInPrefix(12, cfg.Subnet), ipInPrefix(16, cfg.Subnet), verdict(expr.VerdictDrop))...)

	bfwd := base(br, "forward", nftables.ChainHookForward)
	port := cfg.NamePrefix + "-"
	rule(bfwd, concat(matchIfname(expr.MetaKeyIIFNAME, port, false), matchIfname(expr.MetaKeyOIFNAME, port, false),
		verdict(expr.VerdictDrop))...)

	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	return nil
}

// removeFirewall deletes the pool's tables; tables already gone are
// success.
func removeFirewall(prefix string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netpool: remove firewall: %w", err)
	}
	inet, br := firewallTables(prefix)
	for _, t := range []*nftables.Table{inet, br} {
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

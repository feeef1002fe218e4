package netpool

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/brisk-faas/brisk/pkg/spec"
)

// Namespaces' egress policies (spec.EgressPolicy) live in a third table of
// the pool's, apart from the firewall's so that a restarted worker, which
// replaces the firewall, keeps them for the sandboxes it adopts until the
// control plane sends them again:
//
//	table inet brisk_egress_<prefix>
//	  map sandboxes { type ipv4_addr : verdict }       sandbox address -> jump ns-<namespace> (comment <namespace>)
//	  chain forward (hook forward, priority filter + 10, policy accept)
//	    iifname <bridge> ip saddr vmap @sandboxes
//	  chain ns-<namespace>
//	    ip daddr <deny> [meta l4proto tcp|udp th dport <ports>] reject
//	    ip daddr <allow> [...] return
//	    reject                                                    (when allow is set)
//
// The chain runs after the firewall's forward chain (a higher priority
// number), so the cluster-wide refusals come first and a policy only
// narrows what is left. Every packet a sandbox sends is matched, not only a
// connection's first: a tightened policy cuts open connections at once.

// egressTable names the pool's egress table.
func egressTable(prefix string) *nftables.Table {
	return &nftables.Table{Name: "brisk_egress_" + prefix, Family: nftables.TableFamilyINet}
}

const (
	egressMap         = "sandboxes"
	egressChainPrefix = "ns-"
	// egressPriority runs the policies after the firewall's forward chain.
	egressPriority = 10
)

// egress is the pool's view of its egress table. Its mutex serialises the
// table's transactions, which are short netlink round trips.
type egress struct {
	mu       sync.Mutex
	enabled  bool // the firewall is on: Bind and SetEgress act
	table    *nftables.Table
	set      *nftables.Set
	policies map[string][]egressRule // by namespace, in the order checked
	allowSet map[string]bool         // namespaces whose policy has an allow list
	chains   map[string]bool         // namespace chains that exist
	bound    map[netip.Addr]string   // sandbox address -> namespace
}

// openEgress makes the egress table, or takes over the one an earlier
// worker left: its namespace chains (and their rules) stay, and so do the
// bindings of the addresses in keep (the adopted endpoints'); the others
// go.
func (p *Pool) openEgress(keep map[netip.Addr]bool) error {
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	e.table = egressTable(p.cfg.NamePrefix)
	e.set = &nftables.Set{Table: e.table, Name: egressMap, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	e.policies, e.allowSet = map[string][]egressRule{}, map[string]bool{}
	e.chains, e.bound = map[string]bool{}, map[netip.Addr]string{}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	if _, err := c.ListTableOfFamily(e.table.Name, e.table.Family); err == nil {
		if err := e.adoptLocked(c, keep); err == nil {
			e.enabled = true
			return nil
		} else {
			p.log.Warn("egress table of an earlier worker unreadable: replacing it", "err", err)
		}
	}
	c.AddTable(e.table)
	c.DelTable(e.table)
	c.AddTable(e.table)
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter + egressPriority)
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: e.table, Hooknum: nftables.ChainHookForward,
		Priority: prio, Type: nftables.ChainTypeFilter, Policy: &accept})
	if err := c.AddSet(e.set, nil); err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	c.AddRule(&nftables.Rule{Table: e.table, Chain: fwd, Exprs: concat(
		matchIfname(expr.MetaKeyIIFNAME, p.cfg.Bridge, true), ipv4(),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: e.set.Name, SetID: e.set.ID, IsDestRegSet: true, DestRegister: 0},
		})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: egress table: %w", ErrFirewall, err)
	}
	e.enabled = true
	return nil
}

// adoptLocked reads an earlier worker's table: its chains, and its
// bindings, dropping those not in keep.
func (e *egress) adoptLocked(c *nftables.Conn, keep map[netip.Addr]bool) error {
	chains, err := c.ListChainsOfTableFamily(e.table.Family)
	if err != nil {
		return err
	}
	hasForward := false
	for _, ch := range chains {
		if ch.Table.Name != e.table.Name {
			continue
		}
		if ns, ok := strings.CutPrefix(ch.Name, egressChainPrefix); ok {
			e.chains[ns] = true
		}
		hasForward = hasForward || ch.Name == "forward"
	}
	set, err := c.GetSetByName(e.table, egressMap)
	if err != nil {
		return err
	}
	if !hasForward {
		return errors.New("no forward chain")
	}
	e.set = set
	elems, err := c.GetSetElements(set)
	if err != nil {
		return err
	}
	var stale []nftables.SetElement
	for _, el := range elems {
		// The library does not decode a verdict's chain: the element's
		// comment names the namespace too.
		a, ok := netip.AddrFromSlice(el.Key)
		ns := el.Comment
		if ok && e.chains[ns] && keep[a] {
			e.bound[a] = ns
			continue
		}
		stale = append(stale, nftables.SetElement{Key: el.Key})
	}
	if len(stale) > 0 {
		if err := c.SetDeleteElements(set, stale); err != nil {
			return err
		}
		return c.Flush()
	}
	return nil
}

// Bind puts ep's sandbox under its namespace's egress policy, from now
// until Release (a policy set later applies too). A sandbox must not start
// when Bind fails: it would go out unrestricted.
func (p *Pool) Bind(ep *Endpoint, namespace string) error {
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.enabled {
		return nil
	}
	if old, ok := e.bound[ep.IP]; ok && old == namespace {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netpool: egress: %w", err)
	}
	created := false
	if !e.chains[namespace] {
		e.writeChainLocked(c, namespace, true)
		created = true
	}
	key := ep.IP.As4()
	if _, ok := e.bound[ep.IP]; ok {
		if err := c.SetDeleteElements(e.set, []nftables.SetElement{{Key: key[:]}}); err != nil {
			return fmt.Errorf("netpool: egress: %w", err)
		}
	}
	if err := c.SetAddElements(e.set, []nftables.SetElement{{Key: key[:],
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: egressChainPrefix + namespace}, Comment: namespace}}); err != nil {
		return fmt.Errorf("netpool: egress: %w", err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netpool: egress: bind %s to namespace %s: %w", ep.IP, namespace, err)
	}
	if created {
		e.chains[namespace] = true
	}
	e.bound[ep.IP] = namespace
	return nil
}

// unbind takes addr out of the map (its endpoint was released).
func (p *Pool) unbind(addr netip.Addr) error {
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.bound[addr]; !ok || !e.enabled {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	key := addr.As4()
	if err := c.SetDeleteElements(e.set, []nftables.SetElement{{Key: key[:]}}); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return err
	}
	delete(e.bound, addr)
	return nil
}

// SetEgress makes policies (by namespace; the complete set: a namespace
// left out has none) the pool's, in one transaction, for running sandboxes
// as for those to come.
func (p *Pool) SetEgress(policies map[string]spec.EgressPolicy) error {
	parsed := make(map[string][]egressRule, len(policies))
	allow := make(map[string]bool, len(policies))
	for ns, pol := range policies {
		if err := pol.Validate(); err != nil {
			return fmt.Errorf("netpool: egress policy of namespace %s: %w", ns, err)
		}
		if !spec.ValidNamespace(ns) {
			return fmt.Errorf("netpool: egress policy of namespace %q: not a namespace name", ns)
		}
		parsed[ns] = rulesOf(pol)
		allow[ns] = len(pol.Allow) > 0
	}
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.enabled {
		if len(policies) > 0 {
			return fmt.Errorf("netpool: egress policies need the sandbox firewall (Config.NoFirewall is set): namespaces %v are not restricted",
				slices.Sorted(maps.Keys(policies)))
		}
		return nil
	}
	old, oldAllow := e.policies, e.allowSet
	e.policies, e.allowSet = parsed, allow
	c, err := nftables.New()
	if err == nil {
		names := maps.Clone(e.chains)
		for ns := range parsed {
			names[ns] = true
		}
		for ns := range names {
			e.writeChainLocked(c, ns, !e.chains[ns])
		}
		err = c.Flush()
	}
	if err != nil {
		e.policies, e.allowSet = old, oldAllow
		return fmt.Errorf("netpool: egress policies: %w", err)
	}
	for ns := range parsed {
		e.chains[ns] = true
	}
	return nil
}

// writeChainLocked queues (on c) namespace ns's chain with its policy's
// rules: made when fresh, else flushed and refilled.
func (e *egress) writeChainLocked(c *nftables.Conn, ns string, fresh bool) {
	ch := &nftables.Chain{Name: egressChainPrefix + ns, Table: e.table}
	if fresh {
		c.AddChain(ch)
	} else {
		c.FlushChain(ch)
	}
	rule := func(exprs ...expr.Any) { c.AddRule(&nftables.Rule{Table: e.table, Chain: ch, Exprs: exprs}) }
	reject := func(m []expr.Any) {
		rule(concat(m, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})...)
		rule(concat(m, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})...)
	}
	for _, r := range e.policies[ns] {
		for _, m := range matchesOf(r.ParsedEgressRule) {
			if r.deny {
				reject(m)
			} else {
				rule(concat(m, verdict(expr.VerdictReturn))...)
			}
		}
	}
	if e.allowSet[ns] {
		reject(nil)
	}
}

// egressRule is one rule of a namespace's chain.
type egressRule struct {
	spec.ParsedEgressRule
	deny bool
}

// rulesOf orders a policy's rules as its chain checks them: deny first.
func rulesOf(p spec.EgressPolicy) []egressRule {
	var out []egressRule
	for _, deny := range []bool{true, false} {
		list := p.Allow
		if deny {
			list = p.Deny
		}
		for _, r := range list {
			pr, _ := r.Parse() // validated
			out = append(out, egressRule{pr, deny})
		}
	}
	return out
}

// matchesOf is r's destination as nf_tables matches: the network, and per
// protocol and port range one match more.
func matchesOf(r spec.ParsedEgressRule) [][]expr.Any {
	dst := concat(ipv4(), ipInPrefix(16, r.Prefix))
	if len(r.Ports) == 0 {
		return [][]expr.Any{dst}
	}
	var out [][]expr.Any
	for _, proto := range []struct {
		on bool
		p  byte
	}{{r.TCP, unix.IPPROTO_TCP}, {r.UDP, unix.IPPROTO_UDP}} {
		if !proto.on {
			continue
		}
		for _, pr := range r.Ports {
			port := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
			if pr.First == pr.Last {
				port = append(port, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(pr.First)})
			} else {
				port = append(port, &expr.Range{Op: expr.CmpOpEq, Register: 1,
					FromData: binaryutil.BigEndian.PutUint16(pr.First), ToData: binaryutil.BigEndian.PutUint16(pr.Last)})
			}
			out = append(out, concat(dst, l4proto(proto.p), port))
		}
	}
	return out
}

package netpool

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
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
//	  map sandboxes { type ipv4_addr : verdict }       sandbox address -> goto ns-<namespace> (comment <namespace>)
//	  chain forward (hook forward, priority filter + 10, policy accept)
//	    iifname <bridge> ip saddr vmap @sandboxes
//	    iifname <bridge> reject                                  (an address bound to no namespace)
//	  chain ns-<namespace>
//	    ip daddr <deny> [meta l4proto tcp|udp th dport <ports>] reject
//	    ip daddr <allow> [...] return                            (to the hook: accepted)
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
	mu      sync.Mutex
	enabled bool // the firewall is on: Bind and SetEgress act
	table   *nftables.Table
	set     *nftables.Set
	// want is the policy set last asked for (SetEgress), whether or not it
	// could be installed; failed says it could not: Bind then refuses the
	// namespaces it names rather than let their sandboxes out unchecked.
	want     map[string]spec.EgressPolicy
	failed   error
	policies map[string][]egressRule // installed, by namespace, in the order checked
	chains   map[string]bool         // namespace chains that exist
	bound    map[netip.Addr]string   // sandbox address -> namespace
}

// openEgress makes the egress table, or takes over the one an earlier
// worker left: its namespace chains (and their rules) stay, and so do the
// bindings of the addresses in keep (the adopted endpoints'); the others
// go. The forward chain is written afresh either way.
func (p *Pool) openEgress(keep map[netip.Addr]bool) error {
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	e.table = egressTable(p.cfg.NamePrefix)
	e.policies = map[string][]egressRule{}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFirewall, err)
	}
	if _, err := c.ListTableOfFamily(e.table.Name, e.table.Family); err == nil {
		if err := e.adoptLocked(c, keep); err != nil {
			p.log.Warn("egress table of an earlier worker unreadable: replacing it", "err", err)
		} else if err := e.writeForwardLocked(c, p.cfg, false); err != nil {
			p.log.Warn("egress table of an earlier worker not updated: replacing it", "err", err)
		} else {
			e.enabled = true
			return nil
		}
		c, err = nftables.New() // a fresh batch: nothing of the attempt's
		if err != nil {
			return fmt.Errorf("%w: %w", ErrFirewall, err)
		}
	}
	c.AddTable(e.table)
	c.DelTable(e.table)
	c.AddTable(e.table)
	if err := e.writeForwardLocked(c, p.cfg, true); err != nil {
		return fmt.Errorf("%w: egress table: %w", ErrFirewall, err)
	}
	e.enabled = true
	return nil
}

// writeForwardLocked writes (on c, then flushes) the map and the forward
// chain: every packet from the bridge jumps to its sandbox's namespace's
// chain; one from an address bound to none (no sandbox of the pool's
// runtimes goes out unbound) is refused. Replies to the Ingress networks'
// connections (data planes on other hosts) are no egress: they pass.
// fresh: the table is new (its map and chains start empty).
func (e *egress) writeForwardLocked(c *nftables.Conn, cfg Config, fresh bool) error {
	bridge := cfg.Bridge
	if fresh {
		e.chains, e.bound = map[string]bool{}, map[netip.Addr]string{}
		e.set = &nftables.Set{Table: e.table, Name: egressMap, ID: egressMapID, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
		if err := c.AddSet(e.set, nil); err != nil {
			return err
		}
	}
	accept := nftables.ChainPolicyAccept
	prio := nftables.ChainPriorityRef(*nftables.ChainPriorityFilter + egressPriority)
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: e.table, Hooknum: nftables.ChainHookForward,
		Priority: prio, Type: nftables.ChainTypeFilter, Policy: &accept})
	c.FlushChain(fwd)
	fromBridge := matchIfname(expr.MetaKeyIIFNAME, bridge, true)
	for _, from := range cfg.Ingress {
		c.AddRule(&nftables.Rule{Table: e.table, Chain: fwd, Exprs: concat(fromBridge, ipv4(), ctOriginalSourceIn(from), verdict(expr.VerdictAccept))})
	}
	c.AddRule(&nftables.Rule{Table: e.table, Chain: fwd, Exprs: concat(fromBridge, ipv4(),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: e.set.Name, SetID: e.set.ID, IsDestRegSet: true, DestRegister: 0},
		})})
	rejectOn(c, fwd, fromBridge)
	return c.Flush()
}

// rejectOn adds to ch rules refusing what m matches at once: a TCP reset,
// or an ICMP "administratively prohibited" for anything else.
func rejectOn(c *nftables.Conn, ch *nftables.Chain, m []expr.Any) {
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch,
		Exprs: concat(m, l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})})
	c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch,
		Exprs: concat(m, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})})
}

// adoptLocked reads an earlier worker's table: its chains, and its
// bindings, dropping those not in keep.
func (e *egress) adoptLocked(c *nftables.Conn, keep map[netip.Addr]bool) error {
	e.chains, e.bound = map[string]bool{}, map[netip.Addr]string{}
	chains, err := c.ListChainsOfTableFamily(e.table.Family)
	if err != nil {
		return err
	}
	for _, ch := range chains {
		if ch.Table.Name != e.table.Name {
			continue
		}
		if ns, ok := strings.CutPrefix(ch.Name, egressChainPrefix); ok {
			e.chains[ns] = true
		}
	}
	set, err := c.GetSetByName(e.table, egressMap)
	if err != nil {
		return err
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
	}
	return nil // flushed with the forward chain
}

// Bind puts ep's sandbox under its namespace's egress policy, from now
// until Release (a policy set later applies too). A sandbox must not start
// when Bind fails: it would go out unrestricted, or not at all.
func (p *Pool) Bind(ep *Endpoint, namespace string) error {
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	restricted := !e.want[namespace].IsZero()
	if !e.enabled {
		if restricted {
			return fmt.Errorf("netpool: namespace %s has an egress policy, which needs the sandbox firewall (--net-firewall is off)", namespace)
		}
		return nil
	}
	if e.failed != nil && restricted {
		return fmt.Errorf("netpool: namespace %s's egress policy is not installed: %w", namespace, e.failed)
	}
	if old, ok := e.bound[ep.IP]; ok && old == namespace {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("netpool: egress: %w", err)
	}
	created := !e.chains[namespace]
	if created {
		e.writeChainLocked(c, namespace)
	}
	key := ep.IP.As4()
	if _, ok := e.bound[ep.IP]; ok {
		if err := c.SetDeleteElements(e.set, []nftables.SetElement{{Key: key[:]}}); err != nil {
			return fmt.Errorf("netpool: egress: %w", err)
		}
	}
	if err := c.SetAddElements(e.set, []nftables.SetElement{{Key: key[:],
		VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: egressChainPrefix + namespace}, Comment: namespace}}); err != nil {
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
// left out has none) the pool's, in one transaction that rewrites the
// chains of the namespaces whose policy changed, for running sandboxes as
// for those to come. When it fails, nothing changed in the kernel, and
// Bind refuses the namespaces policies names until a later SetEgress
// succeeds.
func (p *Pool) SetEgress(policies map[string]spec.EgressPolicy) error {
	e := &p.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	e.want = maps.Clone(policies)
	e.failed = e.installLocked(policies)
	return e.failed
}

func (e *egress) installLocked(policies map[string]spec.EgressPolicy) error {
	parsed := make(map[string][]egressRule, len(policies))
	for ns, pol := range policies {
		if !spec.ValidNamespace(ns) {
			return fmt.Errorf("netpool: egress policy of namespace %q: not a namespace name", ns)
		}
		if err := pol.Validate(); err != nil {
			return fmt.Errorf("netpool: egress policy of namespace %s: %w", ns, err)
		}
		parsed[ns] = rulesOf(pol)
	}
	if !e.enabled {
		if len(policies) > 0 {
			return fmt.Errorf("netpool: egress policies need the sandbox firewall (--net-firewall is off): namespaces %v are not restricted, and their sandboxes do not start",
				slices.Sorted(maps.Keys(policies)))
		}
		return nil
	}
	old := e.policies
	e.policies = parsed
	c, err := nftables.New()
	if err == nil {
		changed := 0
		for ns := range e.chains {
			if !reflect.DeepEqual(parsed[ns], old[ns]) {
				e.writeChainLocked(c, ns)
				changed++
			}
		}
		for ns := range parsed {
			if !e.chains[ns] {
				e.writeChainLocked(c, ns)
				changed++
			}
		}
		if changed > 0 {
			err = c.Flush()
		}
	}
	if err != nil {
		e.policies = old
		return fmt.Errorf("netpool: egress policies: %w", err)
	}
	for ns := range parsed {
		e.chains[ns] = true
	}
	return nil
}

// writeChainLocked queues (on c) namespace ns's chain with its policy's
// rules, made if need be, emptied first (never a rule twice, even if an
// earlier transaction's outcome was unclear).
func (e *egress) writeChainLocked(c *nftables.Conn, ns string) {
	ch := c.AddChain(&nftables.Chain{Name: egressChainPrefix + ns, Table: e.table})
	c.FlushChain(ch)
	for _, r := range e.policies[ns] {
		for _, m := range matchesOf(r.ParsedEgressRule) {
			if r.deny {
				rejectOn(c, ch, m)
			} else {
				c.AddRule(&nftables.Rule{Table: e.table, Chain: ch, Exprs: concat(m, verdict(expr.VerdictReturn))})
			}
		}
	}
}

// egressRule is one rule of a namespace's chain.
type egressRule struct {
	spec.ParsedEgressRule
	deny bool
}

// everywhere is the rule that ends an allow list: refuse the rest.
var everywhere = egressRule{spec.ParsedEgressRule{Prefix: netip.MustParsePrefix("0.0.0.0/0")}, true}

// rulesOf orders a policy's rules as its chain checks them: deny first,
// then allow, then, after an allow list, a refusal of everything else.
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
	if len(p.Allow) > 0 {
		out = append(out, everywhere)
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
			port := thDport(pr.First)
			if pr.First != pr.Last {
				port = []expr.Any{port[0], &expr.Range{Op: expr.CmpOpEq, Register: 1,
					FromData: binaryutil.BigEndian.PutUint16(pr.First), ToData: binaryutil.BigEndian.PutUint16(pr.Last)}}
			}
			out = append(out, concat(dst, l4proto(proto.p), port))
		}
	}
	return out
}

package spec

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// EgressPolicy narrows where a namespace's sandboxes may open connections
// beyond the host (on the runtimes with their own network: native and
// containerd). Deny is checked first: a destination it matches is refused.
// Then, when Allow is set, only what it matches goes out; when it is empty,
// every destination not denied does. The cluster-wide refusals (the host's
// addresses, other sandboxes, link-local addresses, --net-egress-deny) come
// before either and cannot be allowed here; DNS through the worker's
// resolver is not egress and always works.
type EgressPolicy struct {
	Allow []EgressRule `json:"allow,omitempty"`
	Deny  []EgressRule `json:"deny,omitempty"`
}

// EgressRule matches destinations: an IPv4 network, and optionally ports
// (of TCP and UDP, or of Protocol's alone).
type EgressRule struct {
	CIDR     string   `json:"cidr"`               // "10.0.0.0/8", or one address "192.0.2.7"
	Ports    []string `json:"ports,omitempty"`    // "443", "8000-8100"; empty: every port and protocol
	Protocol string   `json:"protocol,omitempty"` // "tcp" or "udp"; empty: both (only with Ports)
}

// MaxEgressRules bounds a policy's rules (allow and deny together), and
// MaxEgressPorts one rule's ports and ranges: each port of each rule
// becomes firewall rules on every worker.
const (
	MaxEgressRules         = 256
	MaxEgressPorts         = 16
	MaxEgressFirewallRules = 1024 // what the rules expand to (firewallRules)
)

// firewallRules is how many nf_tables rules the policy becomes on a worker
// (internal/worker/netpool/egress.go), rules it cannot parse counted as 1.
func (p EgressPolicy) firewallRules() int {
	n := 0
	count := func(r EgressRule) int {
		if len(r.Ports) == 0 {
			return 1
		}
		protos := 2
		if r.Protocol != "" {
			protos = 1
		}
		return len(r.Ports) * protos
	}
	for _, r := range p.Deny {
		n += 2 * count(r)
	}
	for _, r := range p.Allow {
		n += count(r)
	}
	if len(p.Allow) > 0 {
		n += 2
	}
	return n
}

// IsZero reports whether p restricts nothing.
func (p EgressPolicy) IsZero() bool { return len(p.Allow) == 0 && len(p.Deny) == 0 }

// Validate checks every rule.
func (p EgressPolicy) Validate() error {
	if n := len(p.Allow) + len(p.Deny); n > MaxEgressRules {
		return fmt.Errorf("%w: egress: %d rules, at most %d", ErrInvalid, n, MaxEgressRules)
	}
	if n := p.firewallRules(); n > MaxEgressFirewallRules {
		return fmt.Errorf("%w: egress: the policy takes %d firewall rules (a deny rule 2 per port range and protocol, an allow rule 1), at most %d: use fewer ports or wider networks",
			ErrInvalid, n, MaxEgressFirewallRules)
	}
	for _, list := range []struct {
		what  string
		rules []EgressRule
	}{{"deny", p.Deny}, {"allow", p.Allow}} {
		for i, r := range list.rules {
			if _, err := r.Parse(); err != nil {
				return fmt.Errorf("%w: egress.%s[%d]: %w", ErrInvalid, list.what, i, err)
			}
		}
	}
	return nil
}

// ParsedEgressRule is an EgressRule's checked form.
type ParsedEgressRule struct {
	Prefix netip.Prefix
	Ports  []PortRange // empty: every port and protocol
	TCP    bool        // with Ports: the protocols they are of
	UDP    bool
}

// PortRange is an inclusive range of ports.
type PortRange struct{ First, Last uint16 }

// Parse checks r and returns its parsed form.
func (r EgressRule) Parse() (ParsedEgressRule, error) {
	var out ParsedEgressRule
	s := r.CIDR
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return out, fmt.Errorf("cidr %q: want an IPv4 network (10.0.0.0/8) or address", s)
		}
		s = netip.PrefixFrom(a, a.BitLen()).String()
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return out, fmt.Errorf("cidr %q: want an IPv4 network (10.0.0.0/8) or address", r.CIDR)
	}
	out.Prefix = p.Masked()
	switch r.Protocol {
	case "":
		out.TCP, out.UDP = true, true
	case "tcp":
		out.TCP = true
	case "udp":
		out.UDP = true
	default:
		return out, fmt.Errorf("protocol %q: want tcp, udp or nothing (both)", r.Protocol)
	}
	if r.Protocol != "" && len(r.Ports) == 0 {
		return out, fmt.Errorf("protocol %q needs ports", r.Protocol)
	}
	if len(r.Ports) > MaxEgressPorts {
		return out, fmt.Errorf("%d ports, at most %d (ranges count as one: 8000-8100)", len(r.Ports), MaxEgressPorts)
	}
	for _, ps := range r.Ports {
		pr, err := parsePortRange(ps)
		if err != nil {
			return out, err
		}
		out.Ports = append(out.Ports, pr)
	}
	return out, nil
}

func parsePortRange(s string) (PortRange, error) {
	first, last, isRange := strings.Cut(s, "-")
	if !isRange {
		last = first
	}
	a, err1 := strconv.ParseUint(first, 10, 16)
	b, err2 := strconv.ParseUint(last, 10, 16)
	if err1 != nil || err2 != nil || a == 0 || b < a {
		return PortRange{}, fmt.Errorf("port %q: want a port (443) or a range (8000-8100) of 1-65535", s)
	}
	return PortRange{uint16(a), uint16(b)}, nil
}

// ParseEgressRule reads the CLI's form of a rule: CIDR[:PORTS[/PROTO]],
// with PORTS comma-separated ports or ranges: "10.0.0.0/8",
// "192.0.2.7:443", "203.0.113.0/24:80,8000-8100/tcp".
func ParseEgressRule(s string) (EgressRule, error) {
	cidr, rest, hasPorts := strings.Cut(s, ":")
	r := EgressRule{CIDR: cidr}
	if hasPorts {
		ports, proto, _ := strings.Cut(rest, "/")
		r.Ports, r.Protocol = strings.Split(ports, ","), proto
	}
	if _, err := r.Parse(); err != nil {
		return EgressRule{}, fmt.Errorf("egress rule %q: %w (want CIDR[:PORTS[/tcp|udp]])", s, err)
	}
	return r, nil
}

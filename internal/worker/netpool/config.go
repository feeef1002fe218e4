package netpool

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"strconv"
)

// Config configures a Pool. Start from Default(): the zero Size means "no
// pre-creation", while the other zero fields take their defaults in New.
type Config struct {
	Size       int          // endpoints kept pre-created and ready; Default() sets 32; 0 disables pre-creation (on demand only)
	Bridge     string       // host bridge, default "brisk0"
	Subnet     netip.Prefix // default 10.211.0.0/16; the bridge takes the first address (the sandboxes' gateway)
	NamePrefix string       // netns and veth name prefix, default "brisk" (veth names must stay <= 15 chars)
	Logger     *slog.Logger

	// NoFirewall leaves out the pool's netfilter rules (firewall.go), which
	// keep sandboxes from reaching the host's ports and each other. Only for
	// hosts without nf_tables: Start fails there unless this is set.
	NoFirewall bool
	// AllowHostPorts are TCP ports on the host (any of its addresses) that
	// sandboxes may connect to despite the firewall, e.g. a local proxy.
	AllowHostPorts []uint16

	// Egress lets sandboxes open connections beyond the host, NAT'd
	// (masqueraded) through it; the host's own addresses, other sandboxes,
	// link-local addresses (169.254.0.0/16: cloud metadata services) and
	// EgressDeny stay refused. It turns the host's IPv4 forwarding on, as
	// every container bridge with NAT does. Default() sets it; it needs the
	// firewall.
	Egress bool
	// EgressDeny are more destinations refused to sandboxes with Egress.
	EgressDeny []netip.Prefix
	// Ingress are the networks whose hosts may connect to sandboxes over
	// TCP when they route the pool's subnet to this host: data planes on
	// other hosts. Empty: only this host reaches sandboxes (the firewall
	// forwards nothing into the bridge but replies). It turns the host's
	// IPv4 forwarding on.
	Ingress []netip.Prefix
	// DNS serves sandboxes a resolver on the gateway's port 53 (dns.go):
	// a forwarder to DNSUpstreams. Default() sets it; it needs the
	// firewall (the port is redirected there).
	DNS bool
	// DNSUpstreams are the resolvers (host:port) the forwarder relays to;
	// empty: the nameservers of the host's /etc/resolv.conf at Start.
	DNSUpstreams []string

	// MaxReady caps the endpoints kept ready: Release recycles an endpoint
	// while fewer are ready and destroys it otherwise. The slack above Size
	// is what lets steady churn recycle instead of create+destroy (the
	// refiller tops up to Size on a Take, and the endpoint released later
	// then still finds room). Default 2*Size; must be 0 or >= Size.
	MaxReady int
}

const (
	defaultSize   = 32
	defaultBridge = "brisk0"
	defaultPrefix = "brisk"
	maxIfName     = 15 // IFNAMSIZ-1: the kernel's limit for link names
)

var defaultSubnet = netip.MustParsePrefix("10.211.0.0/16")

// Default returns the configuration a worker runs with unless told otherwise.
func Default() Config {
	return Config{Size: defaultSize, Bridge: defaultBridge, Subnet: defaultSubnet, NamePrefix: defaultPrefix, Egress: true, DNS: true}
}

// ErrInvalidConfig matches (errors.Is) every error Validate returns.
var ErrInvalidConfig = errors.New("netpool: invalid config")

// fieldError names the offending field, its value and the rule it broke.
type fieldError struct {
	field string
	value any
	rule  string
}

func (e *fieldError) Error() string {
	return fmt.Sprintf("netpool: %s %v: %s", e.field, e.value, e.rule)
}

func (e *fieldError) Is(target error) bool { return target == ErrInvalidConfig }

// Name characters are kept to a portable subset: they appear in link names,
// file names under /var/run/netns and the regexp Cleanup matches with.
var (
	prefixRE = regexp.MustCompile(`^[a-z][a-z0-9]*$`)
	bridgeRE = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]*$`)
)

// withDefaults fills the zero fields that have a default (not Size, whose
// zero is meaningful).
func (c Config) withDefaults() Config {
	if c.Bridge == "" {
		c.Bridge = defaultBridge
	}
	if !c.Subnet.IsValid() {
		c.Subnet = defaultSubnet
	}
	if c.NamePrefix == "" {
		c.NamePrefix = defaultPrefix
	}
	if c.MaxReady == 0 {
		c.MaxReady = 2 * c.Size
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every field out of its allowed range, joined. Zero fields
// with a default are accepted.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(field string, value any, rule string) {
		errs = append(errs, &fieldError{field, value, rule})
	}
	if c.Size < 0 {
		bad("Size", c.Size, "must be >= 0")
	}
	if c.MaxReady < c.Size {
		bad("MaxReady", c.MaxReady, fmt.Sprintf("must be 0 (default 2*Size) or >= Size (%d)", c.Size))
	}
	for _, port := range c.AllowHostPorts {
		if port == 0 {
			bad("AllowHostPorts", c.AllowHostPorts, "ports must be 1-65535")
			break
		}
	}
	if c.NoFirewall && len(c.AllowHostPorts) > 0 {
		bad("AllowHostPorts", c.AllowHostPorts, "needs the firewall (NoFirewall is set)")
	}
	if c.NoFirewall && (c.Egress || c.DNS) {
		bad("NoFirewall", true, "Egress and DNS need the firewall (their NAT lives in its tables)")
	}
	for _, d := range c.EgressDeny {
		if !d.IsValid() || !d.Addr().Is4() || d.Masked() != d {
			bad("EgressDeny", d, "must be IPv4 network addresses, e.g. 10.0.0.0/8")
			break
		}
	}
	for _, d := range c.Ingress {
		if !d.IsValid() || !d.Addr().Is4() || d.Masked() != d {
			bad("Ingress", d, "must be IPv4 network addresses, e.g. 10.0.0.0/24")
			break
		}
	}
	for _, u := range c.DNSUpstreams {
		if _, err := netip.ParseAddrPort(u); err != nil {
			bad("DNSUpstreams", strconv.Quote(u), "must be ip:port")
			break
		}
	}
	if len(c.Bridge) > maxIfName || !bridgeRE.MatchString(c.Bridge) {
		bad("Bridge", strconv.Quote(c.Bridge), "must be a link name of 1-15 characters [A-Za-z0-9_.-]")
	} else if prefixRE.MatchString(c.NamePrefix) && nameRE(c.NamePrefix).MatchString(c.Bridge) {
		bad("Bridge", strconv.Quote(c.Bridge), "must not look like an endpoint name <NamePrefix>-<n>: Cleanup would delete it")
	}
	subnetOK := true
	switch {
	case !c.Subnet.Addr().Is4():
		bad("Subnet", c.Subnet, "must be IPv4")
		subnetOK = false
	case c.Subnet.Bits() > 30:
		bad("Subnet", c.Subnet, "must be /30 or larger (room for the gateway and a sandbox)")
		subnetOK = false
	case c.Subnet.Bits() < 8:
		bad("Subnet", c.Subnet, "must be /8 or smaller")
		subnetOK = false
	case c.Subnet.Masked() != c.Subnet:
		bad("Subnet", c.Subnet, "must be a network address, e.g. "+c.Subnet.Masked().String())
		subnetOK = false
	}
	if !prefixRE.MatchString(c.NamePrefix) {
		bad("NamePrefix", strconv.Quote(c.NamePrefix), "must match [a-z][a-z0-9]*")
	} else if subnetOK {
		// Names are <prefix>-<index>; the largest index depends on the subnet.
		longest := len(endpointName(c.NamePrefix, lastIndex(c.Subnet)))
		if longest > maxIfName {
			bad("NamePrefix", strconv.Quote(c.NamePrefix), fmt.Sprintf(
				"too long for Subnet %v: names would reach %d characters, links allow %d", c.Subnet, longest, maxIfName))
		}
	}
	return errors.Join(errs...)
}

// An endpoint's index is its address's offset in the subnet: index 1 is the
// gateway, sandboxes take 2..lastIndex. Deriving names from addresses keeps
// both unique together and bounds the name length by the subnet size.
const firstIndex = 2

func lastIndex(subnet netip.Prefix) int {
	return 1<<(32-subnet.Bits()) - 2 // the all-ones address is broadcast
}

func addrAt(subnet netip.Prefix, idx int) netip.Addr {
	b := subnet.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(idx)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func gatewayOf(subnet netip.Prefix) netip.Addr { return addrAt(subnet, 1) }

func endpointName(prefix string, idx int) string { return prefix + "-" + strconv.Itoa(idx) }

// nameRE matches exactly the names a pool with this prefix creates, so that
// Cleanup never touches another prefix's ("bt1" must not reap "bt10-3").
func nameRE(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `-[0-9]+$`)
}

// bridgeAlias marks a bridge as created by a pool with this prefix, so that
// Cleanup after a crash knows it may delete it and Close knows it owns it.
func bridgeAlias(prefix string) string { return "brisk-netpool:" + prefix }

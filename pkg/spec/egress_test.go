package spec

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseEgressRule(t *testing.T) {
	for in, want := range map[string]ParsedEgressRule{
		"10.0.0.0/8":                      {Prefix: netip.MustParsePrefix("10.0.0.0/8"), TCP: true, UDP: true},
		"10.1.2.3/8":                      {Prefix: netip.MustParsePrefix("10.0.0.0/8"), TCP: true, UDP: true},
		"192.0.2.7:443":                   {Prefix: netip.MustParsePrefix("192.0.2.7/32"), Ports: []PortRange{{443, 443}}, TCP: true, UDP: true},
		"203.0.113.0/24:80,8000-8100/tcp": {Prefix: netip.MustParsePrefix("203.0.113.0/24"), Ports: []PortRange{{80, 80}, {8000, 8100}}, TCP: true},
		"198.51.100.0/24:53/udp":          {Prefix: netip.MustParsePrefix("198.51.100.0/24"), Ports: []PortRange{{53, 53}}, UDP: true},
	} {
		r, err := ParseEgressRule(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		got, err := r.Parse()
		if err != nil || got.Prefix != want.Prefix || !slices.Equal(got.Ports, want.Ports) || got.TCP != want.TCP || got.UDP != want.UDP {
			t.Errorf("%s: %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "10.0.0.0/33", "fd00::/8", "::1", "example.com", "10.0.0.0/8:", "10.0.0.0/8:0",
		"10.0.0.0/8:65536", "10.0.0.0/8:90-80", "10.0.0.0/8:80/icmp", "10.0.0.0/8:a"} {
		if _, err := ParseEgressRule(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if err := (EgressPolicy{Deny: []EgressRule{{CIDR: "10.0.0.0/8", Protocol: "tcp"}}}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("a protocol without ports: %v", err)
	}
	many := EgressPolicy{Allow: make([]EgressRule, MaxEgressRules+1)}
	for i := range many.Allow {
		many.Allow[i].CIDR = "10.0.0.0/8"
	}
	if err := many.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d rules: %v", len(many.Allow), err)
	}
	// 40 deny rules of 16 ports on both protocols: 2,560 firewall rules.
	wide := EgressPolicy{Deny: make([]EgressRule, 40)}
	for i := range wide.Deny {
		wide.Deny[i] = EgressRule{CIDR: "10.0.0.0/8", Ports: []string{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"}}
	}
	if err := wide.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "2560 firewall rules") {
		t.Errorf("a policy of 2,560 firewall rules: %v", err)
	}
}

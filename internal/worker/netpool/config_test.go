package netpool

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestNewRejectsBadConfigsNamingTheField(t *testing.T) {
	ok := Default()
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		field  string
	}{
		{"negative size", func(c *Config) { c.Size = -1 }, "Size"},
		{"max ready below size", func(c *Config) { c.MaxReady = 3 }, "MaxReady"},
		{"ipv6 subnet", func(c *Config) { c.Subnet = netip.MustParsePrefix("fd00::/64") }, "Subnet"},
		{"subnet too small", func(c *Config) { c.Subnet = netip.MustParsePrefix("10.0.0.0/31") }, "Subnet"},
		{"subnet not a network address", func(c *Config) { c.Subnet = netip.MustParsePrefix("10.211.3.4/16") }, "Subnet"},
		{"prefix with a dash", func(c *Config) { c.NamePrefix = "bad-prefix" }, "NamePrefix"},
		{"prefix upper case", func(c *Config) { c.NamePrefix = "Brisk" }, "NamePrefix"},
		{"names too long for subnet", func(c *Config) { c.NamePrefix = "abcdefghij" }, "NamePrefix"}, // "abcdefghij-65534" is 16
		{"bridge too long", func(c *Config) { c.Bridge = "a-very-long-bridge" }, "Bridge"},
		{"bridge with slash", func(c *Config) { c.Bridge = "br/0" }, "Bridge"},
		{"bridge named like an endpoint", func(c *Config) { c.Bridge = "brisk-1" }, "Bridge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.mutate(&cfg)
			_, err := New(cfg)
			if err == nil {
				t.Fatalf("New(%+v) = nil error", cfg)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v is not ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.field+" ") {
				t.Errorf("error %q does not name field %s", err, tc.field)
			}
		})
	}
}

func TestNewAcceptsEdgeConfigs(t *testing.T) {
	for _, cfg := range []Config{
		{}, // zero fields take defaults; Size 0 is on-demand only
		Default(),
		{NamePrefix: "abcdefghi"}, // "abcdefghi-65534" is exactly 15
		{NamePrefix: "abcdefghijklm", Subnet: netip.MustParsePrefix("10.0.0.0/30")},
		{Size: 4, MaxReady: 4},
	} {
		if _, err := New(cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

func TestDefaults(t *testing.T) {
	p, err := New(Config{Size: 5})
	if err != nil {
		t.Fatal(err)
	}
	c := p.cfg
	if c.Size != 5 || c.MaxReady != 10 || c.Bridge != "brisk0" || c.Subnet.String() != "10.211.0.0/16" || c.NamePrefix != "brisk" || c.Logger == nil {
		t.Errorf("defaults: %+v", c)
	}
	if d := Default(); d.Size != 32 {
		t.Errorf("Default().Size = %d, want 32", d.Size)
	}
	if p.gateway.String() != "10.211.0.1" {
		t.Errorf("gateway %v, want 10.211.0.1", p.gateway)
	}
}

func TestAddressing(t *testing.T) {
	s := netip.MustParsePrefix("10.212.7.0/24")
	if got := addrAt(s, 2).String(); got != "10.212.7.2" {
		t.Errorf("addrAt(2) = %s", got)
	}
	if got := lastIndex(s); got != 254 {
		t.Errorf("lastIndex = %d, want 254 (255 is broadcast)", got)
	}
	if got := addrAt(netip.MustParsePrefix("10.211.0.0/16"), 300).String(); got != "10.211.1.44" {
		t.Errorf("addrAt(300) = %s", got)
	}
	re := nameRE("bt1")
	for name, want := range map[string]bool{"bt1-3": true, "bt1-": false, "bt10-3": false, "bt1-3x": false, "xbt1-3": false} {
		if re.MatchString(name) != want {
			t.Errorf("nameRE(bt1) matches %q = %v", name, !want)
		}
	}
}

package netpool

import (
	"net/netip"
	"strings"
	"testing"
)

// Two pools on one host that share a name prefix, a bridge or a subnet are
// refused, naming the holder; distinct ones coexist; a released claim can
// be taken again.
func TestHostLock(t *testing.T) {
	LockDir = t.TempDir()
	a := Config{NamePrefix: "hla", Bridge: "hlabr0", Subnet: netip.MustParsePrefix("10.231.0.0/24")}
	release, err := HostLock(a, "data dir /var/lib/a")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		what string
	}{
		{"same everything", a, "name prefix hla"},
		{"same bridge", Config{NamePrefix: "hlb", Bridge: "hlabr0", Subnet: netip.MustParsePrefix("10.232.0.0/24")}, "bridge hlabr0"},
		{"same subnet", Config{NamePrefix: "hlc", Bridge: "hlcbr0", Subnet: netip.MustParsePrefix("10.231.0.0/24")}, "subnet 10.231.0.0/24"},
	} {
		if _, err := HostLock(tc.cfg, "data dir /var/lib/b"); err == nil || !strings.Contains(err.Error(), tc.what) || !strings.Contains(err.Error(), "/var/lib/a") {
			t.Errorf("%s: %v, want a refusal naming the %s and the holder", tc.name, err, tc.what)
		}
	}
	other, err := HostLock(Config{NamePrefix: "hld", Bridge: "hldbr0", Subnet: netip.MustParsePrefix("10.233.0.0/24")}, "data dir /var/lib/d")
	if err != nil {
		t.Fatalf("a pool with its own names: %v", err)
	}
	other()
	release()
	again, err := HostLock(a, "data dir /var/lib/b")
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	again()
}

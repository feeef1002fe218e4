package auth

import (
	"net/netip"
	"testing"
	"time"
)

func TestThrottleRefillsAndForgets(t *testing.T) {
	th := NewThrottle(3, time.Second)
	th.MaxAddrs = 4
	now := time.Unix(1000, 0)
	a := netip.MustParseAddr("192.0.2.1")
	const tok = "brisk_0123456789abcdef_secret"
	for range 3 {
		if ok, _ := th.Allowed(a, tok, now); !ok {
			t.Fatal("refused within the burst")
		}
		th.Failed(a, tok, now)
	}
	ok, wait := th.Allowed(a, tok, now)
	if ok || wait <= 0 || wait > time.Second {
		t.Fatalf("after the burst: allowed %v, wait %s; want refused for up to 1s", ok, wait)
	}
	if ok, _ := th.Allowed(a, "brisk_fedcba9876543210_x", now); !ok {
		t.Fatal("another token id from the address is refused")
	}
	if ok, _ := th.Allowed(a, tok, now.Add(wait)); !ok {
		t.Fatalf("still refused after the wait it gave (%s)", wait)
	}
	// More addresses than MaxAddrs: the map stays bounded.
	for i := range 20 {
		th.Failed(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), tok, now)
	}
	if n := len(th.addrs); n > th.MaxAddrs {
		t.Fatalf("%d addresses kept, cap %d", n, th.MaxAddrs)
	}
}

package lab

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

const listener = `import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000))
s.listen(64)
while True:
    c, _ = s.accept()
    c.close()
`

// reaches reports whether a TCP connection from h to to's port 7000 opens
// within a second.
func reaches(h, to *Host) bool {
	err := exec.Command("ip", "netns", "exec", h.NS, "/usr/bin/python3", "-c",
		`import socket,sys; socket.create_connection(("`+to.IP+`", 7000), timeout=1)`).Run()
	return err == nil
}

// Hosts reach each other and the test process reaches them; a partition
// cuts the hosts apart both ways, a one-way fault one way (a TCP
// connection needs both), and healing restores both.
func TestPartitionsCutAndHeal(t *testing.T) {
	l := New(t)
	a, b, c := l.Host("a"), l.Host("b"), l.Host("c")
	for _, h := range []*Host{a, b, c} {
		h.Start("/usr/bin/python3", "-c", listener)
	}
	up := func(h *Host) bool {
		conn, err := net.DialTimeout("tcp", h.Addr(7000), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}
	for deadline := time.Now().Add(10 * time.Second); !(up(a) && up(b) && up(c)); {
		if time.Now().After(deadline) {
			t.Fatal("listeners not reachable from the test process")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !reaches(a, b) || !reaches(b, a) || !reaches(a, c) {
		t.Fatal("hosts do not reach each other before any fault")
	}
	l.Partition([]*Host{a}, []*Host{b})
	if reaches(a, b) || reaches(b, a) {
		t.Fatal("a and b reach each other across a partition")
	}
	if !reaches(a, c) || !reaches(c, b) || !up(a) {
		t.Fatal("a partition between a and b cut other links")
	}
	l.Heal()
	if !reaches(a, b) || !reaches(b, a) {
		t.Fatal("a and b do not reach each other after healing")
	}
	l.OneWay(a, b)
	if reaches(a, b) || reaches(b, a) {
		t.Fatal("TCP crosses a link that drops one direction")
	}
	l.Heal()
	l.Isolate(c)
	if reaches(c, a) || reaches(b, c) || !reaches(a, b) || !up(c) {
		t.Fatal("isolating c: want it cut from the hosts only")
	}
	l.Heal()
}

// A lab whose maker is gone is removed by the next one.
func TestStaleLabsAreRemoved(t *testing.T) {
	if why := Available(); why != "" {
		t.Skip(why)
	}
	// A namespace named as a lab of a process that does not exist, and
	// one that lab claimed (a native worker's sandbox's).
	stale, claimed := prefix+"-999999999-1-x", "blstale-1"
	for _, ns := range []string{stale, claimed} {
		if err := run("ip", "netns", "add", ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(claimsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(claimsDir, prefix+"-999999999-1"), []byte("blstale"), 0o600); err != nil {
		t.Fatal(err)
	}
	New(t)
	for _, ns := range []string{stale, claimed} {
		if err := exec.Command("ip", "netns", "exec", ns, "true").Run(); err == nil {
			_ = run("ip", "netns", "del", ns)
			t.Errorf("the stale lab's namespace %s is still there", ns)
		}
	}
}

// Delay holds every packet a host sends to the others (its SYN too), and
// healing releases the queue: a connect from the delayed host takes at
// least the delay, and connects work again afterwards.
func TestDelay(t *testing.T) {
	l := New(t)
	a, b := l.Host("a"), l.Host("b")
	b.Start("/usr/bin/python3", "-c", listener)
	connect := func() (time.Duration, error) {
		out, err := exec.Command("ip", "netns", "exec", a.NS, "/usr/bin/python3", "-c",
			`import socket,time; t=time.monotonic(); socket.create_connection(("`+b.IP+`", 7000), timeout=10); print(time.monotonic()-t)`).Output()
		if err != nil {
			return 0, err
		}
		var s float64
		_, err = fmt.Sscan(string(out), &s)
		return time.Duration(s * float64(time.Second)), err
	}
	for deadline := time.Now().Add(10 * time.Second); !reaches(a, b); {
		if time.Now().After(deadline) {
			t.Fatal("b not reachable from a")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.Delay(300*time.Millisecond, 0)
	if d, err := connect(); err != nil || d < 250*time.Millisecond {
		t.Fatalf("a connect from the delayed host took %v (%v); want at least the delay", d, err)
	}
	l.Heal()
	if !reaches(a, b) {
		t.Fatal("no connection after healing the delay")
	}
}

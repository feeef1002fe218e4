// Package lab is a network of hosts on one machine, for testing brisk's
// components against partitions as well as crashes (docs/reliability.md,
// "Partitions"). Each host is a network namespace with its own address on
// a bridge; the bridge lives in a namespace of its own (the switch), and
// the test's process reaches every host through one more veth from the
// root namespace, so no traffic leaves the namespaces the lab made. Faults
// are nftables drops inside the hosts (both ways, one way) and netem delay
// on a host's link; processes are paused and killed by their PIDs.
//
// A lab's names carry the PID of the process that made it: New removes
// the namespaces (and the processes in them) of labs whose maker is gone,
// so a killed test leaves nothing behind for long.
package lab

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// prefix starts every namespace a lab makes: prefix-PID-LAB-NAME.
const prefix = "brisklab"

var labSeq, logSeq atomic.Int32

// Lab is one network of hosts.
type Lab struct {
	t      testing.TB
	id     string // prefix-PID-SEQ
	sw     string // the switch namespace
	rootIf string // the root namespace's veth into the switch
	net    string // first three octets of the lab's /24
	mu     sync.Mutex
	hosts  []*Host
	procs  []*Proc
	claims []string // name prefixes of namespaces made outside the lab's (Claim)
	// delayers hold the packets of delayed hosts (Delay) until Heal.
	delayers []*delayer
	logs     string // the processes' output and TempDirs; Close shows the output on failure, then removes it all
}

// Host is a network namespace with one address on the lab's bridge.
type Host struct {
	Name string
	NS   string
	IP   string
	lab  *Lab
}

// Available says why a lab cannot run here ("" when it can): it needs
// root and ip, nft and nsenter (Delay needs iptables too).
func Available() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces)"
	}
	for _, b := range []string{"ip", "nft", "nsenter"} {
		if _, err := exec.LookPath(b); err != nil {
			return "needs " + b + " (iproute2, nftables)"
		}
	}
	return ""
}

// New makes an empty lab that t's cleanup tears down.
func New(t testing.TB) *Lab {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip("partition lab: " + why)
	}
	removeStale()
	seq := labSeq.Add(1)
	pid := os.Getpid()
	l := &Lab{t: t, id: fmt.Sprintf("%s-%d-%d", prefix, pid, seq)}
	// A /24 of 10.250.0.0/16 per lab; the root veth's name is unique on
	// the machine (at most 15 bytes).
	l.net = fmt.Sprintf("10.250.%d", (pid*7+int(seq))%250+1)
	l.rootIf = fmt.Sprintf("bl%x", (pid<<8|int(seq))&0xfffffff)
	l.sw = l.id + "-sw"
	// Not t.TempDir: its removal, registered later, would run before Close.
	logs, err := os.MkdirTemp("", l.id+"-logs")
	if err != nil {
		t.Fatal(err)
	}
	l.logs = logs
	t.Cleanup(l.Close)
	l.must("ip", "netns", "add", l.sw)
	l.must("ip", "-n", l.sw, "link", "set", "lo", "up")
	l.must("ip", "-n", l.sw, "link", "add", "br0", "type", "bridge")
	l.must("ip", "-n", l.sw, "link", "set", "br0", "up")
	// The test process's own way in: NET.1 in the root namespace.
	l.must("ip", "-n", l.sw, "link", "add", "root", "type", "veth", "peer", "name", l.rootIf, "netns", "1")
	l.must("ip", "-n", l.sw, "link", "set", "root", "master", "br0", "up")
	l.must("ip", "addr", "add", l.net+".1/24", "dev", l.rootIf)
	l.must("ip", "link", "set", l.rootIf, "up")
	return l
}

// Host adds a host named name (a DNS label, at most 8 bytes) at the next
// address.
func (l *Lab) Host(name string) *Host {
	l.t.Helper()
	l.mu.Lock()
	h := &Host{Name: name, NS: l.id + "-" + name, IP: fmt.Sprintf("%s.%d", l.net, len(l.hosts)+10), lab: l}
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()
	l.must("ip", "netns", "add", h.NS)
	l.must("ip", "-n", h.NS, "link", "set", "lo", "up")
	l.must("ip", "-n", l.sw, "link", "add", "v"+name, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
	l.must("ip", "-n", l.sw, "link", "set", "v"+name, "master", "br0", "up")
	l.must("ip", "-n", h.NS, "addr", "add", h.IP+"/24", "dev", "eth0")
	l.must("ip", "-n", h.NS, "link", "set", "eth0", "up")
	// The fault table: the input and output chains partitions add drops to.
	l.nft(h, `table inet lab {
	chain input { type filter hook input priority -10; policy accept; }
	chain output { type filter hook output priority -10; policy accept; }
}`)
	return h
}

// TempDir makes a directory for a host's process (its data or state
// dir) that lasts until the lab has stopped its processes: a test's own
// t.TempDir, made after New, would be removed while they still run.
func (l *Lab) TempDir() string {
	l.t.Helper()
	d, err := os.MkdirTemp(l.logs, "dir")
	if err != nil {
		l.t.Fatal(err)
	}
	return d
}

// Addr is h's address with port.
func (h *Host) Addr(port int) string { return net.JoinHostPort(h.IP, strconv.Itoa(port)) }

// Partition cuts every host of a from every host of b, both ways.
func (l *Lab) Partition(a, b []*Host) {
	l.t.Helper()
	for _, x := range a {
		for _, y := range b {
			l.OneWay(x, y)
			l.OneWay(y, x)
		}
	}
}

// Isolate cuts h from every other host (the test process still reaches
// it).
func (l *Lab) Isolate(h *Host) {
	l.t.Helper()
	var others []*Host
	l.mu.Lock()
	for _, o := range l.hosts {
		if o != h {
			others = append(others, o)
		}
	}
	l.mu.Unlock()
	l.Partition([]*Host{h}, others)
}

// OneWay drops every packet from sends to to; what to sends still reaches
// from. A TCP connection either way stalls (its handshake or its acks are
// lost), as over a link that fails in one direction.
func (l *Lab) OneWay(from, to *Host) {
	l.t.Helper()
	l.nft(from, fmt.Sprintf("add rule inet lab output ip daddr %s drop", to.IP))
	l.nft(to, fmt.Sprintf("add rule inet lab input ip saddr %s drop", from.IP))
}

// Lose drops percent of the packets h sends to the other hosts, at random
// (nftables' numgen: no netem needed); the test process's own traffic to
// h is spared.
func (h *Host) Lose(percent int) {
	h.lab.t.Helper()
	h.lab.nft(h, fmt.Sprintf("add rule inet lab output ip daddr != %s.1 numgen random mod 100 < %d drop", h.lab.net, percent))
}

// Heal removes every partition, loss and delay.
func (l *Lab) Heal() {
	l.t.Helper()
	l.mu.Lock()
	hosts := append([]*Host(nil), l.hosts...)
	l.mu.Unlock()
	for _, h := range hosts {
		l.nft(h, "flush chain inet lab input\nflush chain inet lab output")
		_ = run("ip", "netns", "exec", h.NS, "iptables", "-F", "OUTPUT")
	}
	l.stopDelayers()
}

func (l *Lab) stopDelayers() {
	l.mu.Lock()
	ds := l.delayers
	l.delayers = nil
	l.mu.Unlock()
	for _, q := range ds {
		q.close()
	}
}

// Delay adds d (± jitter) to every packet h sends to the other hosts:
// an iptables NFQUEUE rule queues them, and a reader in the test process
// accepts each one after the delay (delay.go: this kernel has no netem).
// It skips the test where iptables or the kernel's NFQUEUE is missing.
func (h *Host) Delay(d, jitter time.Duration) {
	l := h.lab
	l.t.Helper()
	if _, err := exec.LookPath("iptables"); err != nil {
		l.t.Skip("delay: needs iptables (its NFQUEUE target)")
	}
	q, err := startDelayer("/run/netns/"+h.NS, 0, d, jitter)
	if err != nil {
		l.t.Fatal(err)
	}
	l.mu.Lock()
	l.delayers = append(l.delayers, q)
	l.mu.Unlock()
	if err := run("ip", "netns", "exec", h.NS, "iptables", "-A", "OUTPUT", "!", "-d", l.net+".1", "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"); err != nil {
		l.t.Skipf("delay: the kernel takes no NFQUEUE rule: %v", err)
	}
}

// Proc is a process running in a host.
type Proc struct {
	Host *Host
	Bin  string
	Args []string
	cmd  *exec.Cmd
	out  *os.File
	done chan struct{}
}

// Start runs bin with args in h until the lab closes; its output goes to
// a file in the test's temporary directory, shown when the test fails.
func (h *Host) Start(bin string, args ...string) *Proc {
	l := h.lab
	l.t.Helper()
	out, err := os.Create(filepath.Join(l.logs, fmt.Sprintf("%s-%s-%d.log", h.Name, filepath.Base(bin), logSeq.Add(1))))
	if err != nil {
		l.t.Fatal(err)
	}
	// nsenter enters the network namespace only and execs bin: the PID is
	// bin's. (ip netns exec would also give it a mount namespace with a
	// sysfs of its own, without the cgroup file system a worker needs.)
	p := &Proc{Host: h, Bin: bin, Args: args, cmd: exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.NS, "--", bin}, args...)...), out: out, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		l.t.Fatalf("starting %s in %s: %v", bin, h.Name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
	return p
}

// Pause stops the process (SIGSTOP); Resume continues it.
func (p *Proc) Pause()  { _ = p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *Proc) Resume() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// Kill ends the process with SIGKILL and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Restart kills the process (SIGKILL, as a crash) and starts it again
// with the same arguments in the same host.
func (p *Proc) Restart() *Proc {
	p.Kill()
	return p.Host.Start(p.Bin, p.Args...)
}

// Stop ends the process with SIGTERM (SIGKILL after 10 s) and waits.
func (p *Proc) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Output is what the process wrote so far.
func (p *Proc) Output() string {
	b, _ := os.ReadFile(p.out.Name())
	return string(b)
}

// Close stops every process and removes the namespaces and the root veth.
func (l *Lab) Close() {
	l.mu.Lock()
	procs, hosts := l.procs, l.hosts
	l.procs, l.hosts = nil, nil
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.Stop)
	}
	wg.Wait()
	l.stopDelayers()
	for _, p := range procs {
		if l.t.Failed() {
			out := p.Output()
			if len(out) > 8000 {
				out = "..." + out[len(out)-8000:]
			}
			l.t.Logf("output of %s in %s:\n%s", strings.Join(p.Args, " "), p.Host.Name, out)
		}
		p.out.Close()
	}
	for _, h := range hosts {
		removeNS(h.NS)
	}
	removeClaims(l.id)
	removeNS(l.sw) // takes the root veth's peer, and so the root veth
	_ = run("ip", "link", "del", l.rootIf)
	_ = os.RemoveAll(l.logs)
}

// Block is the lab's number (1-250), the third octet of its addresses:
// unique among the labs running on the machine.
func (l *Lab) Block() int {
	n, _ := strconv.Atoi(l.net[strings.LastIndex(l.net, ".")+1:])
	return n
}

// Claim returns name with the lab's Block: a prefix for the network
// namespaces a host's process makes outside the lab's own (a native
// worker's sandboxes, named PREFIX-N), which Close removes.
func (l *Lab) Claim(name string) string {
	prefix := fmt.Sprintf("%s%d", name, l.Block())
	l.mu.Lock()
	l.claims = append(l.claims, prefix)
	claims := strings.Join(l.claims, "\n")
	l.mu.Unlock()
	// Written down for the next lab, should this one's test be killed.
	if err := os.MkdirAll(claimsDir, 0o700); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(claimsDir, l.id), []byte(claims), 0o600); err != nil {
		l.t.Fatal(err)
	}
	return prefix
}

// claimsDir holds each running lab's claims (Claim), by lab id.
var claimsDir = filepath.Join(os.TempDir(), prefix+"-claims")

// removeClaims removes the namespaces lab id claimed, and its record.
func removeClaims(id string) {
	b, err := os.ReadFile(filepath.Join(claimsDir, id))
	if err != nil {
		return
	}
	for _, p := range strings.Fields(string(b)) {
		for _, ns := range Namespaces(p) {
			removeNS(ns)
		}
	}
	_ = os.Remove(filepath.Join(claimsDir, id))
}

// Namespaces are the network namespaces named PREFIX-N.
func Namespaces(prefix string) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	var nss []string
	for line := range strings.SplitSeq(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix+"-") {
			nss = append(nss, f[0])
		}
	}
	return nss
}

// Route sends h's packets for prefix through via (another host), as a
// network that routes a worker's sandbox subnet to it does.
func (h *Host) Route(prefix string, via *Host) {
	h.lab.t.Helper()
	h.lab.must("ip", "-n", h.NS, "route", "add", prefix, "via", via.IP)
}

// Pids are the processes running in h (its own and their children, such
// as a worker's sandboxes).
func (h *Host) Pids() []int { return NSPids(h.NS) }

// NSPids are the processes running in the network namespace ns.
func NSPids(ns string) []int {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// removeNS kills what still runs in ns (by PID) and deletes it.
func removeNS(ns string) {
	if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = run("ip", "netns", "del", ns)
}

// removeStale removes the namespaces of labs whose maker has exited.
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix+"-") {
			continue
		}
		parts := strings.SplitN(strings.TrimPrefix(f[0], prefix+"-"), "-", 2)
		pid, err := strconv.Atoi(parts[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // ours, or its maker runs
		}
		if len(parts) == 2 {
			if seq, _, ok := strings.Cut(parts[1], "-"); ok {
				removeClaims(fmt.Sprintf("%s-%d-%s", prefix, pid, seq))
			}
		}
		removeNS(f[0])
	}
}

func (l *Lab) nft(h *Host, script string) {
	l.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", h.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("nft in %s: %v: %s\n%s", h.Name, err, out, script)
	}
}

func (l *Lab) must(name string, args ...string) {
	l.t.Helper()
	if err := run(name, args...); err != nil {
		l.t.Fatal(err)
	}
}

func run(name string, args ...string) error {
	var b bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(b.String()))
	}
	return nil
}

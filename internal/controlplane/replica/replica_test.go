package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Generous bounds: the race detector on two busy cores slows elections.
const (
	electTimeout = 10 * time.Second
	syncTimeout  = 10 * time.Second
)

func fn(name string) *spec.Function {
	f := &spec.Function{Name: name, Builtin: "trace", Revision: 1}
	f.ApplyDefaults()
	return f
}

// eventually polls cond until it holds or the deadline passes.
func eventually(tb testing.TB, timeout time.Duration, what func() string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s: %s", timeout, what())
		}
		<-tick.C
	}
}

// logBuffer collects the replicas' logs; set BRISK_TEST_LOG=1 to also see
// them on stderr.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if os.Getenv("BRISK_TEST_LOG") != "" {
		os.Stderr.Write(p)
	}
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// cluster is n replicas on 127.0.0.1. The raft listeners are bound before
// the peer list is built, so no port is guessed.
type cluster struct {
	tb       testing.TB
	peers    []Peer
	dirs     []string
	regs     []*Registry    // nil while closed
	lns      []net.Listener // bound for the first start
	logs     *logBuffer
	trailing uint64
	tls      func(i int) *Identity // nil: plain TCP
}

func newCluster(tb testing.TB, n int) *cluster {
	tb.Helper()
	c := &cluster{tb: tb, logs: &logBuffer{}}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		c.lns = append(c.lns, ln)
		c.peers = append(c.peers, Peer{
			ID:        fmt.Sprintf("cp%d", i+1),
			RaftAddr:  ln.Addr().String(),
			AdminAddr: fmt.Sprintf("127.0.0.1:%d", 17001+i),
			GRPCAddr:  fmt.Sprintf("127.0.0.1:%d", 17201+i),
		})
		c.dirs = append(c.dirs, tb.TempDir())
	}
	c.regs = make([]*Registry, n)
	tb.Cleanup(func() {
		for i := range c.regs {
			c.close(i)
		}
		for _, ln := range c.lns {
			if ln != nil {
				ln.Close()
			}
		}
	})
	return c
}

func (c *cluster) startAll() {
	c.tb.Helper()
	for i := range c.peers {
		c.open(i)
	}
}

// open starts replica i; its raft address is re-bound when it is not the
// first start.
func (c *cluster) identity(i int) *Identity {
	if c.tls == nil {
		return nil
	}
	return c.tls(i)
}

func (c *cluster) open(i int) *Registry {
	c.tb.Helper()
	ln := c.lns[i]
	c.lns[i] = nil
	if ln == nil {
		// The port was ours a moment ago; listeners set SO_REUSEADDR, so
		// only another process taking it in between can fail this.
		var err error
		if ln, err = net.Listen("tcp", c.peers[i].RaftAddr); err != nil {
			c.tb.Fatalf("rebind %s: %v", c.peers[i].RaftAddr, err)
		}
	}
	r, err := Open(Config{
		ID:           c.peers[i].ID,
		Peers:        c.peers,
		Dir:          c.dirs[i],
		Logger:       slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		listener:     ln,
		trailingLogs: c.trailing,
		TLS:          c.identity(i),
	})
	if err != nil {
		c.tb.Fatalf("open %s: %v", c.peers[i].ID, err)
	}
	c.regs[i] = r
	return r
}

func (c *cluster) close(i int) {
	if c.regs[i] == nil {
		return
	}
	if err := c.regs[i].Close(); err != nil {
		c.tb.Errorf("close %s: %v", c.peers[i].ID, err)
	}
	c.regs[i] = nil
}

// leader waits until exactly one running replica is leader and every running
// replica names it, then returns its index.
func (c *cluster) leader() int {
	c.tb.Helper()
	idx := -1
	eventually(c.tb, electTimeout, func() string { return "no agreed leader: " + c.describe() }, func() bool {
		idx = -1
		for i, r := range c.regs {
			if r != nil && r.IsLeader() {
				if idx >= 0 {
					return false
				}
				idx = i
			}
		}
		if idx < 0 {
			return false
		}
		for _, r := range c.regs {
			if r == nil {
				continue
			}
			if p, ok := r.Leader(); !ok || p.ID != c.peers[idx].ID {
				return false
			}
		}
		return true
	})
	return idx
}

func (c *cluster) describe() string {
	var parts []string
	for i, r := range c.regs {
		if r == nil {
			parts = append(parts, c.peers[i].ID+"=closed")
			continue
		}
		l, _ := r.Leader()
		parts = append(parts, fmt.Sprintf("%s=%s(leader %q)", c.peers[i].ID, r.Stats()["state"], l.ID))
	}
	return strings.Join(parts, " ")
}

// contents is a replica's whole registry as JSON, for equality checks.
func contents(tb testing.TB, r store.Registry) string {
	tb.Helper()
	fns, err := r.Functions()
	if err != nil {
		tb.Fatal(err)
	}
	ws, err := r.Workers()
	if err != nil {
		tb.Fatal(err)
	}
	ds, err := r.DataPlanes()
	if err != nil {
		tb.Fatal(err)
	}
	ts, err := r.Tokens()
	if err != nil {
		tb.Fatal(err)
	}
	ss, err := r.Secrets()
	if err != nil {
		tb.Fatal(err)
	}
	b, err := json.Marshal([]any{fns, ws, ds, ts, ss})
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// converge waits until every running replica holds want.
func (c *cluster) converge(want string) {
	c.tb.Helper()
	for i, r := range c.regs {
		if r == nil {
			continue
		}
		eventually(c.tb, syncTimeout, func() string {
			return fmt.Sprintf("%s has\n%s\nwant\n%s", c.peers[i].ID, contents(c.tb, r), want)
		}, func() bool { return contents(c.tb, r) == want })
	}
}

func waitLeader(tb testing.TB, r *Registry) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), electTimeout)
	defer cancel()
	if err := r.WaitLeader(ctx); err != nil {
		tb.Fatalf("WaitLeader: %v", err)
	}
}

func names(fns []*spec.Function) []string {
	var out []string
	for _, f := range fns {
		out = append(out, f.Name)
	}
	return out
}

func TestParsePeers(t *testing.T) {
	good := "cp1=127.0.0.1:7101|127.0.0.1:7001|127.0.0.1:7201, cp2=10.0.0.2:7101|:7001|[::1]:7201,cp3=host3:7101|host3:7001|host3:7201"
	peers, err := ParsePeers(good)
	if err != nil {
		t.Fatal(err)
	}
	want := []Peer{
		{ID: "cp1", RaftAddr: "127.0.0.1:7101", AdminAddr: "127.0.0.1:7001", GRPCAddr: "127.0.0.1:7201"},
		{ID: "cp2", RaftAddr: "10.0.0.2:7101", AdminAddr: ":7001", GRPCAddr: "[::1]:7201"},
		{ID: "cp3", RaftAddr: "host3:7101", AdminAddr: "host3:7001", GRPCAddr: "host3:7201"},
	}
	if !slices.Equal(peers, want) {
		t.Fatalf("got %+v\nwant %+v", peers, want)
	}
	if one, err := ParsePeers("solo=127.0.0.1:1|127.0.0.1:2|127.0.0.1:3"); err != nil || len(one) != 1 {
		t.Fatalf("single peer: %+v, %v", one, err)
	}

	bad := []struct{ in, want string }{
		{"", "empty peer list"},
		{"cp1=a:1|a:2|a:3,", "empty entry"},
		{"cp1", "missing '='"},
		{"=a:1|a:2|a:3", "empty id"},
		{"c p=a:1|a:2|a:3", "only letters"},
		{"cp1=a:1|a:2|a:3,cp1=b:1|b:2|b:3", `duplicate id "cp1"`},
		{"cp1=a:1|a:2", "want 3 addresses"},
		{"cp1=a:1|a:2|a:3|a:4", "want 3 addresses"},
		{"cp1=|a:2|a:3", "missing raft address"},
		{"cp1=a:1||a:3", "missing admin address"},
		{"cp1=a:1|a:2| ", "missing grpc address"},
		{"cp1=a|a:2|a:3", "bad raft address"},
		{"cp1=a:1|a:x|a:3", "bad admin address"},
		{"cp1=a:1|a:2|a:70000", "bad grpc address"},
		{"cp1=a:0|a:2|a:3", "not in 1..65535"},
		{"cp1=:7101|a:2|a:3", "empty host"},
		{"cp1=0.0.0.0:7101|a:2|a:3", "unspecified host"},
		{"cp1=[::]:7101|a:2|a:3", "unspecified host"},
		{"cp1=a:1|a:2|a:3,cp2=a:1|b:2|b:3", `already used by "cp1"`},
	}
	for _, tc := range bad {
		_, err := ParsePeers(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePeers(%q) = %v, want error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestOpenRejectsBadConfig(t *testing.T) {
	peers := []Peer{{ID: "cp1", RaftAddr: "127.0.0.1:1", AdminAddr: "127.0.0.1:2", GRPCAddr: "127.0.0.1:3"}}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{ID: "cp9", Peers: peers, Dir: t.TempDir()}, "not in the peer list"},
		{Config{ID: "cp1", Peers: peers}, "no data dir"},
		{Config{ID: "cp1", Dir: t.TempDir()}, "no peers"},
		{Config{ID: "cp1", Peers: append(slices.Clone(peers), peers[0]), Dir: t.TempDir()}, "duplicate id"},
		{Config{ID: "cp1", Peers: peers, Dir: t.TempDir(), HeartbeatTimeout: time.Second, ElectionTimeout: 500 * time.Millisecond}, "ElectionTimeout"},
	} {
		r, err := Open(tc.cfg)
		if err == nil {
			r.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v) = %v, want error containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestSingleReplica(t *testing.T) {
	c := newCluster(t, 1)
	r := c.open(0)
	eventually(t, electTimeout, func() string { return c.describe() }, r.IsLeader)
	waitLeader(t, r)
	select {
	case v := <-r.LeaderCh():
		if !v {
			t.Fatal("LeaderCh delivered false to the only replica")
		}
	default:
		t.Fatal("LeaderCh did not deliver true")
	}
	if p, ok := r.Leader(); !ok || p != c.peers[0] {
		t.Fatalf("Leader() = %+v, %v; want %+v", p, ok, c.peers[0])
	}
	if _, err := r.CreateFunction(fn("a")); err != nil {
		t.Fatal(err)
	}
	if err := r.PutWorker(&store.Worker{ID: "w1", Address: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	fns, err := r.Functions()
	if err != nil || len(fns) != 1 || fns[0].Name != "a" || fns[0].Builtin != "trace" {
		t.Fatalf("Functions() = %+v, %v", fns, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	c.regs[0] = nil
	if _, err := r.CreateFunction(fn("b")); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v, want ErrClosed", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestCloseDuringWrites: writers racing Close all return (raft leaves
// futures queued at shutdown unresolved), and later writes fail fast.
func TestCloseDuringWrites(t *testing.T) {
	c := newCluster(t, 1)
	r := c.open(0)
	waitLeader(t, r)
	var wg sync.WaitGroup
	var acked, seq atomic.Int64
	errs := make(chan error, 64)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := r.CreateFunction(fn(fmt.Sprintf("f%d", seq.Add(1))))
				if err != nil {
					errs <- err
					return
				}
				acked.Add(1)
			}
		}()
	}
	eventually(t, syncTimeout, func() string { return "no writes" }, func() bool { return acked.Load() >= 100 })
	c.close(0)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(syncTimeout):
		t.Fatal("writers still blocked after Close")
	}
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrNotLeader) {
			t.Errorf("writer ended with %v, want ErrClosed or ErrNotLeader", err)
		}
	}
}

// TestReplicatedWrites: writes on the leader reach every follower, a write
// on a follower names the leader, and the sentinel errors mirror store.Store.
func TestReplicatedWrites(t *testing.T) {
	c := newCluster(t, 3)
	c.startAll()
	li := c.leader()
	leader := c.regs[li]
	waitLeader(t, leader)

	for i := range 20 {
		if _, err := leader.CreateFunction(fn(fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	upd := fn("f03")
	upd.Revision, upd.Concurrency = 2, 9
	if err := leader.UpdateFunction(upd); err != nil {
		t.Fatal(err)
	}
	if err := leader.DeleteFunction("f07"); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := leader.PutWorker(&store.Worker{ID: "w2", Address: "10.0.0.2:1", MaxSandboxes: 4, Drain: true, RegisteredAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := leader.PutWorker(&store.Worker{ID: "w1", Address: "10.0.0.1:1", RegisteredAt: at}); err != nil {
		t.Fatal(err)
	}
	if err := leader.PutDataPlane(&store.DataPlane{ID: "dp1", Address: "10.0.0.9:1", RegisteredAt: at}); err != nil {
		t.Fatal(err)
	}

	want := contents(t, leader)
	fns, _ := leader.Functions()
	if len(fns) != 19 || fns[3].Revision != 2 || fns[3].Concurrency != 9 || slices.Contains(names(fns), "f07") {
		t.Fatalf("leader functions wrong: %v", names(fns))
	}
	if !slices.IsSorted(names(fns)) {
		t.Fatalf("functions not sorted: %v", names(fns))
	}
	ws, _ := leader.Workers()
	if len(ws) != 2 || ws[0].ID != "w1" || !ws[1].Drain || !ws[1].RegisteredAt.Equal(at) {
		t.Fatalf("workers wrong: %+v", ws)
	}
	c.converge(want)

	// A follower refuses writes and names the leader.
	fi := (li + 1) % 3
	_, err := c.regs[fi].CreateFunction(fn("on-follower"))
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("write on follower: %v, want ErrNotLeader", err)
	}
	var nle NotLeaderError
	if !errors.As(err, &nle) || !nle.Known || nle.Leader != c.peers[li] {
		t.Fatalf("follower error %v names %+v (known %v), want %+v", err, nle.Leader, nle.Known, c.peers[li])
	}
	if !strings.Contains(err.Error(), c.peers[li].AdminAddr) {
		t.Fatalf("error %q does not name the leader's admin address", err)
	}
	if fns, _ := c.regs[fi].Functions(); slices.Contains(names(fns), "on-follower") {
		t.Fatal("refused write was applied")
	}

	// ErrExists/ErrNotFound: same verdicts and messages as store.Store.
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	steps := []struct {
		name string
		do   func(store.Registry) error
		is   error
	}{
		{"create", func(r store.Registry) error { _, err := r.CreateFunction(fn("dup")); return err }, nil},
		{"create again", func(r store.Registry) error { _, err := r.CreateFunction(fn("dup")); return err }, store.ErrExists},
		{"update missing", func(r store.Registry) error { return r.UpdateFunction(fn("ghost")) }, store.ErrNotFound},
		{"delete missing", func(r store.Registry) error { return r.DeleteFunction("ghost") }, store.ErrNotFound},
		{"delete", func(r store.Registry) error { return r.DeleteFunction("dup") }, nil},
		{"update deleted", func(r store.Registry) error { return r.UpdateFunction(fn("dup")) }, store.ErrNotFound},
		{"create after delete", func(r store.Registry) error { _, err := r.CreateFunction(fn("dup")); return err }, nil},
	}
	for _, s := range steps {
		got, ref := s.do(leader), s.do(st)
		if (s.is == nil) != (got == nil) || (s.is != nil && !errors.Is(got, s.is)) {
			t.Errorf("%s: replica returned %v, want %v", s.name, got, s.is)
		}
		if fmt.Sprint(got) != fmt.Sprint(ref) {
			t.Errorf("%s: replica says %q, store.Store says %q", s.name, fmt.Sprint(got), fmt.Sprint(ref))
		}
	}
	c.converge(contents(t, leader))
}

// TestLeaderFailover closes the leader while writers run: a new leader is
// elected among the other two, it has every acknowledged write, and it
// accepts new ones.
func TestLeaderFailover(t *testing.T) {
	c := newCluster(t, 3)
	c.startAll()
	old := c.leader()
	waitLeader(t, c.regs[old])

	regs := slices.Clone(c.regs) // fixed for the writers; a closed replica is never leader
	var (
		mu    sync.Mutex
		acked []string
		after atomic.Int64 // acknowledged by a replica other than the old leader
		stop  = make(chan struct{})
		wg    sync.WaitGroup
		seq   atomic.Int64
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pace := time.NewTicker(2 * time.Millisecond) // keep an election's worth of CPU free
			defer pace.Stop()
			for {
				select {
				case <-stop:
					return
				case <-pace.C:
				}
				for i, r := range regs {
					if !r.IsLeader() {
						continue
					}
					name := fmt.Sprintf("f%05d", seq.Add(1))
					if _, err := r.CreateFunction(fn(name)); err == nil {
						mu.Lock()
						acked = append(acked, name)
						mu.Unlock()
						if i != old {
							after.Add(1)
						}
					}
					break
				}
			}
		}()
	}
	eventually(t, syncTimeout, func() string { return "no writes acknowledged" }, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 50
	})

	c.close(old)
	nl := c.leader()
	if nl == old {
		t.Fatal("closed replica still leader")
	}
	eventually(t, syncTimeout, func() string { return "new leader acknowledged no writes" }, func() bool { return after.Load() >= 20 })
	close(stop)
	wg.Wait()

	newLeader := c.regs[nl]
	waitLeader(t, newLeader)
	// LeaderCh delivered true to the new leader (maybe after a stale value).
	timeout := time.After(syncTimeout)
	for got := false; !got; {
		select {
		case got = <-newLeader.LeaderCh():
		case <-timeout:
			t.Fatal("LeaderCh of the new leader did not deliver true")
		}
	}

	fns, err := newLeader.Functions()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fns {
		have[f.Name] = true
	}
	lost := 0
	for _, n := range acked {
		if !have[n] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged writes lost", lost, len(acked))
	}
	t.Logf("%d writes acknowledged, %d of them by the new leader %s, 0 lost", len(acked), after.Load(), c.peers[nl].ID)

	if _, err := newLeader.CreateFunction(fn("after-failover")); err != nil {
		t.Fatalf("new leader refuses writes: %v", err)
	}
	c.converge(contents(t, newLeader))

	// Close must not hang with peers gone: the last replica is alone.
	for i := range c.regs {
		if i != nl {
			c.close(i)
		}
	}
	start := time.Now()
	c.close(nl)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close of the last replica took %s", d)
	}
}

// TestRestart closes every replica and reopens them on the same dirs: the
// data is intact, a leader is elected and nothing is bootstrapped again.
func TestRestart(t *testing.T) {
	c := newCluster(t, 3)
	c.startAll()
	if !strings.Contains(c.logs.String(), "bootstrapped cluster") {
		t.Fatal("fresh cluster did not bootstrap")
	}
	leader := c.regs[c.leader()]
	waitLeader(t, leader)
	for i := range 30 {
		if _, err := leader.CreateFunction(fn(fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader.PutWorker(&store.Worker{ID: "w1", Address: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if err := leader.PutDataPlane(&store.DataPlane{ID: "dp1", Address: "10.0.0.9:1"}); err != nil {
		t.Fatal(err)
	}
	want := contents(t, leader)
	c.converge(want)
	for i := range c.regs {
		c.close(i)
	}

	c.logs.Reset()
	c.startAll()
	leader = c.regs[c.leader()]
	waitLeader(t, leader)
	if got := contents(t, leader); got != want {
		t.Fatalf("after restart the leader has\n%s\nwant\n%s", got, want)
	}
	c.converge(want)
	if strings.Contains(c.logs.String(), "bootstrapped cluster") {
		t.Fatal("restart bootstrapped again")
	}
	if _, err := leader.CreateFunction(fn("f00")); !errors.Is(err, store.ErrExists) {
		t.Fatalf("recreate after restart: %v, want ErrExists", err)
	}
	if _, err := leader.CreateFunction(fn("new")); err != nil {
		t.Fatal(err)
	}
	c.converge(contents(t, leader))
}

// TestSnapshotRestore takes a snapshot that compacts the log, writes more,
// restarts: the state comes back from the snapshot (Restore) plus the tail
// of the log.
func TestSnapshotRestore(t *testing.T) {
	c := newCluster(t, 1)
	c.trailing = 1 // compact the log up to the snapshot
	r := c.open(0)
	waitLeader(t, r)
	for i := range 50 {
		if _, err := r.CreateFunction(fn(fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.PutWorker(&store.Worker{ID: "w1", Address: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t1", "t2"} {
		if err := r.CreateToken(&store.Token{ID: id, Name: id, Scopes: []string{"admin"}, Hash: "00"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.CreateToken(&store.Token{ID: "t1"}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("duplicate token id: %v", err)
	}
	for _, n := range []string{"s1", "s2"} {
		if err := r.CreateSecret(&store.Secret{Namespace: "default", Name: n, Value: []byte("v-" + n)}); err != nil {
			t.Fatal(err)
		}
	}
	for rev := uint64(1); rev <= store.MaxRevisions+2; rev++ {
		f := fn("f01")
		f.Revision = rev
		if err := r.PutRevision(f); err != nil {
			t.Fatal(err)
		}
	}
	zipA, zipB := []byte("PK archive a"), []byte("PK archive b")
	if err := r.PutCode("sha256:a", zipA); err != nil {
		t.Fatal(err)
	}
	if err := r.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if err := r.PutCode("sha256:b", zipB); err != nil { // in the log tail only
		t.Fatal(err)
	}
	if err := r.UpdateSecret(&store.Secret{Namespace: "default", Name: "s1", Value: []byte("v2")}); err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteSecret("default", "s2"); err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateSecret(&store.Secret{Namespace: "default", Name: "s2"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("updating a deleted secret: %v", err)
	}
	if err := r.DeleteToken("t2"); err != nil {
		t.Fatal(err)
	}
	if err := r.DeleteToken("t2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleting a deleted token: %v", err)
	}
	// After the snapshot: entries that only the log tail holds.
	if err := r.DeleteFunction("f10"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.CreateFunction(fn("late")); err != nil {
		t.Fatal(err)
	}
	want := contents(t, r)
	c.close(0)

	r = c.open(0)
	// The FSM is restored from the snapshot before raft starts.
	if got := r.Stats()["last_snapshot_index"]; got == "0" || got == "" {
		t.Fatalf("no snapshot after restart: last_snapshot_index=%q", got)
	}
	waitLeader(t, r)
	if got := contents(t, r); got != want {
		t.Fatalf("after snapshot restore\n%s\nwant\n%s", got, want)
	}
	if ss, _ := r.Secrets(); len(ss) != 1 || ss[0].Name != "s1" || string(ss[0].Value) != "v2" {
		t.Fatalf("secrets after snapshot restore: %+v", ss)
	}
	if revs, _ := r.Revisions("f01"); len(revs) != store.MaxRevisions || revs[0].Revision != 3 {
		t.Fatalf("revisions after snapshot restore: %d from %d, want %d from 3", len(revs), revs[0].Revision, store.MaxRevisions)
	}
	for d, want := range map[string][]byte{"sha256:a": zipA, "sha256:b": zipB} {
		if got, err := r.Code(d); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("code %s after snapshot restore: %q, %v", d, got, err)
		}
	}
	if ds, _ := r.CodeDigests(); len(ds) != 2 {
		t.Fatalf("code digests after restore: %v", ds)
	}
	if _, err := r.Code("sha256:c"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing code: %v", err)
	}
}

// TestSnapshotInstall: a follower that was down while the leader compacted
// its log catches up through a snapshot sent over the network.
func TestSnapshotInstall(t *testing.T) {
	c := newCluster(t, 3)
	c.trailing = 1
	c.startAll()
	li := c.leader()
	leader := c.regs[li]
	waitLeader(t, leader)
	if _, err := leader.CreateFunction(fn("early")); err != nil {
		t.Fatal(err)
	}
	c.converge(contents(t, leader))
	fi := (li + 1) % 3
	c.close(fi)
	for i := range 40 {
		if _, err := leader.CreateFunction(fn(fmt.Sprintf("f%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := leader.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if _, err := leader.CreateFunction(fn("late")); err != nil {
		t.Fatal(err)
	}
	want := contents(t, leader)
	c.open(fi)
	c.converge(want)
	if got := c.regs[fi].Stats()["last_snapshot_index"]; got == "0" || got == "" {
		t.Fatalf("follower caught up without a snapshot: last_snapshot_index=%q", got)
	}
}

// BenchmarkCreateFunction: 16 concurrent writers on the leader; each write
// returns once a majority has it durably in its log and the leader applied it.
func BenchmarkCreateFunction(b *testing.B) {
	var seq atomic.Int64
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			c := newCluster(b, n)
			c.startAll()
			leader := c.regs[c.leader()]
			waitLeader(b, leader)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if _, err := leader.CreateFunction(fn(fmt.Sprintf("b-%d", seq.Add(1)))); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
		})
	}
}

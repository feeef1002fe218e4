package e2e

import (
	"cmp"
	"context"
	"flag"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/test/lab"
)

// The partition lab's fault schedules (docs/reliability.md, "Partitions"):
// each starts a lab cluster (partition_lab_test.go), runs the mixed
// workload through a healthy stretch, a fault held for -lab-hold and its
// healing, then checks the workload's history and the cluster's
// convergence.

var (
	labHold = flag.Duration("lab-hold", 6*time.Second, "how long each partition schedule's fault holds (make partitions: 90s)")
	labAll  = flag.Bool("lab-all", false, "run every partition schedule, not only the suite's subset (make partitions)")
)

// schedule is a fault and what must hold through it.
type schedule struct {
	replicas int // control-plane replicas; default 3
	// inject makes the fault, given the leader before it.
	inject func(c *labCluster, leader *labReplica) fault
	// pinnedReads sends a read of every register to the faulted replica
	// once a new leader serves writes, each waiting as long as it takes:
	// a paused leader answers them when it resumes.
	pinnedReads bool
	// callsMayFail: warm calls may fail while the fault holds (it cuts
	// data planes from a worker); otherwise none may, then or ever.
	callsMayFail bool
	// suite: the schedule runs in the suite; the others with -lab-all.
	suite bool
}

// fault is an injected fault: the replica it hit (nil: none), whether the
// others must elect a new leader, what to do half-way through the hold
// (a kill -9), and how to heal it.
type fault struct {
	replica   *labReplica
	newLeader bool
	midway    func()
	heal      func()
}

func (sc schedule) run(t *testing.T) {
	if !sc.suite && !*labAll {
		t.Skip("a partition schedule of the full set: make partitions (-lab-all)")
	}
	c := newLabCluster(t, cmp.Or(sc.replicas, 3))
	c.setUp()
	w := c.start()
	var endOnce sync.Once
	end := func() { endOnce.Do(w.end) }
	defer end()
	time.Sleep(3 * time.Second) // a healthy stretch of history first
	leader := c.leader()
	if leader == nil {
		t.Fatal("no leader before the fault")
	}
	since := func() time.Duration { return time.Duration(w.h.Now()) }
	cut := since()
	w.phase.Store(1)
	f := sc.inject(c, leader)
	newLeader, elected, serving := leader, time.Duration(0), time.Duration(0)
	if f.newLeader {
		eventually(t, 20*time.Second, "a new leader among the others", func() bool {
			for _, r := range c.cps {
				if r == f.replica {
					continue
				}
				if v, ok := replicaView(r.host.Addr(labAdmin)); ok && v.Role == "leader" {
					newLeader = r
					return true
				}
			}
			return false
		})
		elected = since() - cut
		eventually(t, 20*time.Second, "a write through the new leader", func() bool {
			_, err := c.client(slices.Index(c.cps, newLeader), time.Second).Update(context.Background(), regFunction("reg-probe", "1"))
			return err == nil
		})
		serving = since() - cut
	}
	// Pinned reads go after the new leader has acknowledged writes: a
	// read called before them may rightly return the older values.
	var pinned sync.WaitGroup
	if sc.pinnedReads {
		time.Sleep(time.Second)
		for i, k := range labRegisters {
			pinned.Go(func() {
				call := w.h.Now()
				v, err := c.client(slices.Index(c.cps, f.replica), time.Minute).Get(context.Background(), k)
				val := ""
				if err == nil {
					val = v.Function.Labels["v"]
				}
				w.h.Read(200+i, k, call, val, err == nil)
			})
		}
	}
	if f.midway != nil {
		time.Sleep(max(*labHold/2-(since()-cut), 0))
		f.midway()
	}
	time.Sleep(max(*labHold-(since()-cut), 0)) // the fault holds while the clients run
	f.heal()
	healed := since()
	w.phase.Store(2)
	why := ""
	eventuallyOr(t, 60*time.Second, "the cluster converged after healing", func() bool {
		if f.replica != nil {
			if _, ok := replicaView(f.replica.host.Addr(labAdmin)); !ok || c.leader() == nil {
				why = "the faulted replica or the leader not answering"
				return false
			}
		}
		var ok bool
		ok, why = c.converged()
		return ok
	}, func() string { return why })
	convergedAfter := since() - healed
	pinned.Wait()
	time.Sleep(2 * time.Second)
	end()
	summary := w.check(t)
	faulted := "no replica"
	if f.replica != nil {
		faulted = f.replica.host.Name
	}
	t.Logf("fault on %s at %.1fs (leader %s); new leader %s elected %.1fs and serving writes %.1fs after the cut; failover clients' longest gap during the fault %.1fs; healed at %.1fs, converged %.1fs later",
		faulted, cut.Seconds(), leader.host.Name, newLeader.host.Name, elected.Seconds(), serving.Seconds(), w.maxGap(cut, healed).Seconds(), healed.Seconds(), convergedAfter.Seconds())
	t.Logf("warm calls before / during / after: %d/%d/%d ok, %d/%d/%d failed (last error: %v)",
		w.callsOK[0].Load(), w.callsOK[1].Load(), w.callsOK[2].Load(), w.callsFailed[0].Load(), w.callsFailed[1].Load(), w.callsFailed[2].Load(), w.lastCallErr.Load())
	t.Logf("%s", summary)
	if w.callsOK[1].Load() == 0 || w.callsFailed[0].Load() != 0 || w.callsFailed[2].Load() != 0 || (!sc.callsMayFail && w.callsFailed[1].Load() != 0) {
		t.Errorf("warm calls: %d ok during the fault; %d / %d / %d failed before / during / after (want none failed%s)",
			w.callsOK[1].Load(), w.callsFailed[0].Load(), w.callsFailed[1].Load(), w.callsFailed[2].Load(), map[bool]string{true: " but during", false: ""}[sc.callsMayFail])
	}
}

// The leader isolated from every other host.
func TestPartitionLeaderIsolated(t *testing.T) {
	schedule{suite: true, inject: func(c *labCluster, leader *labReplica) fault {
		c.lab.Isolate(leader.host)
		return fault{replica: leader, newLeader: true, heal: c.lab.Heal}
	}}.run(t)
}

// The leader isolated, killed with kill -9 half-way and restarted, still
// isolated; it rejoins from its raft log when the partition heals.
func TestPartitionLeaderKilledInIsolation(t *testing.T) {
	schedule{suite: true, inject: func(c *labCluster, leader *labReplica) fault {
		c.lab.Isolate(leader.host)
		return fault{replica: leader, newLeader: true, heal: c.lab.Heal, midway: func() { leader.proc = leader.proc.Restart() }}
	}}.run(t)
}

// A follower isolated: the leader keeps its majority and serves on.
func TestPartitionFollowerIsolated(t *testing.T) {
	schedule{suite: true, inject: func(c *labCluster, leader *labReplica) fault {
		r := c.cps[(slices.Index(c.cps, leader)+1)%len(c.cps)]
		c.lab.Isolate(r.host)
		return fault{replica: r, heal: c.lab.Heal}
	}}.run(t)
}

// The leader's packets to the other replicas dropped, theirs to it
// delivered (a link failing one way).
func TestPartitionLeaderOneWay(t *testing.T) {
	schedule{inject: func(c *labCluster, leader *labReplica) fault {
		for _, h := range c.cpHosts(leader) {
			c.lab.OneWay(leader.host, h)
		}
		return fault{replica: leader, newLeader: true, heal: c.lab.Heal}
	}}.run(t)
}

// 200 ms (±20 ms) on every packet a follower sends (lab.Delay): the
// leader keeps its majority through the other follower and serves.
func TestPartitionSlowFollower(t *testing.T) {
	schedule{suite: true, inject: func(c *labCluster, leader *labReplica) fault {
		r := c.cps[(slices.Index(c.cps, leader)+1)%len(c.cps)]
		r.host.Delay(200*time.Millisecond, 20*time.Millisecond)
		return fault{replica: r, heal: c.lab.Heal}
	}}.run(t)
}

// The leader paused (SIGSTOP, as by a long GC or a frozen VM), then
// resumed: the requests it had taken meanwhile are answered after the
// others have moved on.
func TestPartitionLeaderPaused(t *testing.T) {
	schedule{suite: true, pinnedReads: true, inject: func(_ *labCluster, leader *labReplica) fault {
		leader.proc.Pause()
		return fault{replica: leader, newLeader: true, heal: leader.proc.Resume}
	}}.run(t)
}

// 30 % of the packets the leader sends to the other hosts lost, at
// random (a bad link; nftables, no netem needed).
func TestPartitionLossyLeader(t *testing.T) {
	schedule{inject: func(c *labCluster, leader *labReplica) fault {
		leader.host.Lose(30)
		return fault{replica: leader, heal: c.lab.Heal}
	}}.run(t)
}

// The leader's links flapping, 1 s down and 1 s up, for the hold.
func TestPartitionLeaderFlapping(t *testing.T) {
	schedule{inject: func(c *labCluster, leader *labReplica) fault {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				c.lab.Isolate(leader.host)
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				c.lab.Heal()
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
			}
		}()
		return fault{replica: leader, heal: func() { close(stop); <-done; c.lab.Heal() }}
	}}.run(t)
}

// Five replicas; the leader and one follower cut from the other three (a
// minority with the leader): the majority elects a new leader.
func TestPartitionMinorityWithLeader(t *testing.T) {
	schedule{replicas: 5, suite: true, inject: func(c *labCluster, leader *labReplica) fault {
		others := c.cpHosts(leader)
		c.lab.Partition([]*lab.Host{leader.host, others[0]}, others[1:])
		return fault{replica: leader, newLeader: true, heal: c.lab.Heal}
	}}.run(t)
}

// Five replicas split into two halves that cannot reach each other and a
// fifth that reaches both (Jepsen's bridge): whichever leads must keep a
// majority through the bridge.
func TestPartitionBridge(t *testing.T) {
	schedule{replicas: 5, inject: func(c *labCluster, leader *labReplica) fault {
		others := c.cpHosts(leader)
		c.lab.Partition([]*lab.Host{leader.host, others[0]}, others[1:3]) // others[3] bridges
		return fault{heal: c.lab.Heal}
	}}.run(t)
}

// The data planes and the workers cut from every control-plane replica:
// warm calls keep being served (0 failed) from the routes the data planes
// have, as Dirigent's data plane does without its control plane.
func TestPartitionDataPlanesFromControlPlane(t *testing.T) {
	schedule{suite: true, inject: func(c *labCluster, _ *labReplica) fault {
		cut := c.dpHosts()
		for _, w := range c.workers {
			cut = append(cut, w.Host)
		}
		c.lab.Partition(c.cpHosts(), cut)
		return fault{heal: c.lab.Heal}
	}}.run(t)
}

// A worker cut from every control-plane replica, not from the data
// planes, and killed with kill -9 half-way and restarted (still cut): the
// control plane fences it after the node grace and starts its sandboxes
// elsewhere; calls keep being served; after healing the cluster converges
// with nothing of the fenced worker's kept (KubeDirect's anomalies: none
// beyond max, none duplicated, none revived).
func TestPartitionWorkerFromControlPlane(t *testing.T) {
	schedule{suite: true, inject: func(c *labCluster, _ *labReplica) fault {
		w := c.warmWorker()
		c.lab.Partition(c.cpHosts(), []*lab.Host{w.Host})
		i := slices.Index(c.workers, w)
		return fault{heal: c.lab.Heal, midway: func() { c.workers[i] = w.Restart() }}
	}}.run(t)
}

// A worker cut from both data planes, not from the control plane: calls
// to its sandbox fail until the data planes stop routing to it.
func TestPartitionWorkerFromDataPlanes(t *testing.T) {
	schedule{suite: true, callsMayFail: true, inject: func(c *labCluster, _ *labReplica) fault {
		c.lab.Partition(c.dpHosts(), []*lab.Host{c.warmWorker().Host})
		return fault{heal: c.lab.Heal}
	}}.run(t)
}

// warmWorker is a worker running one of warm's sandboxes.
func (c *labCluster) warmWorker() *lab.Proc {
	v, err := c.failoverClient(0, 5*time.Second).Get(context.Background(), "warm")
	if err != nil || len(v.Status.Sandboxes) == 0 {
		c.t.Fatalf("warm's sandboxes: %v", err)
	}
	for _, w := range c.workers {
		if w.Host.Name == v.Status.Sandboxes[0].Node {
			return w
		}
	}
	c.t.Fatalf("no worker runs warm's sandbox on %s", v.Status.Sandboxes[0].Node)
	return nil
}

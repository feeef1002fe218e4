package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Failover benchmarks of issue 5, on separate brisk processes on loopback:
// 3 control-plane replicas, 2 data planes, and 2 worker processes hosting 50
// emulated nodes each; sandboxes are spread over 100 functions.
//
//	go test -run '^$' -bench 'LeaderFailover|WorkerFailure' -benchtime 1x ./test/e2e/

const failoverNodesPerWorker = 50

func failoverCluster(b *testing.B, sandboxes int) (*haCluster, []string) {
	h := newHACluster(b, haOptions{workers: 2, nodeGrace: "1s", workerArgs: []string{
		"--emulate", fmt.Sprint(failoverNodesPerWorker), "--create-delay", "1ms", "--cpu", "1000", "--memory", "1000000"}})
	const functions = 100
	var names []string
	for i := range functions {
		f := testTraceSpec(fmt.Sprintf("%sf%d", h.tag, i), sandboxes/functions)
		f.Resources = spec.Resources{MilliCPU: 1, MemoryMB: 1}
		f.Scaling.Max = sandboxes / functions
		if _, err := h.client().Create(context.Background(), f); err != nil {
			b.Fatal(err)
		}
		names = append(names, f.Name)
	}
	eventually(b, 5*time.Minute, fmt.Sprintf("%d sandboxes ready", sandboxes), func() bool {
		return readyTotal(h) == sandboxes
	})
	return h, names
}

// readyTotal is the number of ready sandboxes the leader reports, -1 when
// no leader answers.
func readyTotal(h *haCluster) int {
	st, err := h.client().Status(context.Background())
	if err != nil {
		return -1
	}
	n := 0
	for _, f := range st.Functions {
		n += f.Ready
	}
	return n
}

func status(h *haCluster) *api.StatusView {
	st, err := h.client().Status(context.Background())
	if err != nil {
		return nil
	}
	return st
}

// BenchmarkLeaderFailover kills the leader replica (kill -9) with N
// sandboxes running and measures, from the kill: a new leader elected
// (leader-ms); every sandbox recovered from the workers by the recover
// handshake, none created (recovered-ms); a new function's cold start
// served through the data planes (cold-ms).
func BenchmarkLeaderFailover(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("sandboxes=%d", n), func(b *testing.B) {
			h, _ := failoverCluster(b, n)
			var leaderMs, recoveredMs, coldMs float64
			for range b.N {
				old := h.leader()
				if old == nil {
					b.Fatal("no leader")
				}
				t0 := time.Now()
				old.p.stop(syscall.SIGKILL)
				var tLeader, tRecovered time.Time
				eventually(b, 60*time.Second, "new leader with every sandbox recovered", func() bool {
					if tLeader.IsZero() {
						if r := h.leader(); r != nil && r != old {
							tLeader = time.Now()
						}
						return false
					}
					if readyTotal(h) == n {
						tRecovered = time.Now()
						return true
					}
					return false
				})
				served, err := h.coldStart(60 * time.Second)
				if err != nil {
					b.Fatal(err)
				}
				leaderMs += float64(tLeader.Sub(t0).Microseconds()) / 1000
				recoveredMs += float64(tRecovered.Sub(t0).Microseconds()) / 1000
				coldMs += float64(served.Sub(t0).Microseconds()) / 1000
				if c := metricValue(b, "http://"+h.leader().admin+"/metrics", "brisk_controlplane_sandbox_creations_total"); c != 1 {
					b.Errorf("the new leader created %v sandboxes, want 1 (the cold start's): recovered ones must be adopted", c)
				}
				h.startReplica(old)
				eventually(b, 60*time.Second, "killed replica back as follower", func() bool {
					v, ok := replicaView(old.admin)
					return ok && v.Leader != nil
				})
			}
			b.ReportMetric(leaderMs/float64(b.N), "leader-ms")
			b.ReportMetric(recoveredMs/float64(b.N), "recovered-ms")
			b.ReportMetric(coldMs/float64(b.N), "cold-ms")
		})
	}
}

// BenchmarkWorkerFailure kills one worker process (50 emulated nodes, half
// the sandboxes) and measures, from the kill: its nodes seen disconnected,
// i.e. out of load balancing (detect-ms); every sandbox replaced on the
// surviving nodes once the node grace (1 s here) has passed (replaced-ms).
func BenchmarkWorkerFailure(b *testing.B) {
	const n = 1000
	h, _ := failoverCluster(b, n)
	var detectMs, replacedMs float64
	for range b.N {
		victim := h.workers[0]
		t0 := time.Now()
		victim.p.stop(syscall.SIGKILL)
		var tDetect, tReplaced time.Time
		eventually(b, 60*time.Second, "dead worker's sandboxes replaced", func() bool {
			st := status(h)
			if st == nil {
				return false
			}
			down, onDead, ready := 0, 0, 0
			for _, nd := range st.Nodes {
				if strings.HasPrefix(nd.ID, victim.id+"-") {
					if !nd.Connected {
						down++
					}
					onDead += nd.Sandboxes
				}
			}
			for _, f := range st.Functions {
				ready += f.Ready
			}
			if tDetect.IsZero() && down == failoverNodesPerWorker {
				tDetect = time.Now()
			}
			if !tDetect.IsZero() && onDead == 0 && ready == n {
				tReplaced = time.Now()
				return true
			}
			return false
		})
		detectMs += float64(tDetect.Sub(t0).Microseconds()) / 1000
		replacedMs += float64(tReplaced.Sub(t0).Microseconds()) / 1000
		victim.p = startBrisk(b, victim.args...)
	}
	b.ReportMetric(detectMs/float64(b.N), "detect-ms")
	b.ReportMetric(replacedMs/float64(b.N), "replaced-ms")
}

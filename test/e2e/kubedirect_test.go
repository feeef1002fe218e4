package e2e

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"

	"github.com/brisk-faas/brisk/internal/testutil"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
	"github.com/brisk-faas/brisk/internal/worker/runtimes"
)

// BenchmarkKubeDirect is KubeDirect's scale-up experiment on one machine:
// 100 KWOK nodes, the time until N Pods of one function are Running, stock
// Kubernetes (a Deployment scaled from 0 to N through the scale
// subresource, as kubectl scale does, run by kube-controller-manager and
// placed by kube-scheduler) against brisk's regular track (`brisk up
// --runtime kube` standing for the 100 nodes, the function's min set to N:
// brisk's autoscaler and placer decide, its workers create Pods bound to
// their nodes). "stock-limits" runs the controllers with their stock
// client rate limits, "lifted" with 5,000 QPS (brisk's client always has
// 5,000). Each run reports s-to-running (the last of N Pods Running, from
// the scale request) and, for brisk, s-to-ready (brisk reports N ready
// sandboxes: its workers probed every Pod). "brisk-scheduler" is brisk's
// regular track with the Kubernetes scheduler placing its Pods
// (--kube-placement scheduler: one worker node for the cluster, Pods
// created unbound), under the group's scheduler limits.
//
// The "lifted" group ends with PulseNet's half (issue 22): a burst of 100
// concurrent calls of a function at zero, each needing a sandbox of its
// own. "dual" serves them through the emergency track (--emergency-runtime
// native: one-shot sandboxes on this host, its default slots split over
// the 100 nodes; "dual-slots=100" gives it 100) while the Pods come up,
// calls that find no free slot waiting for a Pod; "pods-only" (async)
// makes every call wait for a Pod. Each reports the
// calls' latency p50 and p99 and how many were served by emergency
// sandboxes and by Pods (dual needs root, for the native runtime).
//
// One iteration per sub-benchmark is the intent:
//
//	go test -run '^$' -bench KubeDirect -benchtime 1x -timeout 30m ./test/e2e/
func BenchmarkKubeDirect(b *testing.B) {
	for _, limits := range []struct {
		name string
		qps  float64
	}{{"stock-limits", 0}, {"lifted", 5000}} {
		b.Run(limits.name, func(b *testing.B) {
			kc := kubecluster.Start(b, kubecluster.Options{Nodes: 100})
			kc.StartControllers(b, limits.qps)
			// For the brisk-scheduler rows' Pods, which tolerate no
			// taint; the stock Deployment's tolerate it anyway.
			kc.Schedulable(b)
			stockNS := kc.Namespace(b, "stock")
			briskNS := kc.Namespace(b, "brisk-fn")
			kc.ServePods(b, briskNS)
			for _, n := range []int{500, 2000} {
				b.Run(fmt.Sprintf("pods=%d/stock", n), func(b *testing.B) {
					for range b.N {
						b.ReportMetric(stockScale(b, kc, stockNS, n).Seconds(), "s-to-running")
					}
				})
			}
			for _, placement := range []string{"brisk", "scheduler"} {
				for _, n := range []int{500, 2000} {
					name := fmt.Sprintf("pods=%d/brisk", n)
					if placement == "scheduler" {
						name += "-scheduler"
					}
					b.Run(name, func(b *testing.B) {
						for range b.N {
							running, ready := briskScale(b, kc, briskNS, n, placement)
							b.ReportMetric(running.Seconds(), "s-to-running")
							b.ReportMetric(ready.Seconds(), "s-to-ready")
						}
					})
				}
			}
			if limits.qps == 0 {
				return // the burst does not involve the controllers: once
			}
			for _, mode := range []struct {
				name  string
				slots int // the host's emergency slots; 0: none (async)
			}{{"dual", runtimes.DefaultEmergencySlots()}, {"dual-slots=100", 100}, {"pods-only", 0}} {
				b.Run("burst=100/"+mode.name, func(b *testing.B) {
					if mode.slots > 0 {
						testutil.RequiresRoot(b)
					}
					for range b.N {
						briskBurst(b, kc, briskNS, 100, mode.slots)
					}
				})
			}
		})
	}
}

// runningWatch counts the Running Pods matching selector in ns, and says
// when the count first reached each target.
type runningWatch struct {
	mu      sync.Mutex
	seen    map[string]time.Time // when each Pod was first seen
	running map[string]bool
	waiters map[int]chan time.Time
}

func watchRunning(b *testing.B, kc *kubecluster.Cluster, ns, selector string) *runningWatch {
	w := &runningWatch{seen: map[string]time.Time{}, running: map[string]bool{}, waiters: map[int]chan time.Time{}}
	f := informers.NewSharedInformerFactoryWithOptions(kc.Client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := f.Core().V1().Pods().Informer()
	update := func(obj any, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.seen[p.Name]; !ok && !deleted {
			w.seen[p.Name] = time.Now()
		}
		if !deleted && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			w.running[p.Name] = true
		} else {
			delete(w.running, p.Name)
		}
		for n, ch := range w.waiters {
			if len(w.running) == n {
				select {
				case ch <- time.Now():
				default:
				}
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { update(obj, false) },
		UpdateFunc: func(_, obj any) { update(obj, false) },
		DeleteFunc: func(obj any) { update(obj, true) },
	}); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	f.Start(stop)
	b.Cleanup(func() { close(stop); f.Shutdown() })
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		b.Fatal("pod informer did not sync")
	}
	return w
}

// lastSeen is when the last Pod seen since t0 appeared.
func (w *runningWatch) lastSeen(t0 time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var last time.Time
	for _, at := range w.seen {
		if at.After(t0) && at.After(last) {
			last = at
		}
	}
	return last.Sub(t0)
}

// await returns when n Pods run (the time they first did), or fails b.
func (w *runningWatch) await(b *testing.B, n int, timeout time.Duration) time.Time {
	ch := make(chan time.Time, 1)
	w.mu.Lock()
	if len(w.running) == n {
		w.mu.Unlock()
		return time.Now()
	}
	w.waiters[n] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.waiters, n)
		w.mu.Unlock()
	}()
	select {
	case at := <-ch:
		return at
	case <-time.After(timeout):
		w.mu.Lock()
		have := len(w.running)
		w.mu.Unlock()
		b.Fatalf("%d of %d Pods Running after %v", have, n, timeout)
		return time.Time{}
	}
}

// stockScale scales a Deployment from 0 to n and back, and returns the time
// from the scale request to the n-th Pod Running.
func stockScale(b *testing.B, kc *kubecluster.Cluster, ns string, n int) time.Duration {
	ctx := context.Background()
	name := "web-" + strconv.Itoa(n)
	labels := map[string]string{"app": name}
	zero := int32(0)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				// The nodes keep the not-ready taint the apiserver gives
				// new nodes (no node-lifecycle controller runs to lift
				// it); brisk's Pods, bound directly, never meet it.
				Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{Name: "fn", Image: "brisk-bench/fn:v1",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}}}}},
			},
		},
	}
	if _, err := kc.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	w := watchRunning(b, kc, ns, "app="+name)
	scale := func(r int32) {
		// As kubectl scale: read the scale subresource, write it back, again
		// when the controller changed the Deployment in between.
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			s, err := kc.Client.AppsV1().Deployments(ns).GetScale(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s.Spec.Replicas = r
			_, err = kc.Client.AppsV1().Deployments(ns).UpdateScale(ctx, name, s, metav1.UpdateOptions{})
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	// Warm-up: one Pod, so that the controllers and the scheduler are
	// known to work before the clock runs.
	scale(1)
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("namespace %s:\n%s", ns, kc.Kubectl(b, "get", "deploy,rs,pods,events", "-n", ns, "-o", "wide"))
		}
	})
	w.await(b, 1, 30*time.Second)
	scale(0)
	w.await(b, 0, 2*time.Minute)
	b.ResetTimer()
	t0 := time.Now()
	scale(int32(n))
	took := w.await(b, n, 10*time.Minute).Sub(t0)
	b.StopTimer()
	b.ReportMetric(w.lastSeen(t0).Seconds(), "s-to-created")
	scale(0)
	podsGone(b, kc, ns, "app="+name)
	if err := kc.Client.AppsV1().Deployments(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		b.Fatal(err)
	}
	return took
}

// briskScale runs `brisk up --runtime kube` for the cluster's nodes (with
// placement "scheduler", one worker node for the cluster, sized from its
// nodes), deploys a function and sets its min to n; it returns the time
// from that update to the n-th Pod Running and to brisk reporting n ready
// sandboxes.
func briskScale(b *testing.B, kc *kubecluster.Cluster, ns string, n int, placement string) (running, ready time.Duration) {
	c := newCluster(b)
	fn := "burst-" + strconv.Itoa(n)
	args := []string{"--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns}
	if placement == "scheduler" {
		args = append(args, "--kube-placement", "scheduler")
	} else {
		args = append(args, "--kube-nodes", strings.Join(kc.Nodes, ","), "--cpu", "32", "--memory", "262144")
	}
	c.up(b, args...)
	c.mustBrisk(b, "fn", "deploy", fn, "--builtin", "trace", "--max", strconv.Itoa(n), "--cpu", "10m",
		"--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")
	w := watchRunning(b, kc, ns, kube.Selector+","+kube.LabelFunction+"="+fn)
	b.ResetTimer()
	t0 := time.Now()
	c.mustBrisk(b, "fn", "update", fn, "--min", strconv.Itoa(n))
	running = w.await(b, n, 10*time.Minute).Sub(t0)
	b.ReportMetric(w.lastSeen(t0).Seconds(), "s-to-created")
	deadline := time.Now().Add(10 * time.Minute)
	for {
		v := c.fn(b, fn)
		if v.Status.Ready >= n {
			ready = time.Since(t0)
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("brisk: %d of %d ready after 10m", v.Status.Ready, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	c.mustBrisk(b, "fn", "delete", fn)
	podsGone(b, kc, ns, kube.Selector+","+kube.LabelFunction+"="+fn)
	return running, ready
}

// podsGone waits until no Pod matching selector is left in ns, deleted all
// the way (KWOK's deletions finish after the Pods stop counting as
// Running): the next run must not share the machine with them.
func podsGone(b *testing.B, kc *kubecluster.Cluster, ns, selector string) {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		list, err := kc.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			b.Fatal(err)
		}
		if len(list.Items) == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d Pods (%s) left after 10m", len(list.Items), selector)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// briskBurst runs `brisk up --runtime kube` for the cluster's nodes, with
// the native emergency track and slots emergency slots on this host if
// slots > 0 (a dual function, else async), deploys a function of
// concurrency 1 at zero and sends it n calls at once; it reports their
// latency p50 and p99 and how many each track served.
func briskBurst(b *testing.B, kc *kubecluster.Cluster, ns string, n, slots int) {
	dual := slots > 0
	c := newCluster(b)
	fn := "cold-" + strconv.Itoa(n)
	args := []string{"--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns, "--kube-nodes", strings.Join(kc.Nodes, ","),
		"--cpu", "32", "--memory", "262144"}
	mode := "async"
	if dual {
		mode = "dual"
		args = append(args, "--emergency-runtime", "native", "--emergency-slots", strconv.Itoa(slots), "--net-prefix", "bkb", "--net-bridge", "bkbbr0",
			"--net-subnet", "10.219.1.0/24", "--net-pool", "16")
	}
	c.up(b, args...)
	if dual {
		// Calls before the workers' first heartbeats would rightly go to
		// the regular queue.
		eventually(b, time.Minute, "every node's emergency slots reported", func() bool {
			st, err := c.cl.Status(context.Background())
			if err != nil || len(st.Nodes) != len(kc.Nodes) {
				return false
			}
			total := 0
			for _, nd := range st.Nodes {
				if nd.Emergency != nil {
					total += nd.Emergency.Slots
				}
			}
			return total == slots
		})
	}
	c.mustBrisk(b, "fn", "deploy", fn, "--builtin", "trace", "--max", strconv.Itoa(n), "--cpu", "10m", "--memory", "64",
		"--concurrency", "1", "--scaling-mode", mode, "--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")
	type result struct {
		took    time.Duration
		sandbox string
		status  int
		err     error
	}
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			resp, err := c.hc.Post(c.scheme+"://"+c.invokeAddr+"/function/"+fn, "application/json", strings.NewReader(`{}`))
			if err != nil {
				results[i] = result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			results[i] = result{took: time.Since(t0), sandbox: resp.Header.Get("X-Brisk-Sandbox"), status: resp.StatusCode}
		})
	}
	b.ResetTimer()
	close(start)
	wg.Wait()
	b.StopTimer()
	var lat []time.Duration
	emergency, pods := 0, 0
	for _, r := range results {
		switch {
		case r.err != nil:
			b.Errorf("call: %v", r.err)
		case r.status != 200:
			b.Errorf("call: status %d", r.status)
		case strings.HasPrefix(r.sandbox, "ei-"):
			emergency++
			lat = append(lat, r.took)
		default:
			pods++
			lat = append(lat, r.took)
		}
	}
	if len(lat) == 0 {
		b.Fatal("no call succeeded")
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	b.Logf("%d calls: min %v, p10 %v, p50 %v, p90 %v, p99 %v, max %v", len(lat), lat[0], pct(0.10), pct(0.50), pct(0.90), pct(0.99), lat[len(lat)-1])
	b.ReportMetric(float64(pct(0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(emergency), "by-emergency")
	b.ReportMetric(float64(pods), "by-pods")
	if dual {
		// The workers' statistics, once their heartbeats have caught up
		// with the calls: emergency starts that failed (those calls then
		// queued for a Pod).
		var failed int64
		eventually(b, time.Minute, "the emergency starts in the heartbeats", func() bool {
			st, err := c.cl.Status(context.Background())
			if err != nil {
				return false
			}
			var started int64
			failed = 0
			for _, nd := range st.Nodes {
				if nd.Emergency != nil {
					started, failed = started+nd.Emergency.Started, failed+nd.Emergency.Failed
				}
			}
			return started >= int64(emergency)
		})
		b.ReportMetric(float64(failed), "emergency-failed")
	}
	c.mustBrisk(b, "fn", "delete", fn)
	podsGone(b, kc, ns, kube.Selector+","+kube.LabelFunction+"="+fn)
}

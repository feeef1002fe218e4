package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// recorder is a testing.TB that records how a helper ended the test
// instead of ending the real one; Fatal and Skip end the calling goroutine
// as the real ones do.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	r.failed = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func record(t *testing.T, f func(testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

// Missing binaries skip a test with the command that builds them, except
// in CI, where they fail it.
func TestRequireBinaries(t *testing.T) {
	empty := t.TempDir()
	r := record(t, func(tb testing.TB) { requireBinaries(tb, empty, "") })
	if r.skipped == "" || r.failed != "" || !strings.Contains(r.skipped, "scripts/k8s-binaries.sh") {
		t.Errorf("without binaries, outside CI: skipped %q, failed %q; want a skip naming the build script", r.skipped, r.failed)
	}
	r = record(t, func(tb testing.TB) { requireBinaries(tb, empty, "true") })
	if r.failed == "" || r.skipped != "" || !strings.Contains(r.failed, "scripts/k8s-binaries.sh") {
		t.Errorf("without binaries, in CI: skipped %q, failed %q; want a failure naming the build script", r.skipped, r.failed)
	}
	full := t.TempDir()
	for _, b := range required {
		if err := os.WriteFile(filepath.Join(full, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var got string
	r = record(t, func(tb testing.TB) { got = requireBinaries(tb, full, "true") })
	if r.failed != "" || r.skipped != "" || got != full {
		t.Errorf("with the binaries: %q (skipped %q, failed %q)", got, r.skipped, r.failed)
	}
}

// A started cluster answers with RBAC on, its KWOK nodes are Ready with
// loopback pod CIDRs, a Pod bound to one runs with an IP of its node's
// CIDR and is served there by ServePods until it is deleted, a Pod labelled
// FailLabel fails; and when the test ends, every process is gone.
func TestCluster(t *testing.T) {
	var pids map[string]int
	t.Run("running", func(t *testing.T) {
		c := Start(t, Options{Nodes: 2})
		pids = c.PIDs()
		t.Logf("startup took %v", c.Startup)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()

		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes.Items) != 2 {
			t.Fatalf("%d nodes, want 2", len(nodes.Items))
		}
		for _, n := range nodes.Items {
			prefix, err := netip.ParsePrefix(n.Spec.PodCIDR)
			if !nodeReady(&n) || err != nil || !prefix.Addr().IsLoopback() {
				t.Errorf("node %s: ready %v, pod CIDR %q", n.Name, nodeReady(&n), n.Spec.PodCIDR)
			}
		}

		// RBAC is on: the worker user may do nothing it was not granted.
		wk, err := kubernetes.NewForConfig(c.WorkerConfig())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := wk.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the worker user listing Pods without a grant: %v, want Forbidden", err)
		}

		ports, err := freePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		port := int32(ports[0])
		ns := c.Namespace(t, "harness")
		ps := c.ServePods(t, ns)
		pod := func(name string, labels map[string]string) *corev1.Pod {
			grace := int64(1)
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:                      c.Nodes[0],
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{Name: "c", Image: "example.invalid/x:v1",
						Ports: []corev1.ContainerPort{{ContainerPort: port}}}},
				},
			}
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("web", nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := awaitPod(t, c, ns, "web", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" })
		ip, err := netip.ParseAddr(p.Status.PodIP)
		prefix := netip.MustParsePrefix(c.nodePodCIDR(0))
		if err != nil || !prefix.Contains(ip) {
			t.Errorf("Pod IP %q is not in its node's CIDR %s", p.Status.PodIP, prefix)
		}
		addr := netip.AddrPortFrom(ip, uint16(port)).String()
		var body string
		awaitTrue(t, func() bool {
			resp, err := http.Get("http://" + addr + "/")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return resp.StatusCode == http.StatusOK
		}, "ServePods answers at "+addr)
		if !strings.Contains(body, "web") {
			t.Errorf("ServePods answered %q", body)
		}
		if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		awaitTrue(t, func() bool {
			_, err := c.Client.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, "KWOK removes the deleted Pod")
		// Gone from the apiserver, so no longer served: not even by a
		// listener its informer has not closed yet.
		if resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("%s still answers 200 after its Pod was deleted", addr)
			}
		}
		awaitTrue(t, func() bool { return len(ps.Serving()) == 0 }, "ServePods closes the listener of the deleted Pod")

		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod("crash", map[string]string{FailLabel: "true"}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p = awaitPod(t, c, ns, "crash", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].State.Terminated.ExitCode != 1 {
			t.Errorf("the failed Pod's container statuses: %+v", cs)
		}
	})
	if pids == nil {
		t.Skip("no cluster started (its subtest was skipped or failed first)")
	}
	if len(pids) != 3 {
		t.Fatalf("PIDs = %v, want etcd, kube-apiserver and kwok", pids)
	}
	for name, pid := range pids {
		// Start's children were waited for, so a PID that still exists is
		// a process still running (or one with its number since).
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after the test: %v", name, pid, err)
		}
	}
}

// awaitPod polls the apiserver until Pod ns/name satisfies ok.
func awaitPod(t *testing.T, c *Cluster, ns, name string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	awaitTrue(t, func() bool {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = p
		return ok(p)
	}, "Pod "+ns+"/"+name)
	return last
}

// awaitTrue polls cond for up to a minute.
func awaitTrue(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(pollEvery)
	}
}

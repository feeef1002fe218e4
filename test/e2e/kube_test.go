package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
)

// TestKubeRegularTrack is issue 22's regular track end to end: `brisk up
// --runtime kube` against a real kube-apiserver with two KWOK nodes (the
// kubecluster harness serves HTTP at the Pods' loopback IPs, standing in
// for their containers). A call at zero creates a Pod bound to a node and
// is served by it; the function scales to 3 Pods and back to zero; a Pod
// deleted by hand is replaced; a kill -9 and restart of brisk adopts the
// Pods it finds — none created again, none revived (KubeDirect's anomalies
// #1 and #2).
func TestKubeRegularTrack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	kc := kubecluster.Start(t, kubecluster.Options{Nodes: 2})
	ns := kc.Namespace(t, "brisk-fn")
	kc.ServePods(t, ns)
	c := newCluster(t)
	args := []string{"--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns, "--kube-nodes", strings.Join(kc.Nodes, ",")}
	p := c.up(t, args...)

	// pods lists the function's live Pods (not being deleted) by name.
	pods := func(fn string) map[string]corev1.Pod { return kubePods(t, kc, ns, fn) }

	c.mustBrisk(t, "fn", "deploy", "hello", "--builtin", "trace", "--max", "5",
		"--stable-window", "2s", "--scale-to-zero-grace", "1s", "--keep-alive", "ttl")
	inv := c.invoke(t, "hello", `{}`)
	if inv.status != 200 || !inv.cold || !strings.HasPrefix(string(inv.body), "pod "+ns+"/") {
		t.Fatalf("first call: %d cold=%v %q", inv.status, inv.cold, inv.body)
	}
	first := pods("hello")
	if len(first) != 1 {
		t.Fatalf("after the first call: %d Pods, want 1", len(first))
	}
	for name, p := range first {
		if !slices.Contains(kc.Nodes, p.Spec.NodeName) {
			t.Errorf("pod %s bound to %q, want one of %v", name, p.Spec.NodeName, kc.Nodes)
		}
		if !strings.Contains(string(inv.body), name) || p.Annotations[kube.AnnotationSandbox] != inv.sandbox {
			t.Errorf("call served by %q (sandbox %s), pod %s has sandbox %s", inv.body, inv.sandbox, name, p.Annotations[kube.AnnotationSandbox])
		}
	}

	// Up to 3, spread over both nodes by brisk's placer.
	c.mustBrisk(t, "fn", "update", "hello", "--min", "3")
	eventually(t, 30*time.Second, "3 Pods, 3 ready sandboxes", func() bool {
		return len(pods("hello")) == 3 && c.fn(t, "hello").Status.Ready == 3
	})
	nodes := map[string]bool{}
	for _, p := range pods("hello") {
		nodes[p.Spec.NodeName] = true
	}
	if len(nodes) != 2 {
		t.Errorf("3 Pods on nodes %v, want both nodes used", nodes)
	}

	// A Pod deleted by hand is replaced.
	var victim string
	for name := range pods("hello") {
		victim = name
		break
	}
	if err := kc.Client.CoreV1().Pods(ns).Delete(context.Background(), victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the deleted Pod replaced", func() bool {
		now := pods("hello")
		_, still := now[victim]
		return !still && len(now) == 3 && c.fn(t, "hello").Status.Ready == 3
	})

	// kill -9 and restart: the same Pods serve, none created or revived.
	before := pods("hello")
	p.stop(syscall.SIGKILL)
	c.up(t, args...)
	eventually(t, 30*time.Second, "the restarted cluster reports the 3 adopted Pods ready", func() bool {
		return c.fn(t, "hello").Status.Ready == 3
	})
	after := pods("hello")
	if len(after) != 3 {
		t.Fatalf("after the restart: %d Pods, want the 3 adopted", len(after))
	}
	for name, p := range before {
		if a, ok := after[name]; !ok || a.UID != p.UID {
			t.Errorf("pod %s (uid %s) not kept across the restart", name, p.UID)
		}
	}
	if _, revived := after[victim]; revived {
		t.Errorf("the deleted pod %s came back", victim)
	}
	if inv := c.invoke(t, "hello", `{}`); inv.status != 200 || inv.cold {
		t.Errorf("call after the restart: %d cold=%v %q", inv.status, inv.cold, inv.body)
	}

	// Back to zero: every Pod deleted.
	c.mustBrisk(t, "fn", "update", "hello", "--min", "0")
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last: %s", last)
		}
	}()
	eventually(t, 60*time.Second, "no Pod left", func() bool {
		v := c.fn(t, "hello")
		last = fmt.Sprintf("status %+v, %d pods", v.Status, len(pods("hello")))
		return len(pods("hello")) == 0
	})
}

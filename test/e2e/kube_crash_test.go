package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
	"github.com/brisk-faas/brisk/internal/worker/runtime/kube"
)

// TestKubeAPIServerCrash is the other half of "consistent across crashes
// of either" (TestKubeRegularTrack kills brisk): the kube-apiserver is
// killed with SIGKILL while brisk runs 2 Pods of a function. Warm calls go
// on meanwhile (the data path never asks the apiserver); a function
// deployed while it is down gets its Pods once it is back, the first
// function keeps its 2 (same UIDs), and there is exactly one Pod per ready
// sandbox — none created twice by a creation retried across the crash,
// none left over.
func TestKubeAPIServerCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Kubernetes control plane")
	}
	kc := kubecluster.Start(t, kubecluster.Options{Nodes: 2})
	ns := kc.Namespace(t, "brisk-crash")
	kc.ServePods(t, ns)
	c := newCluster(t)
	c.up(t, "--runtime", "kube", "--kubeconfig", kc.Kubeconfig, "--kube-namespace", ns, "--kube-nodes", strings.Join(kc.Nodes, ","))

	// pods maps function fn's live Pods ("" for all brisk's) to their
	// UIDs, and their sandboxes to how many Pods claim each.
	pods := func(fn string) (uids map[string]string, sandboxes map[string]int) {
		sel := kube.Selector
		if fn != "" {
			sel += "," + kube.LabelFunction + "=" + fn
		}
		list, err := kc.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			t.Fatalf("list pods: %v", err)
		}
		uids, sandboxes = map[string]string{}, map[string]int{}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				uids[p.Name] = string(p.UID)
				sandboxes[p.Annotations[kube.AnnotationSandbox]]++
			}
		}
		return uids, sandboxes
	}

	c.mustBrisk(t, "fn", "deploy", "hello", "--builtin", "trace", "--min", "2", "--max", "5")
	eventually(t, 30*time.Second, "2 Pods, 2 ready sandboxes", func() bool {
		uids, _ := pods("hello")
		return len(uids) == 2 && c.fn(t, "hello").Status.Ready == 2
	})
	before, _ := pods("hello")

	kc.CrashAPIServer(t, func() {
		for i := range 20 {
			if inv := c.invoke(t, "hello", `{}`); inv.status != 200 || inv.cold {
				t.Errorf("call %d with the apiserver down: %d cold=%v %q", i, inv.status, inv.cold, inv.body)
			}
		}
		c.mustBrisk(t, "fn", "deploy", "two", "--builtin", "trace", "--min", "2", "--max", "5")
	})

	eventually(t, 60*time.Second, "the function deployed during the crash has 2 Pods, 2 ready sandboxes", func() bool {
		uids, _ := pods("two")
		return len(uids) == 2 && c.fn(t, "two").Status.Ready == 2
	})
	// Settled: nothing more comes (a creation retried across the crash
	// would show as a fifth Pod or a sandbox claimed twice).
	eventually(t, 10*time.Second, "the same 4 Pods on two lists 2 s apart", func() bool {
		a, _ := pods("")
		time.Sleep(2 * time.Second)
		b, sandboxes := pods("")
		if len(a) != 4 || len(b) != 4 {
			return false
		}
		for name, uid := range a {
			if b[name] != uid {
				return false
			}
		}
		for sb, n := range sandboxes {
			if n != 1 {
				t.Errorf("sandbox %s claimed by %d Pods", sb, n)
			}
		}
		return true
	})
	after, _ := pods("hello")
	for name, uid := range before {
		if after[name] != uid {
			t.Errorf("pod %s (uid %s) not kept across the apiserver's crash", name, uid)
		}
	}
	for _, fn := range []string{"hello", "two"} {
		if inv := c.invoke(t, fn, `{}`); inv.status != 200 || inv.cold {
			t.Errorf("call of %s after the restart: %d cold=%v %q", fn, inv.status, inv.cold, inv.body)
		}
	}
}

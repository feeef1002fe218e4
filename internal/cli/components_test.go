package cli

import (
	"errors"
	"slices"
	"testing"

	"github.com/spf13/cobra"

	"github.com/brisk-faas/brisk/internal/worker/runtimes"
)

func TestSandboxUserFlag(t *testing.T) {
	for _, standalone := range []bool{false, true} { // brisk up, brisk worker
		var f wkFlags
		c := &cobra.Command{Use: "worker"}
		f.register(c, standalone)
		if err := c.ParseFlags([]string{"--sandbox-user", "123:456"}); err != nil {
			t.Fatal(err)
		}
		w, err := f.options(c)
		if err != nil || w.SandboxUser != "123:456" {
			t.Errorf("standalone %v: SandboxUser %q, %v; want 123:456", standalone, w.SandboxUser, err)
		}
	}
}

// --emergency-runtime native goes beside containerd or kube only, and is refused
// as a usage error before anything starts otherwise.
func TestEmergencyRuntimeFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--runtime", "containerd", "--emergency-runtime", "native"}, true},
		{[]string{"--runtime", "kube", "--emergency-runtime", "native"}, true},
		{[]string{"--runtime", "native", "--emergency-runtime", "native"}, true},
		{[]string{"--runtime", "process", "--emergency-runtime", "native"}, false},
		{[]string{"--runtime", "containerd", "--emergency-runtime", "containerd-fast"}, false},
	} {
		var f wkFlags
		c := &cobra.Command{Use: "worker"}
		f.register(c, true)
		if err := c.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		w, err := f.options(c)
		var usage usageError
		switch {
		case tc.ok && (err != nil || w.EmergencyRuntime != "native"):
			t.Errorf("%v: EmergencyRuntime %q, %v", tc.args, w.EmergencyRuntime, err)
		case !tc.ok && !errors.As(err, &usage):
			t.Errorf("%v: err %v, want a usage error", tc.args, err)
		}
	}
}

// --kubeconfig, --kube-namespace and --kube-nodes configure --runtime kube
// and are a usage error with any other runtime.
func TestKubeFlags(t *testing.T) {
	parse := func(args ...string) (runtimes.Workers, error) {
		var f wkFlags
		c := &cobra.Command{Use: "worker"}
		f.register(c, true)
		if err := c.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		return f.options(c)
	}
	w, err := parse("--runtime", "kube", "--kubeconfig", "/k/config", "--kube-namespace", "fns", "--kube-nodes", "n1,n2")
	if err != nil || w.Runtime != "kube" || w.Kube.Kubeconfig != "/k/config" || w.Kube.Namespace != "fns" || !slices.Equal(w.Kube.Nodes, []string{"n1", "n2"}) {
		t.Errorf("kube flags: %+v, %v", w.Kube, err)
	}
	var usage usageError
	if _, err := parse("--runtime", "process", "--kube-nodes", "n1"); !errors.As(err, &usage) {
		t.Errorf("--kube-nodes with --runtime process: %v, want a usage error", err)
	}
	if w.Kube.Placement != "brisk" {
		t.Errorf("default --kube-placement %q, want brisk", w.Kube.Placement)
	}
	if w, err := parse("--runtime", "kube", "--kube-placement", "scheduler"); err != nil || w.Kube.Placement != "scheduler" {
		t.Errorf("--kube-placement scheduler: %+v, %v", w.Kube, err)
	}
	for _, args := range [][]string{{"--runtime", "kube", "--kube-placement", "kubelet"}, {"--runtime", "process", "--kube-placement", "scheduler"}} {
		if _, err := parse(args...); !errors.As(err, &usage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

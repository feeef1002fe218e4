package cli

import (
	"errors"
	"testing"

	"github.com/spf13/cobra"
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

// --emergency-runtime native goes beside containerd only, and is refused
// as a usage error before anything starts otherwise.
func TestEmergencyRuntimeFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--runtime", "containerd", "--emergency-runtime", "native"}, true},
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

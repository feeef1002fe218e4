package cli

import (
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
